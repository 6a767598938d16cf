"""Bodies of the parallel IR (``mlir.forall``): scalar conversions, the backend's body
templates (``mlir.bodies``), and a thread's computation of an op (``Compute``): an elementwise
``linalg.generic``, or a reduction or matmul accumulated into identities, combined and finished
(argmax's indices, a mean divided by its count)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from apportion.ir.kinds import Category
from apportion.ir.op import Op
from apportion.mlir.bodies import MlirBody, body_of, combine_of
from apportion.mlir.builder import Block, symbol_name
from apportion.mlir.f64_math import expand_f64_math, widen_f32_math
from apportion.mlir.forall.context import Context
from apportion.mlir.forall.tensors import (
    Env,
    IxBox,
    Slice,
    TensorVal,
    elementwise,
    extract_out,
    filled,
    generic,
    out_results,
    out_shape,
    read,
    region,
)
from apportion.mlir.index import Ix
from apportion.mlir.types import (
    FLOAT_TYPES,
    INDEX_MAX,
    INT_BITS,
    cast_op,
    compute_type,
    fptosi_saturating,
    mlir_type,
)


def convert(blk: Block, value: str, src: str, dst: str) -> str:
    """``value`` of scalar type ``src`` as type ``dst``: floats to ints saturate
    (``fptosi_saturating``: truncated toward zero, clamped, NaN to 0, as the reference),
    anything to ``i1`` is ``!= 0``, ``i1`` to numbers is 0 or 1."""
    if src == dst:
        return value
    if src in FLOAT_TYPES and dst in INT_BITS and dst != "i1":
        return fptosi_saturating(blk, value, src, dst)
    name = blk.fresh("v")
    if dst == "i1":
        if src in FLOAT_TYPES:
            zero = blk.const(0.0, src)
            blk.emit(f"{name} = arith.cmpf une, {value}, {zero} : {src}")
        else:
            zero = blk.const(0, src)
            blk.emit(f"{name} = arith.cmpi ne, {value}, {zero} : {src}")
        return name
    if dst == "bf16" and src != "f32":  # f16, f64 and integers: through f32
        return convert(blk, convert(blk, value, src, "f32"), "f32", dst)
    if src == "f32" and dst == "bf16":
        return f32_to_bf16(blk, value)
    blk.emit(f"{name} = arith.{cast_op(src, dst)} {value} : {src} to {dst}")
    return name


def f32_to_bf16(blk: Block, f32: str) -> str:
    """``f32`` rounded to bf16 (nearest even; NaN stays NaN) with integer ops. The compiler
    folds ``truncf(sitofp x)`` into one convert, which CPUs without bf16 instructions leave to
    a runtime library the module is not linked with; integer ops cannot be folded so."""
    sixteen, one = blk.const(16, "i32"), blk.const(1, "i32")
    bias, nan = blk.const(0x7FFF, "i32"), blk.fresh("cst")
    blk.emit(f"{nan} = arith.constant 0x7FC0 : bf16")
    bits, shifted, lsb, biased, rounded, top, half, value, isnan, name = (
        blk.fresh("v") for _ in range(10))
    blk.emit(f"{bits} = arith.bitcast {f32} : f32 to i32")
    blk.emit(f"{shifted} = arith.shrui {bits}, {sixteen} : i32")
    blk.emit(f"{lsb} = arith.andi {shifted}, {one} : i32")
    blk.emit(f"{biased} = arith.addi {bits}, {bias} : i32")
    blk.emit(f"{rounded} = arith.addi {biased}, {lsb} : i32")
    blk.emit(f"{top} = arith.shrui {rounded}, {sixteen} : i32")
    blk.emit(f"{half} = arith.trunci {top} : i32 to i16")
    blk.emit(f"{value} = arith.bitcast {half} : i16 to bf16")
    blk.emit(f"{isnan} = arith.cmpf uno, {f32}, {f32} : f32")
    blk.emit(f"{name} = arith.select {isnan}, {nan}, {value} : bf16")
    return name


def apply(blk: Block, body: MlirBody, integer: bool, ty: str, operands: Mapping[str, str],
          results: Sequence[str] = ("r",)) -> list[str]:
    """Format a body template into ``blk``; returns the SSA names of its results."""
    if body.wide and not integer and ty == "f32":  # in f64, rounded once to f32
        wide = {k: convert(blk, v, "f32", "f64") for k, v in operands.items()}
        return [convert(blk, r, "f64", "f32")
                for r in apply(blk, body, integer, "f64", wide, results)]
    text = body.text(integer)
    if ty == "f64":  # no libm in IREE's executables: f64 tanh, sin, cos, erf as arithmetic
        text = expand_f64_math(text)
    elif ty == "f32":  # IREE's f32 sin and cos lose accuracy linearly in |x|: through f64
        text = widen_f32_math(text)
    if not text.strip():
        return [operands["a"]]
    names = {r: blk.fresh(r) for r in results}
    prefix = blk.builder.template_prefix()
    for line in text.splitlines():
        blk.emit(line.format(p=prefix, t=ty, **operands, **names))
    return [names[r] for r in results]


class Compute:
    """A thread's computation of an op over its box, typed as the module docstring of
    ``mlir.forall`` says."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    # -- typing -----------------------------------------------------------------------------

    def compute_type(self, op: Op) -> str:
        """The scalar type ``op`` computes in: ``types.compute_type``, every emitter's rule."""
        return compute_type(op.kind, [self.ctx.dtype(a.tensor) for a in op.ins])

    def inputs_to(self, blk: Block, op: Op, args: Sequence[str], ty: str) -> list[str]:
        """Block arguments of ``op``'s inputs converted: values to ``ty``, conditions to i1."""
        out = []
        for i, (a, arg) in enumerate(zip(op.ins, args, strict=True)):
            elt = mlir_type(self.ctx.dtype(a.tensor))
            out.append(convert(blk, arg, elt, "i1" if i in op.kind.conditions else ty))
        return out

    # -- a thread's computation ---------------------------------------------------------------

    def core(self, blk: Block, op: Op, box: IxBox, dest: TensorVal, env: Env, accumulate: bool
             ) -> TensorVal:
        """``op`` over ``box``: the finished piece of the output (the accumulated piece of
        the accumulator when ``accumulate``), literal axes dropped."""
        kind = op.kind
        dims = list(op.dim_names)
        sizes = {d: box[d][1] for d in dims}
        split = self.ctx.slice_dims(op)
        ins = [read(blk, env[a.tensor], a, box, dims, split) for a in op.ins]
        results = out_results(op, dims)
        ty = self.compute_type(op)
        integer = ty == "i64"
        out_elt = dest.elt
        if kind.elementwise:
            o = extract_out(blk, dest, region(op.out, box), op.out.tensor)
            result_ty = "i1" if kind.result_dtype == "bool" else ty
            attrs = self.attr_values(op)
            template = body_of(kind, op.name)

            def body(b: Block, args: list[str], outs: list[str]) -> list[str]:
                xs = self.inputs_to(b, op, args, ty)
                consts = {k: b.const(v, ty) for k, v in attrs.items()}
                named = dict(zip("abc", xs, strict=False))
                r = apply(b, template, integer, ty, {**named, **consts})[0]
                return [convert(b, r, result_ty, out_elt)]

            return generic(blk, dims, sizes, [], ins, [o], results, body,
                           symbol_name(op.out.tensor))[0]
        acc = self.reduce_into(blk, op, box, ins, results, ty, dest if accumulate else None)
        if accumulate:
            return acc[0]
        return self.finish(blk, op, acc, lambda: extract_out(
            blk, dest, region(op.out, box), op.out.tensor))

    def accumulators(self, op: Op, ty: str) -> list[tuple[str, float]]:
        """(element type, identity) of each accumulator of ``op``."""
        r = op.kind.reducer
        assert r is not None
        if r.pairs:
            return [(ty, r.identity), ("i64", INDEX_MAX)]
        return [(ty, r.identity)]

    def reduce_into(self, blk: Block, op: Op, box: IxBox, ins: list[Slice], results: list[str],
                    ty: str, acc: TensorVal | None) -> list[TensorVal]:
        """The reduction or matmul of ``op`` over ``box`` accumulated into fresh identities, then
        (with ``acc``) combined into the slice of the accumulator ``acc``, as the reference
        combines a tile's partial. Returns the accumulators (two for argmax)."""
        kind = op.kind
        reducer = kind.reducer
        assert reducer is not None
        combine = combine_of(reducer, op.name, kind)
        product = body_of(kind, op.name) if kind.category is Category.MATMUL else None
        dims = list(op.dim_names)
        sizes = {d: box[d][1] for d in dims}
        shape = out_shape(op, box)
        integer = ty == "i64"
        outs = [filled(blk, symbol_name(op.out.tensor), shape, elt, ident)
                for elt, ident in self.accumulators(op, ty)]
        starts = {d: blk.value(box[d][0]) for d in op.reduction_dims} if reducer.pairs else {}
        strides = self.strides(blk, op) if reducer.pairs else {}

        def body(b: Block, args: list[str], outs_: list[str]) -> list[str]:
            xs = self.inputs_to(b, op, args, ty)
            if product is not None:
                value = apply(b, product, integer, ty, {"a": xs[0], "b": xs[1]})[0]
            else:
                value = xs[0]
            if not reducer.pairs:
                return apply(b, combine, integer, ty, {"a": outs_[0], "b": value})
            flat = self.flat_index(b, op, dims, starts, strides)
            return apply(b, combine, integer, ty,
                         {"a": outs_[0], "ai": outs_[1], "b": value, "bi": flat},
                         results=("r", "ri"))

        parts = generic(blk, dims, sizes, op.reduction_dims, ins, outs, results, body,
                        f"{symbol_name(op.out.tensor)}_acc")
        if acc is None:
            return parts
        return [self.combine_into(blk, op, extract_out(
            blk, acc, region(op.out, box), op.out.tensor), parts[0], ty)]

    def combine_into(self, blk: Block, op: Op, acc: TensorVal, part: TensorVal, ty: str
                     ) -> TensorVal:
        """``acc`` combined elementwise with the partial ``part`` of the same shape (a generic
        that reads a slice of a loop-carried accumulator as its init does not compile in IREE
        when its sizes are dynamic; this elementwise form does)."""
        reducer = op.kind.reducer
        assert reducer is not None
        combine = combine_of(reducer, op.name, op.kind)

        def body(b: Block, args: list[str], outs: list[str]) -> list[str]:
            return apply(b, combine, ty == "i64", ty, {"a": args[0], "b": args[1]})

        return elementwise(blk, [acc, part], acc, body, f"{symbol_name(op.out.tensor)}_comb")

    def strides(self, blk: Block, op: Op) -> dict[str, Ix | str]:
        """The row-major stride of each reduction dim of ``op`` over its whole reduction dims:
        a constant, or (a run-time size) its SSA value, made in ``blk``."""
        out: dict[str, Ix | str] = {}
        stride = Ix(1)
        for d in reversed(op.reduction_dims):
            out[d] = stride if stride.is_const else blk.value(stride, "stride")
            stride = blk.mul(stride, self.ctx.sizes.of(op)[d])
        return out

    def flat_index(self, b: Block, op: Op, dims: list[str], starts: Mapping[str, str],
                   strides: Mapping[str, Ix | str]) -> str:
        """Inside a body: the row-major flat index (i64) over the op's whole reduction dims of
        the current point (``starts``: the box's start in each reduction dim; ``strides``:
        each dim's stride, see ``strides``)."""
        flat: str | None = None
        for d in reversed(op.reduction_dims):
            i = b.linalg_index(dims.index(d), f"i_{d}")
            g = b.index_op("addi", i, starts[d], f"g_{d}")
            stride = strides[d]
            if stride != Ix(1):
                if isinstance(stride, Ix):
                    sc = b.fresh("stride")
                    b.emit(f"{sc} = arith.constant {stride.value} : index")
                else:
                    sc = stride
                g = b.index_op("muli", g, sc, f"m_{d}")
            flat = g if flat is None else b.index_op("addi", flat, g, "flat")
        if flat is None:
            flat = b.fresh("flat")
            b.emit(f"{flat} = arith.constant 0 : index")
        out = b.fresh("idx")
        b.emit(f"{out} = arith.index_cast {flat} : index to i64")
        return out

    def finish(self, blk: Block, op: Op, accs: list[TensorVal],
               out: Callable[[], TensorVal]) -> TensorVal:
        """The output piece of finished accumulators: argmax's indices, a mean divided by its
        count, converted to the output type; ``out()`` gives the slice it overwrites (of the
        accumulators' shape)."""
        reducer = op.kind.reducer
        assert reducer is not None
        acc = accs[-1] if reducer.pairs else accs[0]
        is_mean = reducer.finish is not None and not reducer.pairs
        out_elt = mlir_type(self.ctx.dtype(op.out.tensor))
        if acc.elt == out_elt and not is_mean:
            return acc
        o = out()
        count = Ix(1)
        for d in op.reduction_dims:
            count = blk.mul(count, self.ctx.sizes.of(op)[d])
        if is_mean and not count.is_const:  # a run-time count: converted before the body
            index = blk.value(count, "count")
            as_int = blk.fresh("count")
            blk.emit(f"{as_int} = arith.index_cast {index} : index to i64")
            fty = acc.elt if acc.elt in FLOAT_TYPES else "f64"
            run_count = blk.fresh("count")
            blk.emit(f"{run_count} = arith.uitofp {as_int} : i64 to {fty}")

        def body(b: Block, args: list[str], outs: list[str]) -> list[str]:
            v = args[0]
            src = acc.elt
            if is_mean:
                fty = src if src in FLOAT_TYPES else "f64"
                v = convert(b, v, src, fty)
                c = b.const(float(count.value), fty) if count.is_const else run_count
                q = b.fresh("mean")
                b.emit(f"{q} = arith.divf {v}, {c} : {fty}")
                v, src = q, fty
            return [convert(b, v, src, out_elt)]

        return elementwise(blk, [acc], o, body, f"{symbol_name(op.out.tensor)}_fin")

    def attr_values(self, op: Op) -> dict[str, float]:
        values = dict(body_of(op.kind, op.name).defaults)
        values.update(op.kind.numeric_attrs(dict(op.attrs)))
        # a constant (fill) is converted once to the output dtype; program validation
        # refuses one an integer output cannot hold
        return values
