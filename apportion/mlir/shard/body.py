"""One op of a program as ``linalg.generic`` on whole tensors: the form upstream MLIR's sharding
interface understands (linalg has a ``ShardingInterface`` external model), so
``--sharding-propagation`` and ``--shard-partition`` can read what the shard forms emit.

An op is its iteration space: one loop per op dim (``parallel`` for the output's dims,
``reduction`` for the rest), each operand read through the affine map of its access (sums of
dims and literal indices included), the scalar computation taken from the IREE backend's body
templates (``mlir.bodies``: one table of MLIR bodies per kind, so both emitters compute
alike). Values are converted to the op's compute type, every emitter's rule
(``mlir.types.compute_type``: float16 and bfloat16 in ``f32``; float32 sums, means and products
in ``f64``; integers in ``i64`` where the kind computes them exactly); a reduction or matmul
accumulates into a ``linalg.fill`` of its identity, an argmax into a (value, flat index) pair;
a finishing elementwise generic divides a mean by its count and converts to the output's dtype.
A kind without an iteration-space model
(a fallback: a sort, a scan ...) is a call of a private function named after the op
(``@apportion.fallback.OP``), declared in the module: upstream sees an opaque call, as apportion
runs it whole on one core.

>>> from apportion.frontend.json_format import load
>>> p = load("examples/mlp.json")
>>> blk = Block()
>>> vals = {n: f"%{n}" for n in p.inputs}
>>> out = render_op(blk, p.op("gate"), p.tensor_map, vals)
>>> "linalg.generic" in blk.text() and out.startswith("%")
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from apportion.ir.affine import AffineExpr
from apportion.ir.kinds import Category
from apportion.ir.op import Access, Op
from apportion.ir.program import TensorType
from apportion.mlir.bodies import MlirBody, body_of, combine_of
from apportion.mlir.builder import symbol_name
from apportion.mlir.types import (
    FLOAT_TYPES,
    INDEX_MAX,
    cast_op,
    compute_type,
    fptosi_saturating,
    literal,
)
from apportion.mlir.types import mlir_type as elt


def value_type(t: TensorType) -> str:
    """The tensor type of a value of type ``t``.

    >>> value_type(TensorType("x", (2, 3), "bfloat16"))
    'tensor<2x3xbf16>'
    """
    return tensor_type(t.shape, elt(t.dtype))


def tensor_type(shape: Sequence[int | None], element: str) -> str:
    """``tensor<2x?xf32>`` (None: a dynamic size); ``tensor<f32>`` for rank 0.

    >>> tensor_type((2, None), "f32"), tensor_type((), "i1")
    ('tensor<2x?xf32>', 'tensor<i1>')
    """
    dims = "".join(f"{'?' if n is None else n}x" for n in shape)
    return f"tensor<{dims}{element}>"


@dataclass
class Block:
    """Lines of MLIR being written and fresh SSA names; ``indent`` levels nest regions.
    ``declarations`` collects module-level lines (fallback functions) the ops need."""

    lines: list[str] = field(default_factory=list)
    indent: int = 1
    taken: dict[str, int] = field(default_factory=dict)
    declarations: dict[str, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    #: called on every tensor an op's code makes besides its result (``tensor.empty``,
    #: ``linalg.fill``, a reduction's accumulator before its finish) with its SSA value and
    #: type; returns the value the code uses next (the fully annotated form passes it through
    #: ``shard.shard``, as upstream's propagation does)
    mark_init: Callable[[Block, str, str], str] | None = None
    #: the same for what an op's read makes (an input without its literal dims): called with
    #: the value, its type, the tensor read and the dims dropped
    mark_read: Callable[[Block, str, str, str, tuple[int, ...]], str] | None = None

    def fresh(self, stem: str) -> str:
        """A new SSA name made from ``stem`` (a tensor or op name), never one given before
        (``x_1`` from ``x`` and ``x_1`` from ``x_1`` would collide without the check)."""
        base = symbol_name(stem).replace("$", "_")
        k = self.taken.get(base, 0)
        name = f"%{base}" if k == 0 else f"%{base}_{k}"
        while name in self.used:
            k += 1
            name = f"%{base}_{k}"
        self.taken[base] = k + 1
        self.used.add(name)
        return name

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    def const(self, value: float | int | bool, ty: str) -> str:
        name = self.fresh("c")
        self.emit(f"{name} = arith.constant {literal(value, ty)}")
        return name

    def text(self) -> str:
        return "\n".join(self.lines)


def convert(blk: Block, value: str, src: str, dst: str) -> str:
    """``value`` of scalar type ``src`` as ``dst``: floats to ints saturate (truncated toward
    zero, clamped, NaN to 0: ``fptosi_saturating``, as the IREE emitter), to ``i1`` is
    ``!= 0``, ``i1`` to numbers is 0 or 1."""
    if src == dst:
        return value
    if src in FLOAT_TYPES and dst not in FLOAT_TYPES and dst != "i1":
        return fptosi_saturating(blk, value, src, dst)
    name = blk.fresh("v")
    if dst == "i1":
        zero = blk.const(0.0 if src in FLOAT_TYPES else 0, src)
        cmp = "arith.cmpf une" if src in FLOAT_TYPES else "arith.cmpi ne"
        blk.emit(f"{name} = {cmp}, {value}, {zero} : {src}")
        return name
    if {src, dst} == {"f16", "bf16"}:  # no direct conversion: through f32
        return convert(blk, convert(blk, value, src, "f32"), "f32", dst)
    blk.emit(f"{name} = arith.{cast_op(src, dst)} {value} : {src} to {dst}")
    return name


def affine_map(dims: Sequence[str], access: Access) -> str:
    """The access as an affine map over the op's dims: ``(d0, d1) -> (d0 * 128 + d1)``.

    >>> affine_map(["t", "h", "d"], Access.parse("x[t, 64*h+d, 0]"))
    'affine_map<(d0, d1, d2) -> (d0, d1 * 64 + d2, 0)>'
    """
    return index_map(dims, access.index)


def index_map(dims: Sequence[str], exprs: Sequence[AffineExpr]) -> str:
    """Index expressions over ``dims`` as an affine map (``affine_map`` of an access's).

    >>> index_map(["i"], [AffineExpr.dim("i"), AffineExpr((), 0)])
    'affine_map<(d0) -> (d0, 0)>'
    """
    pos = {d: i for i, d in enumerate(dims)}
    results = []
    for e in exprs:
        parts = [f"d{pos[d]}" if c == 1 else f"d{pos[d]} * {c}" for d, c in e.terms]
        if e.const or not parts:
            parts.append(str(e.const))
        results.append(" + ".join(parts))
    args = ", ".join(f"d{i}" for i in range(len(dims)))
    return f"affine_map<({args}) -> ({', '.join(results)})>"


def apply_body(blk: Block, body: MlirBody, ty: str, operands: Mapping[str, str],
           results: Sequence[str] = ("r",)) -> list[str]:
    """A body template formatted into ``blk``; the SSA names of its results."""
    text = body.text(ty == "i64")
    if not text.strip():
        return [operands["a"]]
    names = {r: blk.fresh(r) for r in results}
    blk.taken["tmpl"] = blk.taken.get("tmpl", 0) + 1
    prefix = f"t{blk.taken['tmpl']}_"
    for line in text.splitlines():
        blk.emit(line.format(p=prefix, t=ty, **operands, **names))
    return [names[r] for r in results]


def _marked(blk: Block, value: str, ty: str) -> str:
    return value if blk.mark_init is None else blk.mark_init(blk, value, ty)


def _empty(blk: Block, stem: str, shape: Sequence[int], element: str) -> str:
    name = blk.fresh(f"{stem}_init")
    ty = tensor_type(shape, element)
    blk.emit(f"{name} = tensor.empty() : {ty}")
    return _marked(blk, name, ty)


def _filled(blk: Block, stem: str, shape: Sequence[int], element: str, value: float) -> str:
    init = _empty(blk, stem, shape, element)
    c = blk.const(value, element)
    name = blk.fresh(f"{stem}_id")
    ty = tensor_type(shape, element)
    blk.emit(f"{name} = linalg.fill ins({c} : {element}) outs({init} : {ty}) -> {ty}")
    return _marked(blk, name, ty)


Body = Callable[[Block, list[str], list[str]], list[str]]


def generic(blk: Block, dims: Sequence[str], reductions: Sequence[str],
            ins: Sequence[tuple[str, str, str, str]], outs: Sequence[tuple[str, str, str, str]],
            body: Body, stem: str) -> list[str]:
    """A ``linalg.generic``: ``ins``/``outs`` are (SSA value, tensor type, element type,
    affine map); ``body`` writes the region from the block arguments and returns what it
    yields. The SSA names of its results."""
    maps = ", ".join(m for *_, m in (*ins, *outs))
    its = ", ".join('"reduction"' if d in reductions else '"parallel"' for d in dims)
    results = [blk.fresh(stem) for _ in outs]
    lhs = results[0] if len(results) == 1 else f"{results[0]}:{len(results)}"
    head = f"{lhs} = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{its}]}}"
    if ins:
        head += (f" ins({', '.join(v for v, *_ in ins)} : "
                 f"{', '.join(t for _, t, *_ in ins)})")
    head += (f" outs({', '.join(v for v, *_ in outs)} : "
             f"{', '.join(t for _, t, *_ in outs)}) {{")
    blk.emit(head)
    args = [blk.fresh("in") for _ in ins]
    oargs = [blk.fresh("out") for _ in outs]
    sig = ", ".join(f"{a}: {e}" for a, (_, _, e, _) in zip([*args, *oargs], [*ins, *outs],
                                                           strict=True))
    blk.emit(f"^bb0({sig}):")
    blk.indent += 1
    yielded = body(blk, args, oargs)
    blk.emit(f"linalg.yield {', '.join(yielded)} : "
             f"{', '.join(e for _, _, e, _ in outs)}")
    blk.indent -= 1
    res_types = ", ".join(t for _, t, *_ in outs)
    blk.emit(f"}} -> {res_types if len(outs) == 1 else f'({res_types})'}")
    if len(results) == 1:
        return results
    return [f"{results[0]}#{i}" for i in range(len(results))]


def render_op(blk: Block, op: Op, types: Mapping[str, TensorType], vals: Mapping[str, str]
              ) -> str:
    """``op`` on whole tensors into ``blk``: ``types`` gives every operand's shape and dtype
    (the program's, or a device's local ones), ``vals`` the SSA value of each input. Returns
    the SSA value of its output (of ``types[op.out.tensor]``)."""
    out_t = types[op.out.tensor]
    out_elt = elt(out_t.dtype)
    if opaque(op):
        return _call(blk, op, types, vals)
    dims = list(op.dim_names)
    ins = [_read(blk, a, types[a.tensor], vals[a.tensor], dims, op.sizes) for a in op.ins]
    # literal indices of the output (a kept dim, ``ms[t, 0]``): written without them, then
    # broadcast back, so that every map is a projected permutation as upstream's linalg
    # sharding interface requires
    unit = [j for j, e in enumerate(op.out.index) if not e.terms]
    out_acc = Access(op.out.tensor, tuple(e for e in op.out.index if e.terms))
    out_shape = tuple(n for j, n in enumerate(out_t.shape) if j not in unit)
    omap = affine_map(dims, out_acc)
    ty = compute_type(op.kind, [types[a.tensor].dtype for a in op.ins])
    stem = op.out.tensor
    if unit:
        squeezed = render_whole(blk, op, replace(out_t, shape=out_shape), ins, omap, ty, dims)
        squeezed = _marked(blk, squeezed, tensor_type(out_shape, out_elt))
        return _unsqueeze(blk, squeezed, out_shape, out_t.shape, unit, out_elt, stem)
    return render_whole(blk, op, out_t, ins, omap, ty, dims)


def render_whole(blk: Block, op: Op, out_t: TensorType, ins: list[tuple[str, str, str, str]],
                 omap: str, ty: str, dims: list[str]) -> str:
    """``op`` into an output of type ``out_t`` written through ``omap``."""
    kind = op.kind
    out_elt = elt(out_t.dtype)
    stem = op.out.tensor
    if kind.elementwise:
        body = pointwise_body(op, [e for _, _, e, _ in ins], ty, out_elt)
        init = _empty(blk, stem, out_t.shape, out_elt)
        return generic(blk, dims, (), ins, [(init, tensor_type(out_t.shape, out_elt), out_elt,
                                              omap)], body, stem)[0]
    return _reduce(blk, op, out_t, ins, omap, ty, dims)


def pointwise_body(op: Op, in_elts: Sequence[str], ty: str, out_elt: str) -> Body:
    """The region of elementwise ``op``'s generic: each operand (of element types ``in_elts``;
    block arguments past them only give loop ranges) converted to the compute type ``ty`` (a
    condition to ``i1``), the kind's body template with its attributes as constants, the
    result converted to ``out_elt``."""
    kind = op.kind
    result_ty = "i1" if kind.result_dtype == "bool" else ty
    template = body_of(kind, op.name)
    attrs = dict(template.defaults)
    attrs.update(kind.numeric_attrs(dict(op.attrs)))

    def body(b: Block, args: list[str], outs: list[str]) -> list[str]:
        xs = [convert(b, arg, e, "i1" if i in kind.conditions else ty)
              for i, (arg, e) in enumerate(zip(args[:len(in_elts)], in_elts, strict=True))]
        consts = {k: b.const(v, ty) for k, v in attrs.items()}
        r = apply_body(b, template, ty, {**dict(zip("abc", xs, strict=False)), **consts})[0]
        return [convert(b, r, result_ty, out_elt)]

    return body


def reduce_body(op: Op, in_elts: Sequence[str], ty: str, dims: Sequence[str],
                starts: Mapping[str, str] | None = None) -> Body:
    """The region of reduction or matmul ``op``'s accumulating generic: the operands (of
    element types ``in_elts``; block arguments past them only give loop ranges) converted to
    ``ty``, a matmul's product, combined into the accumulator by the reducer; an argmax's flat
    index over the reduction dims kept beside it (``starts``: a device's offsets of them)."""
    kind = op.kind
    reducer = kind.reducer
    assert reducer is not None
    combine = combine_of(reducer, op.name, kind)
    product = body_of(kind, op.name) if kind.category is Category.MATMUL else None
    red = op.reduction_dims

    def body(b: Block, args: list[str], outs_: list[str]) -> list[str]:
        xs = [convert(b, arg, e, ty)
              for arg, e in zip(args[:len(in_elts)], in_elts, strict=True)]
        value = apply_body(b, product, ty, {"a": xs[0], "b": xs[1]})[0] if product else xs[0]
        if not reducer.pairs:
            return apply_body(b, combine, ty, {"a": outs_[0], "b": value})
        flat = flat_index(b, list(dims), red, op.sizes, starts)
        return apply_body(b, combine, ty, {"a": outs_[0], "ai": outs_[1], "b": value,
                                           "bi": flat}, results=("r", "ri"))

    return body


def _unsqueeze(blk: Block, value: str, shape: Sequence[int], full: Sequence[int],
               unit: Sequence[int], e: str, stem: str) -> str:
    """``value`` of ``shape`` broadcast to ``full`` (``shape`` with size-1 dims at ``unit``)."""
    rank = len(full)
    ps = [f"p{i}" for i in range(rank)]
    in_map = f"affine_map<({', '.join(f'd{i}' for i in range(rank))}) -> " \
             f"({', '.join(f'd{i}' for i in range(rank) if i not in unit)})>"
    init = _empty(blk, stem, full, e)
    return generic(blk, ps, (), [(value, tensor_type(shape, e), e, in_map)],
                   [(init, tensor_type(full, e), e, identity_map(rank))],
                   lambda b, args, outs: [args[0]], stem)[0]


def _squeeze(blk: Block, value: str, shape: Sequence[int], unit: Sequence[int], e: str,
             stem: str) -> tuple[str, list[int]]:
    """``value`` without its size-1 dims at ``unit`` (a generic that reduces over them: one
    element each), and the shape left."""
    rank = len(shape)
    left = [n for i, n in enumerate(shape) if i not in unit]
    ps = [f"p{i}" for i in range(rank)]
    out_map = f"affine_map<({', '.join(f'd{i}' for i in range(rank))}) -> " \
              f"({', '.join(f'd{i}' for i in range(rank) if i not in unit)})>"
    init = blk.fresh(f"{stem}_init")
    lty = tensor_type(left, e)
    blk.emit(f"{init} = tensor.empty() : {lty}")
    if blk.mark_read is not None:
        init = blk.mark_read(blk, init, lty, stem, tuple(unit))
    out = generic(blk, ps, [ps[i] for i in unit], [(value, tensor_type(shape, e), e,
                                                     identity_map(rank))],
                  [(init, lty, e, out_map)], lambda b, args, outs: [args[0]],
                  f"{stem}_squeezed")[0]
    if blk.mark_read is not None:
        out = blk.mark_read(blk, out, lty, stem, tuple(unit))
    return out, left


def identity_map(rank: int) -> str:
    """The identity map of ``rank`` dims.

    >>> identity_map(2)
    'affine_map<(d0, d1) -> (d0, d1)>'
    """
    ds = ", ".join(f"d{i}" for i in range(rank))
    return f"affine_map<({ds}) -> ({ds})>"


def _read(blk: Block, acc: Access, t: TensorType, value: str, dims: Sequence[str],
          sizes: Mapping[str, int]) -> tuple[str, str, str, str]:
    """An input as (SSA value, tensor type, element type, affine map). An index that is a sum
    of dims (a head view ``q[t, 128*h+d]``, a part ``gu[t, 11008+f]``) is read through
    ``tensor.extract_slice`` of the range it covers and ``tensor.expand_shape`` into its
    digits, so every index is one dim or a literal: linalg derives its loop bounds from
    operands indexed by single dims (its maps must be invertible)."""
    e_t = elt(t.dtype)
    shape = list(t.shape)
    index = list(acc.index)
    if all(e.single_dim is not None and shape[j] == sizes[e.single_dim]
           for j, e in enumerate(index)):
        return value, tensor_type(shape, e_t), e_t, affine_map(dims, acc)
    # one dim scaled or shifted (``x[t + 1]``, ``x[2*i]``) or reading a prefix, or a literal
    # other than a size-1 dim's 0: the range or element it reads, cut out first
    offs, size, strides = [0] * len(shape), list(shape), [1] * len(shape)
    cut = False
    for j, e in enumerate(index):
        if len(e.terms) == 1 and (e.single_dim is None or shape[j] != sizes[e.terms[0][0]]):
            # a part of the dim: linalg takes a loop's range from a dim it indexes alone
            (d, c), = e.terms
            offs[j], size[j], strides[j] = e.const, sizes[d], c
            index[j] = AffineExpr.dim(d)
            cut = True
        elif not e.terms and (e.const or shape[j] != 1):
            offs[j], size[j] = e.const, 1
            cut = True
    if cut:
        part = blk.fresh(f"{acc.tensor}_part")
        blk.emit(f"{part} = tensor.extract_slice {value}[{', '.join(map(str, offs))}] "
                 f"[{', '.join(map(str, size))}] [{', '.join(map(str, strides))}] : "
                 f"{tensor_type(shape, e_t)} to {tensor_type(size, e_t)}")
        value, shape = part, size
    for j in reversed(range(len(index))):
        e = index[j]
        if len(e.terms) <= 1:
            continue
        digits = AffineExpr(e.terms, 0).radix_digits(dict(sizes))
        if digits is None:
            continue
        span = math.prod(sizes[d] for d in digits)
        if e.const or span != shape[j]:
            cut = blk.fresh(f"{acc.tensor}_part")
            offs = [0] * len(shape)
            offs[j] = e.const
            part = list(shape)
            part[j] = span
            blk.emit(f"{cut} = tensor.extract_slice {value}[{', '.join(map(str, offs))}] "
                     f"[{', '.join(map(str, part))}] [{', '.join('1' for _ in shape)}] : "
                     f"{tensor_type(shape, e_t)} to {tensor_type(part, e_t)}")
            value, shape = cut, part
        grown = shape[:j] + [sizes[d] for d in digits] + shape[j + 1:]
        groups, k = [], 0
        for i in range(len(shape)):
            width = len(digits) if i == j else 1
            groups.append(f"[{', '.join(str(k + w) for w in range(width))}]")
            k += width
        view = blk.fresh(f"{acc.tensor}_view")
        blk.emit(f"{view} = tensor.expand_shape {value} [{', '.join(groups)}] output_shape "
                 f"[{', '.join(map(str, grown))}] : {tensor_type(shape, e_t)} into "
                 f"{tensor_type(grown, e_t)}")
        value, shape = view, grown
        index[j:j + 1] = [AffineExpr.dim(d) for d in digits]
    unit = [j for j, e in enumerate(index) if not e.terms]
    if unit:  # literal indices: the size-1 dims dropped, so every map is a permutation
        value, shape = _squeeze(blk, value, shape, unit, e_t, acc.tensor)
        index = [e for e in index if e.terms]
    return (value, tensor_type(shape, e_t), e_t,
            affine_map(dims, Access(acc.tensor, tuple(index))))


def opaque(op: Op) -> bool:
    """True when ``op`` is written as a call of an opaque function (a fallback, a whole-tensor
    kind, a kind the IREE templates run by a construction), not as a ``linalg.generic``.

    >>> from apportion.frontend.json_format import load
    >>> [op.name for op in load("examples/rmsnorm_argmax.json").ops if opaque(op)]
    ['rank']
    """
    return op.kind.category is Category.FALLBACK or op.kind.whole or _construction(op)


def _construction(op: Op) -> bool:
    """True for a kind the IREE templates run by a construction (a scan, a sort, a gather ...),
    not point by point: it has no single linalg.generic."""
    if op.kind.category in (Category.REDUCTION,):
        return False
    return body_of(op.kind, op.name).construction is not None


def _reduce(blk: Block, op: Op, out_t: TensorType,
            ins: list[tuple[str, str, str, str]], omap: str, ty: str, dims: list[str]) -> str:
    """A reduction or matmul accumulated into its identity, then finished (a mean divided by
    its count, an argmax's index kept) and converted to the output's dtype."""
    reducer = op.kind.reducer
    assert reducer is not None
    body = reduce_body(op, [e for _, _, e, _ in ins], ty, dims)
    shape = out_t.shape
    stem = op.out.tensor
    accs = [(ty, reducer.identity)] + ([("i64", INDEX_MAX)] if reducer.pairs else [])
    outs = [(_filled(blk, f"{stem}_acc", shape, e, ident), tensor_type(shape, e), e, omap)
            for e, ident in accs]
    red = op.reduction_dims
    sizes = op.sizes
    parts = generic(blk, dims, red, ins, outs, body, f"{stem}_acc")
    acc, acc_elt = (parts[1], "i64") if reducer.pairs else (parts[0], ty)
    out_elt = elt(out_t.dtype)
    is_mean = reducer.finish is not None and not reducer.pairs
    if acc_elt == out_elt and not is_mean:
        return acc
    acc = _marked(blk, acc, tensor_type(shape, acc_elt))  # read by the finish below
    count = math.prod(sizes[d] for d in red)
    rank = len(shape)
    ident = f"affine_map<({', '.join(f'd{i}' for i in range(rank))}) -> " \
            f"({', '.join(f'd{i}' for i in range(rank))})>"
    init = _empty(blk, stem, shape, out_elt)

    def fin(b: Block, args: list[str], outs_: list[str]) -> list[str]:
        return [finished(b, args[0], acc_elt, out_elt, count if is_mean else None)]

    return generic(blk, [f"p{i}" for i in range(rank)], (),
                   [(acc, tensor_type(shape, acc_elt), acc_elt, ident)],
                   [(init, tensor_type(shape, out_elt), out_elt, ident)], fin, stem)[0]


def finished(b: Block, v: str, src: str, out_elt: str, mean_of: int | None) -> str:
    """Inside a finish body: the accumulated ``v`` (of element type ``src``) as ``out_elt``,
    divided by ``mean_of`` first for a mean (in ``src`` where it is a float, else f64)."""
    if mean_of is not None:
        fty = src if src in FLOAT_TYPES else "f64"
        v = convert(b, v, src, fty)
        c = b.const(float(mean_of), fty)
        q = b.fresh("mean")
        b.emit(f"{q} = arith.divf {v}, {c} : {fty}")
        v, src = q, fty
    return convert(b, v, src, out_elt)


def flat_index(b: Block, dims: list[str], red: Sequence[str], sizes: Mapping[str, int],
               starts: Mapping[str, str] | None = None) -> str:
    """Inside a body: the row-major flat index (i64) of the current point over the op's
    reduction dims (of ``sizes``); ``starts`` shifts a dim's local index by an offset value
    (a device's shard of a split dim, indexed over the whole dim)."""
    flat: str | None = None
    stride = 1
    for d in reversed(red):
        i = b.fresh(f"i_{d}")
        b.emit(f"{i} = linalg.index {dims.index(d)} : index")
        if starts and d in starts:
            g = b.fresh(f"g_{d}")
            b.emit(f"{g} = arith.addi {i}, {starts[d]} : index")
            i = g
        if stride != 1:
            s = b.const(stride, "index")
            m = b.fresh(f"m_{d}")
            b.emit(f"{m} = arith.muli {i}, {s} : index")
            i = m
        if flat is None:
            flat = i
        else:
            f = b.fresh("flat")
            b.emit(f"{f} = arith.addi {flat}, {i} : index")
            flat = f
        stride *= sizes[d]
    if flat is None:
        flat = b.const(0, "index")
    out = b.fresh("idx")
    b.emit(f"{out} = arith.index_cast {flat} : index to i64")
    return out


def _call(blk: Block, op: Op, types: Mapping[str, TensorType], vals: Mapping[str, str]) -> str:
    """A fallback op as a call of the private function ``@apportion.fallback.OP`` declared in
    the module (one per op name and signature)."""
    arg_types = [tensor_type(types[a.tensor].shape, elt(types[a.tensor].dtype)) for a in op.ins]
    out_t = types[op.out.tensor]
    res_type = tensor_type(out_t.shape, elt(out_t.dtype))
    sig = f"({', '.join(arg_types)}) -> {res_type}"
    base = f"apportion.fallback.{symbol_name(op.name)}"
    name = base
    k = 1
    while name in blk.declarations and blk.declarations[name] != sig:
        name = f"{base}.{k}"
        k += 1
    blk.declarations[name] = sig
    res = blk.fresh(op.out.tensor)
    args = ", ".join(vals[a.tensor] for a in op.ins)
    blk.emit(f'{res} = func.call @"{name}"({args}) {{apportion.kind = "{op.kind.name}"}} : '
             f"{sig}")
    return res


def declarations(blk: Block) -> list[str]:
    """The module-level declarations ``blk``'s ops call (fallback functions)."""
    return [f'func.func private @"{n}"{_split_sig(s)} attributes {{apportion.fallback}}'
            for n, s in sorted(blk.declarations.items())]


def _split_sig(sig: str) -> str:
    args, res = sig.split(" -> ")
    return f"{args} -> {res}"
