"""Fallbacks in the parallel IR (``mlir.forall``): sort, cumsum and flip run whole along
the last axis of their input, with upstream linalg only: cumsum a running combine over
``j <= i``, flip a gather, sort by rank (each element's rank counts the smaller ones, ties by
position, then each rank picks its element).

The whole-tensor kinds (``OpKind.whole``: the PyTorch frontend's gathers and embeddings,
reshapes, concatenations, constants, ranges and top-k) are one ``linalg.generic`` over the whole
output that computes where each output element comes from and reads it with ``tensor.extract``
(top-k: from the rank sort). A gather's index counts from the end once when negative, as
numpy's ``take`` does; an index outside ``[-rows, rows)`` reads a clamped row rather than memory
outside the table, and the iree backend's run refuses it as the reference executor does
(``backends.iree.run``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from apportion.errors import EmitError
from apportion.ir.op import Op
from apportion.limits import cite
from apportion.mlir.bodies import BACKEND, MlirBody, body_of
from apportion.mlir.builder import Block, symbol_name
from apportion.mlir.forall.compute import Compute, apply, convert
from apportion.mlir.forall.context import Context
from apportion.mlir.forall.tensors import (
    Env,
    IxBox,
    Slice,
    TensorVal,
    empty,
    extract_out,
    filled,
    generic,
    insert,
    out_results,
    read,
    region,
    region_val,
)
from apportion.mlir.index import Ix
from apportion.mlir.types import FLOAT_TYPES


class Fallbacks:
    """Ops of a fallback kind, built by the construction their body names."""

    def __init__(self, ctx: Context, compute: Compute) -> None:
        self.ctx, self.compute = ctx, compute

    def fallback(self, blk: Block, op: Op, dest: TensorVal, env: Env,
                 tile: IxBox | None = None) -> TensorVal:
        """A fallback runs whole along the last axis of its whole input (in a loop nest: of the
        input's region over ``tile``, which is whole along that axis); the result is then read
        through the input's access and written through the output's (a transpose at most)."""
        kind = op.kind
        body = body_of(kind, op.name)
        if kind.whole:
            return self.whole(blk, op, body, dest, env)
        if body.construction not in _CONSTRUCTIONS:
            raise EmitError(f"op {op.name!r}: kind {kind.name!r} names construction "
                            f"{body.construction!r}, which the {BACKEND} backend lacks "
                            f"{cite('iree-kind-without-mlir')}")
        src = env[op.ins[0].tensor]
        if not src.shape:
            raise EmitError(f"op {op.name!r}: {kind.name} of a rank-0 tensor has no last axis")
        ty = self.compute.compute_type(op)
        if body.construction == "scan" and ty == "f32":
            # a running sum of float32 values in float64, as the reference computes it: its
            # error grows with the row and its last entries may cancel to near 0 (a row less
            # its mean), where float32 accumulation missed float32's tolerance (conformance
            # seed 142: 1.8e-5 off at 1e-5 + 1e-4 |y|; 5.2e-6 in float64)
            ty = "f64"
        dims = list(op.dim_names)
        sizes = self.ctx.sizes.of(op)
        box = {d: (Ix(0), n) for d, n in sizes.items()}
        if tile is not None and tile != box:  # a loop's tile: its region of the input
            box, sizes = tile, {d: tile[d][1] for d in dims}
            src = region_val(blk, src, op.ins[0], box)
        res = _CONSTRUCTIONS[body.construction](self, blk, op, body, src, ty)
        res = TensorVal(res.ssa, res.shape, res.elt, src.origin)
        ins = [read(blk, res, op.ins[0], box, dims)]
        o = extract_out(blk, dest, region(op.out, box), op.out.tensor)

        def cast(b: Block, args: list[str], outs: list[str]) -> list[str]:
            return [convert(b, args[0], ty, dest.elt)]

        piece = generic(blk, dims, sizes, [], ins, [o], out_results(op, dims), cast,
                        symbol_name(op.out.tensor))[0]
        return insert(blk, piece, dest, region(op.out, box), parallel=False)

    def along_last(self, src: TensorVal, extra: bool) -> tuple[list[str], list[str], list[str]]:
        """Maps over (..., i[, j]) of ``src``: (x at i, x at j, out at i) results."""
        r = len(src.shape)
        lead = [f"d{k}" for k in range(r - 1)]
        at_i = [*lead, f"d{r - 1}"]
        at_j = [*lead, f"d{r}"] if extra else at_i
        return at_i, at_j, at_i

    def scan(self, blk: Block, op: Op, body: MlirBody, src: TensorVal, ty: str) -> TensorVal:
        r = len(src.shape)
        at_i, at_j, out = self.along_last(src, True)
        init = filled(blk, f"{op.name}_scan", src.shape, ty, body.identity)
        sizes = {f"a{k}": s for k, s in enumerate(src.shape)} | {"j": src.shape[-1]}
        integer = ty == "i64"

        def run(b: Block, args: list[str], outs: list[str]) -> list[str]:
            x = convert(b, args[0], src.elt, ty)
            i, j, le = b.fresh("i"), b.fresh("j"), b.fresh("le")
            b.emit(f"{i} = linalg.index {r - 1} : index")
            b.emit(f"{j} = linalg.index {r} : index")
            b.emit(f"{le} = arith.cmpi ule, {j}, {i} : index")
            s = apply(b, body, integer, ty, {"a": outs[0], "b": x})[0]
            sel = b.fresh("sel")
            b.emit(f"{sel} = arith.select {le}, {s}, {outs[0]} : {ty}")
            return [sel]

        return generic(blk, list(sizes), sizes, ["j"], [Slice.of(src, at_j)], [init], out, run,
                       f"{op.name}_scan")[0]

    def reverse(self, blk: Block, op: Op, body: MlirBody, src: TensorVal, ty: str
                ) -> TensorVal:
        # a gather (tensor.extract at n-1-i): IREE tiles a reversed indexing map wrongly
        r = len(src.shape)
        at_i, _, out = self.along_last(src, False)
        init = empty(blk, f"{op.name}_rev", src.shape, ty)
        sizes = {f"a{k}": s for k, s in enumerate(src.shape)}
        last = blk.value(src.shape[-1] - 1)

        def run(b: Block, args: list[str], outs: list[str]) -> list[str]:
            idx = [b.linalg_index(k, f"i{k}") for k in range(r)]
            rev = b.index_op("subi", last, idx[-1], "rev")
            x = b.fresh("x")
            b.emit(f"{x} = tensor.extract {src.ssa}[{', '.join([*idx[:-1], rev])}] : "
                   f"{src.type}")
            return [convert(b, x, src.elt, ty)]

        return generic(blk, list(sizes), sizes, [], [], [init], out, run, f"{op.name}_rev")[0]

    def sort(self, blk: Block, op: Op, body: MlirBody, src: TensorVal, ty: str) -> TensorVal:
        r = len(src.shape)
        at_i, at_j, out = self.along_last(src, True)
        integer = ty == "i64"
        sizes = {f"a{k}": s for k, s in enumerate(src.shape)} | {"j": src.shape[-1]}
        ranks0 = filled(blk, f"{op.name}_rank", src.shape, "i64", 0)

        def rank(b: Block, args: list[str], outs: list[str]) -> list[str]:
            xi = convert(b, args[0], src.elt, ty)
            xj = convert(b, args[1], src.elt, ty)
            lt_ji = apply(b, body, integer, ty, {"a": xj, "b": xi})[0]
            lt_ij = apply(b, body, integer, ty, {"a": xi, "b": xj})[0]
            i, j = b.fresh("i"), b.fresh("j")
            b.emit(f"{i} = linalg.index {r - 1} : index")
            b.emit(f"{j} = linalg.index {r} : index")
            names = {k: b.fresh(k) for k in ("first", "true", "nlt", "tie", "before", "one",
                                             "inc", "rank")}
            b.emit(f"{names['first']} = arith.cmpi ult, {j}, {i} : index")
            b.emit(f"{names['true']} = arith.constant true")
            b.emit(f"{names['nlt']} = arith.xori {lt_ij}, {names['true']} : i1")
            b.emit(f"{names['tie']} = arith.andi {names['nlt']}, {names['first']} : i1")
            b.emit(f"{names['before']} = arith.ori {lt_ji}, {names['tie']} : i1")
            b.emit(f"{names['one']} = arith.constant 1 : i64")
            b.emit(f"{names['inc']} = arith.addi {outs[0]}, {names['one']} : i64")
            b.emit(f"{names['rank']} = arith.select {names['before']}, {names['inc']}, "
                   f"{outs[0]} : i64")
            return [names["rank"]]

        ranks = generic(blk, list(sizes), sizes, ["j"], [Slice.of(src, at_i), Slice.of(src, at_j)],
                        [ranks0], out, rank, f"{op.name}_rank")[0]
        init = filled(blk, f"{op.name}_sorted", src.shape, ty, 0)

        def pick(b: Block, args: list[str], outs: list[str]) -> list[str]:
            x = convert(b, args[0], src.elt, ty)
            i, ic, hit, sel = b.fresh("pos"), b.fresh("pos64"), b.fresh("hit"), b.fresh("pick")
            b.emit(f"{i} = linalg.index {r - 1} : index")
            b.emit(f"{ic} = arith.index_cast {i} : index to i64")
            b.emit(f"{hit} = arith.cmpi eq, {args[1]}, {ic} : i64")
            b.emit(f"{sel} = arith.select {hit}, {x}, {outs[0]} : {ty}")
            return [sel]

        return generic(blk, list(sizes), sizes, ["j"], [Slice.of(src, at_j), Slice.of(ranks, at_j)],
                       [init], out, pick, f"{op.name}_sorted")[0]

    # -- whole-tensor kinds -------------------------------------------------------------------

    def whole(self, blk: Block, op: Op, body: MlirBody, dest: TensorVal, env: Env
              ) -> TensorVal:
        """A whole-tensor kind: one generic over the whole output (``dest``), each element read
        by computed index from the inputs as stored. Sizes may be run-time values
        (``forall.sizes``): the index arithmetic takes them as SSA values."""
        build = _WHOLE.get(body.construction or "")
        if build is None:
            raise EmitError(f"op {op.name!r}: kind {op.kind.name!r} names construction "
                            f"{body.construction!r}, which the {BACKEND} backend lacks")
        ins = [env[a.tensor] for a in op.ins]
        element = build(self, blk, op, body, ins, dest)
        dims = [f"o{k}" for k in range(len(dest.shape))]

        def run(b: Block, args: list[str], outs: list[str]) -> list[str]:
            return [element(b, [b.linalg_index(k, f"o{k}") for k in range(len(dims))])]

        return generic(blk, dims, dict(zip(dims, dest.shape, strict=True)), [], [], [dest],
                       [f"d{k}" for k in range(len(dims))], run, symbol_name(op.out.tensor))[0]

    def gather(self, blk: Block, op: Op, body: MlirBody, ins: list[TensorVal],
               dest: TensorVal) -> _Element:
        """``table[ids]`` as the registry defines it: output element ``f`` (row-major) is
        element ``f % row`` of the table's row ``ids.flat[f // row]``, a row being (output
        elements / index elements) table elements."""
        table, ids = ins
        if ids.elt in FLOAT_TYPES:
            raise EmitError(f"op {op.name!r}: gather reads indices from tensor "
                            f"{op.ins[1].tensor!r} of dtype {self.ctx.dtype(op.ins[1].tensor)}; "
                            "indices must be integers or bools")
        k = len(ids.shape)
        if tuple(dest.shape[:k]) == tuple(ids.shape):  # an embedding: the ids lead the output
            row = _prod(blk, dest.shape[k:])
        else:
            row = blk.div(_prod(blk, dest.shape), _prod(blk, ids.shape))
        table_n = _prod(blk, table.shape)
        sizes = [row, table_n, _prod(blk, dest.shape), _prod(blk, ids.shape)]
        if all(s.is_const for s in sizes):
            r, t, o, n = (s.value for s in sizes)
            if r == 0 or t < r or t % r or o != r * n:
                raise EmitError(f"op {op.name!r}: gather of {n} indices into {o} output "
                                f"elements cannot take rows of {r} from the {t} elements of "
                                f"tensor {op.ins[0].tensor!r}")
        rows = blk.div(table_n, row)

        def element(b: Block, at: list[str]) -> str:
            f = _flat(b, at, dest.shape)
            step = b.value(row)
            i, c = b.index_op("divui", f, step), b.index_op("remui", f, step)
            wide = convert(b, _extract(b, ids, _unravel(b, i, ids.shape)), ids.elt, "i64")
            idx = b.fresh("id")
            b.emit(f"{idx} = arith.index_cast {wide} : i64 to index")
            # numpy's take: a negative index counts from the end once; an index still outside
            # the table is clamped here (never a read outside it) and refused by the run
            zero, n_rows = b.value(0), b.value(rows)
            neg = b.fresh("neg")
            b.emit(f"{neg} = arith.cmpi slt, {idx}, {zero} : index")
            wrapped = b.index_op("addi", idx, n_rows)
            picked = b.fresh("row")
            b.emit(f"{picked} = arith.select {neg}, {wrapped}, {idx} : index")
            last = b.index_op("subi", n_rows, b.value(1))
            safe = b.index_op("minsi", b.index_op("maxsi", picked, zero), last)
            t = b.index_op("addi", b.index_op("muli", safe, step), c)
            return convert(b, _extract(b, table, _unravel(b, t, table.shape)), table.elt,
                            dest.elt)

        return element

    def reshape(self, blk: Block, op: Op, body: MlirBody, ins: list[TensorVal],
                dest: TensorVal) -> _Element:
        """The input's elements in row-major order: output element ``f`` is input element
        ``f``."""
        src, = ins
        n_in, n_out = _prod(blk, src.shape), _prod(blk, dest.shape)
        if n_in.is_const and n_out.is_const and n_in.value != n_out.value:
            raise EmitError(f"op {op.name!r}: reshape of tensor {op.ins[0].tensor!r} "
                            f"({n_in.value} elements) into tensor {op.out.tensor!r} "
                            f"({n_out.value} elements): the element counts differ")

        def element(b: Block, at: list[str]) -> str:
            f = _flat(b, at, dest.shape)
            return convert(b, _extract(b, src, _unravel(b, f, src.shape)), src.elt, dest.elt)

        return element

    def concat(self, blk: Block, op: Op, body: MlirBody, ins: list[TensorVal],
               dest: TensorVal) -> _Element:
        """``a`` then ``b`` along ``axis``: each output element reads both at clamped
        positions and selects by its coordinate along the axis."""
        a, b_ = ins
        rank = len(dest.shape)
        axis = int(self.compute.attr_values(op)["axis"])
        ax = axis + rank if axis < 0 else axis
        if not 0 <= ax < rank or len(a.shape) != rank or len(b_.shape) != rank:
            raise EmitError(f"op {op.name!r}: concat of tensors {op.ins[0].tensor!r} and "
                            f"{op.ins[1].tensor!r} along axis {axis} does not give the rank "
                            f"{rank} of tensor {op.out.tensor!r}")
        n_a, n_b = a.shape[ax], b_.shape[ax]

        def element(b: Block, at: list[str]) -> str:
            c = at[ax]
            if n_a == Ix(0) or n_b == Ix(0):  # one side is empty: the other is the output
                src = b_ if n_a == Ix(0) else a
                return convert(b, _extract(b, src, at), src.elt, dest.elt)
            size_a = b.value(n_a)
            in_a = b.fresh("in_a")
            b.emit(f"{in_a} = arith.cmpi ult, {c}, {size_a} : index")
            ca = b.index_op("minui", c, b.index_op("subi", size_a, b.value(1)))
            cb = b.index_op("subi", b.index_op("maxui", c, size_a), size_a)
            va = convert(b, _extract(b, a, [*at[:ax], ca, *at[ax + 1:]]), a.elt, dest.elt)
            vb = convert(b, _extract(b, b_, [*at[:ax], cb, *at[ax + 1:]]), b_.elt, dest.elt)
            out = b.fresh("cat")
            b.emit(f"{out} = arith.select {in_a}, {va}, {vb} : {dest.elt}")
            return out

        return element

    def full(self, blk: Block, op: Op, body: MlirBody, ins: list[TensorVal], dest: TensorVal
             ) -> _Element:
        """Every element ``value``: the float64 constant converted to the output type, as the
        reference converts numpy's array."""
        value = self.compute.attr_values(op)["value"]
        return lambda b, at: convert(b, b.const(value, "f64"), "f64", dest.elt)

    def arange(self, blk: Block, op: Op, body: MlirBody, ins: list[TensorVal],
               dest: TensorVal) -> _Element:
        """``start + step * f`` in float64 over the row-major position ``f``, converted to the
        output type."""
        attrs = {"start": 0.0, "step": 1.0, **self.compute.attr_values(op)}

        def element(b: Block, at: list[str]) -> str:
            f = _flat(b, at, dest.shape)
            i64, x, prod, out = b.fresh("pos"), b.fresh("pos"), b.fresh("step"), b.fresh("ar")
            b.emit(f"{i64} = arith.index_cast {f} : index to i64")
            b.emit(f"{x} = arith.sitofp {i64} : i64 to f64")
            b.emit(f"{prod} = arith.mulf {b.const(attrs['step'], 'f64')}, {x} : f64")
            b.emit(f"{out} = arith.addf {b.const(attrs['start'], 'f64')}, {prod} : f64")
            return convert(b, out, "f64", dest.elt)

        return element

    def topk(self, blk: Block, op: Op, body: MlirBody, ins: list[TensorVal], dest: TensorVal
             ) -> _Element:
        """The k largest along the last axis, largest first: the rank sort (NaN last) read
        from its end."""
        src, = ins
        if not src.shape or len(src.shape) != len(dest.shape):
            raise EmitError(f"op {op.name!r}: topk of tensor {op.ins[0].tensor!r} of rank "
                            f"{len(src.shape)} does not give tensor {op.out.tensor!r} of rank "
                            f"{len(dest.shape)}")
        ty = self.compute.compute_type(op)
        ordered = self.sort(blk, op, body, src, ty)
        n = src.shape[-1]

        def element(b: Block, at: list[str]) -> str:
            last = b.index_op("subi", b.value(n), b.value(1))
            return convert(b, _extract(b, ordered, [*at[:-1], b.index_op("subi", last, at[-1])]),
                            ty, dest.elt)

        return element


#: an output element of a whole-tensor kind: (block, output coordinates) -> its SSA value
_Element = Callable[[Block, list[str]], str]


def _prod(blk: Block, shape: Sequence[Ix]) -> Ix:
    """The element count of ``shape``: a constant, or run-time arithmetic made in ``blk``."""
    n = Ix(1)
    for s in shape:
        n = blk.mul(n, s)
    return n


def _flat(b: Block, at: Sequence[str], shape: Sequence[Ix]) -> str:
    """The row-major position of coordinates ``at`` in ``shape``."""
    flat = b.value(0)
    for i, n in zip(at, shape, strict=True):
        flat = b.index_op("addi", b.index_op("muli", flat, b.value(n)), i)
    return flat


def _unravel(b: Block, flat: str, shape: Sequence[Ix]) -> list[str]:
    """The coordinates in ``shape`` of the row-major position ``flat``."""
    out: list[str] = []
    for n in reversed(shape):
        size = b.value(n)
        out.append(b.index_op("remui", flat, size))
        flat = b.index_op("divui", flat, size)
    return out[::-1]


def _extract(b: Block, val: TensorVal, at: Sequence[str]) -> str:
    name = b.fresh("x")
    b.emit(f"{name} = tensor.extract {val.ssa}[{', '.join(at)}] : {val.type}")
    return name


_WHOLE: dict[str, Callable[..., _Element]] = {
    "gather": Fallbacks.gather,
    "reshape": Fallbacks.reshape,
    "concat": Fallbacks.concat,
    "full": Fallbacks.full,
    "arange": Fallbacks.arange,
    "topk": Fallbacks.topk,
}


_CONSTRUCTIONS: dict[str, Callable[..., TensorVal]] = {
    "scan": Fallbacks.scan,
    "reverse": Fallbacks.reverse,
    "sort": Fallbacks.sort,
}
