"""Tensor values of the parallel IR (``mlir.forall``) and the tensor work of its renderer: a
thread's slice of a dim and its box of an op, operands read as ``tensor.extract_slice`` over
their bounding box, pieces written back with ``tensor.insert_slice`` or
``tensor.parallel_insert_slice``, ``linalg.generic`` with indexing maps relative to the slices,
and the ``scf.forall`` around a thread's work. Every function writes into the block it is
given (``mlir.builder``) and keeps no state of its own."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from apportion.ir.affine import AffineExpr
from apportion.ir.op import Access, Op
from apportion.mlir.builder import INDENT, Block, symbol_name
from apportion.mlir.index import Ix, IxLike, affine_map
from apportion.plans.views import dim_slices


def tensor_type(shape: Sequence[IxLike], elt: str) -> str:
    """``tensor<4x?xf16>`` (``?`` where a size is not constant); rank 0: ``tensor<f16>``.

    >>> tensor_type([4, Ix.atom("%n")], "f16"), tensor_type([], "i1")
    ('tensor<4x?xf16>', 'tensor<i1>')
    """
    dims = ["?" if not Ix.of(s).is_const else str(Ix.of(s).value) for s in shape]
    return f"tensor<{'x'.join([*dims, elt])}>"


@dataclass(frozen=True)
class TensorVal:
    """A tensor SSA value: its shape and element type, and the global index of its first
    element per axis (zeros for a whole tensor, a tile's corner for one iteration's tile)."""

    ssa: str
    shape: tuple[Ix, ...]
    elt: str
    origin: tuple[Ix, ...] = ()

    def __post_init__(self) -> None:
        if not self.origin:
            object.__setattr__(self, "origin", tuple(Ix(0) for _ in self.shape))

    @property
    def type(self) -> str:
        return tensor_type(self.shape, self.elt)

    def renamed(self, ssa: str) -> TensorVal:
        return TensorVal(ssa, self.shape, self.elt, self.origin)


#: dim -> (start, size) in elements of the whole op's iteration space
IxBox = dict[str, tuple[Ix, Ix]]
#: per tensor axis: (start, extent, literal) of an access over a box
IxRegion = list[tuple[Ix, Ix, bool]]


@dataclass(frozen=True)
class Slice:
    """An operand read over a box: the sliced value, its type, and its indexing map results."""

    ssa: str
    type: str
    elt: str
    results: list[str]

    @staticmethod
    def of(val: TensorVal, results: list[str]) -> Slice:
        return Slice(val.ssa, val.type, val.elt, results)


#: tensor name -> its current value (whole tensors, or one iteration's tile)
Env = dict[str, TensorVal]


def region(access: Access, box: IxBox) -> IxRegion:
    """Per tensor axis: (start, extent, literal) of ``access`` over ``box``."""
    out = []
    for e in access.index:
        if not e.terms:
            out.append((Ix(e.const), Ix(1), True))
            continue
        lo = Ix(e.const)
        ext = Ix(1)
        for d, c in e.terms:
            lo = lo + box[d][0] * c
            ext = ext + (box[d][1] - 1) * c
        out.append((lo, ext, False))
    return out


def out_shape(op: Op, box: IxBox) -> list[Ix]:
    """The sizes of the output's non-literal axes over ``box`` (the op's parallel dims in the
    output's order)."""
    return [box[e.single_dim][1] for e in op.out.index if e.single_dim]


def out_dims(op: Op) -> list[str]:
    return [e.single_dim for e in op.out.index if e.single_dim]


def out_results(op: Op, dims: Sequence[str]) -> list[str]:
    """The output's indexing map results in a generic over ``dims``."""
    return [f"d{dims.index(d)}" for d in out_dims(op)]


def _offsets(place: IxRegion, origin: Sequence[Ix]) -> list[Ix]:
    return [lo - o for (lo, _, _), o in zip(place, origin, strict=True)]


def _at_origin(offsets: Sequence[Ix]) -> bool:
    return all(off.is_const and off.value == 0 for off in offsets)


def _sum_map(e: AffineExpr, dims: Sequence[str]) -> str:
    """An access's axis as an indexing map result: ``d3`` or ``d0 * 64 + d3``."""
    return " + ".join(f"d{dims.index(d)}" if c == 1 else f"d{dims.index(d)} * {c}"
                      for d, c in e.terms)


def _shape_of(ty: str) -> list[int | None]:
    """The sizes of a ranked tensor type (None for a run-time size)."""
    body = ty[len("tensor<"):-1].split("x")[:-1]
    return [None if d == "?" else int(d) for d in body]


def _radix(terms: Sequence[tuple[str, int]], box: IxBox) -> list[tuple[str, int]] | None:
    """The dims of ``terms`` outermost first with their extents, where the sum is a mixed-radix
    number over the box (each coefficient the product of the inner dims' extents, the innermost
    1, every extent static, no dim twice), else None.

    >>> _radix([("k", 1), ("s", 64)], {"s": (Ix(0), Ix(4)), "k": (Ix(0), Ix(64))})
    [('s', 4), ('k', 64)]
    >>> _radix([("k", 1), ("s", 64)], {"s": (Ix(0), Ix(4)), "k": (Ix(0), Ix(60))}) is None
    True
    """
    if len({d for d, _ in terms}) != len(terms) or any(not box[d][1].is_const for d, _ in terms):
        return None
    order = sorted(terms, key=lambda t: -t[1])
    stride = 1
    for d, c in reversed(order):
        if c != stride:
            return None
        stride *= box[d][1].value
    return [(d, box[d][1].value) for d, _ in order]


#: a term of an indexing map result as ``read`` writes it: ``d3`` or ``d3 * 64``
_TERM = re.compile(r"d(\d+)(?: \* -?\d+)?")
_DIM = re.compile(r"d(\d+)")


def iree_safe_map(results: Sequence[str]) -> bool:
    """Whether IREE 3.13 can take an input indexing map with these results wherever its
    fusions put it.

    iree-compile 3.13 crashes (a segfault in dispatch annotation: ``AnnotateDispatchesPass``
    summarizes a dispatch with ``linalg::inferConvolutionDims``) on a ``linalg.generic`` with
    two inputs and one output whose first input's map has a result that is a sum where only
    one side of the outermost ``+`` is a dim or a dim times a constant: a sum of three or more
    terms (``d0 * 64 + d2 * 32 + d3`` is ``(d0 * 64 + d2 * 32) + d3``), or of two terms one of
    whose dims the map uses again. The convolution matcher then takes that dim for a convolved
    dim without its pair and reads a null stride for it. Elementwise fusion can move any
    operand's map into that place (a one-input op reading such a sum fused into a two-input
    consumer), so the renderer writes no such map at all (``generic``). Safe: every result one
    term, or two terms over dims the map uses nowhere else.
    """
    used: Counter[str] = Counter()
    sums = []
    for r in results:
        terms = [_TERM.fullmatch(t) for t in r.split(" + ")]
        if not all(terms):
            return False  # not a form read writes: assume the worst
        dims = [t.group(1) for t in terms if t is not None]
        used.update(dims)
        sums.append(dims)
    return all(len(t) == 1 or (len(t) == 2 and all(used[d] == 1 for d in t)) for t in sums)


# -- a thread's slice --------------------------------------------------------------------------

def slice_of(blk: Block, n: IxLike, per: int, split: int, s: IxLike, stem: str = "s"
             ) -> tuple[Ix, Ix]:
    """(start, size) of slice ``s`` of a dim of ``n`` elements cut into ``split`` slices of
    whole units of ``per`` elements, larger slices first (``plans.views.dim_slices``);
    ``stem`` names the index values it makes."""
    n, s = Ix.of(n), Ix.of(s)
    if split == 1:
        return Ix(0), n
    if s.is_const:
        if not n.is_const:
            return _slice_general(blk, n, per, split, s, stem)
        lo, hi = dim_slices(n.value, per, split)[s.value]
        return Ix(lo), Ix(hi - lo)
    if n.is_const:
        sizes = [hi - lo for lo, hi in dim_slices(n.value, per, split)]
        if len(set(sizes)) == 1:  # even: static sizes
            return s * sizes[0], Ix(sizes[0])
        units = -(-n.value // per)
        base, extra = divmod(units, split)
        if base > 0:  # every slice holds units; only the last can be short (a padded unit)
            if extra == 0:
                start = s * (per * base)
                return start, blk.min([Ix(per * base), n - start], f"{stem}_len")
            start = blk.min([s * (per * (base + 1)), s * (per * base) + per * extra],
                            f"{stem}_lo")
            units_s = per * (base + 1) - (s + (split - extra)).floordiv(split) * per
            return start, blk.min([units_s, n - start], f"{stem}_len")
    return _slice_general(blk, n, per, split, s, stem)


def _slice_general(blk: Block, n: Ix, per: int, split: int, s: Ix, stem: str
                   ) -> tuple[Ix, Ix]:
    # slices of a run-time size: start = min(per * (s * base + min(s, extra)), n)
    units = n.ceildiv(per)
    base, extra = units.floordiv(split), units.mod(split)
    lo_units = blk.mul(s, base) + blk.min([s, extra], f"{stem}_extra")
    hi_units = blk.mul(s + 1, base) + blk.min([s + 1, extra], f"{stem}_extra")
    start = blk.min([lo_units * per, n], f"{stem}_lo")
    stop = blk.min([hi_units * per, n], f"{stem}_hi")
    return start, stop - start


def thread_slice(blk: Block, tile: tuple[Ix, Ix], per: int, split: int, iv: str | None
                 ) -> tuple[Ix, Ix]:
    """The part of ``tile`` (start, size) the thread ``iv`` of ``split`` takes."""
    start, size = tile
    if split == 1 or iv is None:
        return start, size
    lo, n = slice_of(blk, size, per, split, Ix.atom(iv), iv[1:])
    return start + lo, n


def thread_ids(blk: Block, inner: Block, op: Op, split_dims: Sequence[str],
               splits: Mapping[str, int], linear: bool) -> tuple[dict[str, str], str]:
    """Each split dim's thread id and the forall's ``(ids) in (counts)``. ``linear`` (shared
    outputs of a run-time size) makes a grid of several dims one id over all its threads, each
    dim's id an ``affine.apply`` of it in the thread body ``inner``: IREE cannot size a dynamic
    tensor that nested loops carry, as a forall of several dims lowered to loops would."""
    ivs = {d: blk.fresh(f"{op.name}_{d}") for d in split_dims}
    if not linear or len(split_dims) < 2:
        return ivs, (f"({', '.join(ivs.values())}) in "
                     f"({', '.join(str(splits[d]) for d in split_dims)})")
    core = blk.fresh(f"{op.name}_core")
    stride = 1
    for d in reversed(split_dims):
        at = Ix.atom(core).floordiv(stride)
        if d != split_dims[0]:
            at = at.mod(splits[d])
        inner.emit(f"{ivs[d]} = affine.apply {affine_map(1, [at.render({core: 'd0'})])}"
                   f"({core})")
        blk.builder.defs[ivs[d]] = lambda env, at=at: at.evaluate(env)
        stride *= splits[d]
    return ivs, f"({core}) in ({stride})"


def forall(blk: Block, head: str, grid: str, shared: Sequence[tuple[str, TensorVal]],
           body: Block, inserts: Block, mapping: str) -> None:
    """An ``scf.forall`` over ``grid`` (``head`` its results) sharing each ``(name, init)`` of
    ``shared``: the thread's ``body``, then its ``inserts`` in ``scf.forall.in_parallel``;
    ``mapping`` follows the region."""
    text = ", ".join(f"{name} = {init.ssa}" for name, init in shared)
    types = ", ".join(init.type for _, init in shared)
    blk.emit(f"{head} = scf.forall {grid} shared_outs({text}) -> ({types}) {{")
    blk.extend(body)
    blk.emit(f"{INDENT}scf.forall.in_parallel {{")
    blk.extend(inserts)
    blk.emit(f"{INDENT}}}")
    blk.emit("}" + mapping)


# -- tensors, read and written over boxes ------------------------------------------------------

def empty(blk: Block, stem: str, shape: Sequence[Ix], elt: str, origin: Sequence[Ix] = ()
          ) -> TensorVal:
    dyn = [blk.value(s) for s in shape if not s.is_const]
    name = blk.fresh(f"{stem}_init")
    blk.emit(f"{name} = tensor.empty({', '.join(dyn)}) : {tensor_type(shape, elt)}")
    return TensorVal(name, tuple(shape), elt, tuple(origin))


def filled(blk: Block, stem: str, shape: Sequence[Ix], elt: str, value: float) -> TensorVal:
    e = empty(blk, stem, shape, elt)
    c = blk.const(value, elt)
    name = blk.fresh(f"{stem}_fill")
    blk.emit(f"{name} = linalg.fill ins({c} : {elt}) outs({e.ssa} : {e.type}) -> {e.type}")
    return e.renamed(name)


def _extract_slice(blk: Block, name: str, src: TensorVal, offsets: Sequence[Ix],
                   sizes: Sequence[Ix], stem: str, ty: str) -> None:
    offs, lens = blk.operands(offsets, f"{stem}_off"), blk.operands(sizes, f"{stem}_len")
    blk.emit(f"{name} = tensor.extract_slice {src.ssa}[{offs}][{lens}]"
             f"[{', '.join('1' for _ in sizes)}] : {src.type} to {ty}")


def read(blk: Block, val: TensorVal, access: Access, box: IxBox, dims: Sequence[str],
         split: frozenset[str] = frozenset()) -> Slice:
    """``access`` of ``val`` over ``box`` as an operand of a generic over ``dims``: the slice it
    reads (the whole value where that is all of it) and its map; a sum over a split-K partial's
    slice dim (in ``split``) read expanded where it can be (``expanded``)."""
    place = region(access, box)
    offsets = _offsets(place, val.origin)
    sizes = [ext for _, ext, _ in place]
    keep = [not lit for _, _, lit in place]
    results = [_sum_map(e, dims) for e, k in zip(access.index, keep, strict=True) if k]
    whole = all(keep) and _at_origin(offsets) and all(
        s == v for s, v in zip(sizes, val.shape, strict=True))
    if whole:
        return expanded(blk, Slice.of(val, results), access, box, dims, split)
    ty = tensor_type([s for s, k in zip(sizes, keep, strict=True) if k], val.elt)
    name = blk.fresh(f"{access.tensor}_s")
    _extract_slice(blk, name, val, offsets, sizes, symbol_name(access.tensor), ty)
    return expanded(blk, Slice(name, ty, val.elt, results), access, box, dims, split)


def expanded(blk: Block, s: Slice, access: Access, box: IxBox, dims: Sequence[str],
             split: frozenset[str]) -> Slice:
    """Read ``s`` through a ``tensor.expand_shape`` (a view) where an axis is indexed by a
    mixed-radix sum that tiles it exactly (``slice * K/f + k_in``, k_in over all K/f): the
    axis becomes one axis per term and the map a plain projection. IREE's llvm-cpu runs the
    sum form of a split-K partial 4-20x slower than no split, and its CUDA codegen cannot pack
    the sum's reduction at all; other sums (uneven slices, run-time sizes, a padded stick's
    tile) keep the sum, and so do sums of other ops (a head's ``128*h + d``): those IREE takes
    as they are."""
    if not split:
        return s
    axes = [e for e in access.index if e.terms]  # the slice's axes, in order
    groups: list[list[int]] = []
    shape: list[int] = []
    results: list[str] = []
    changed = False
    for e, size in zip(axes, _shape_of(s.type), strict=True):
        cut = any(d in split for d, _ in e.terms)
        radix = _radix(e.terms, box) if size is not None and cut else None
        if radix is None or len(radix) < 2 or math.prod(n for _, n in radix) != size:
            groups.append([len(shape)])
            shape.append(size if size is not None else -1)
            results.append(_sum_map(e, dims))
            continue
        changed = True
        groups.append(list(range(len(shape), len(shape) + len(radix))))
        shape.extend(n for _, n in radix)
        results.extend(f"d{dims.index(d)}" for d, _ in radix)
    if not changed or -1 in shape:
        return s
    ty = tensor_type(shape, s.elt)
    name = blk.fresh(f"{access.tensor}_x")
    blk.emit(f"{name} = tensor.expand_shape {s.ssa} {groups} output_shape "
             f"[{', '.join(str(n) for n in shape)}] : {s.type} into {ty}")
    return Slice(name, ty, s.elt, results)


def region_val(blk: Block, val: TensorVal, access: Access, box: IxBox) -> TensorVal:
    """The region ``access`` reads of ``val`` over ``box``, every axis kept (a literal index
    one element), as a tensor whose origin is the region's corner."""
    place = region(access, box)
    offsets = _offsets(place, val.origin)
    sizes = tuple(ext for _, ext, _ in place)
    if _at_origin(offsets) and sizes == val.shape:
        return val
    out = TensorVal(blk.fresh(f"{access.tensor}_r"), sizes, val.elt,
                    tuple(lo for lo, _, _ in place))
    _extract_slice(blk, out.ssa, val, offsets, sizes, symbol_name(access.tensor), out.type)
    return out


def extract_out(blk: Block, dest: TensorVal, place: IxRegion, stem: str) -> TensorVal:
    """The slice of ``dest`` a piece over ``place`` overwrites (literal axes dropped)."""
    offsets = _offsets(place, dest.origin)
    sizes = [ext for _, ext, _ in place]
    kept = tuple(s for s, (_, _, lit) in zip(sizes, place, strict=True) if not lit)
    if _at_origin(offsets) and tuple(sizes) == dest.shape and len(kept) == len(sizes):
        return dest
    out = TensorVal(blk.fresh(f"{stem}_o"), kept, dest.elt)
    _extract_slice(blk, out.ssa, dest, offsets, sizes, symbol_name(stem), out.type)
    return out


def insert(blk: Block, piece: TensorVal, dest: TensorVal, place: IxRegion, parallel: bool
           ) -> TensorVal:
    """``piece`` written into ``dest`` over ``place``: a ``tensor.insert_slice`` (the new value
    of ``dest``), or in an ``scf.forall.in_parallel`` region a
    ``tensor.parallel_insert_slice``."""
    offsets = _offsets(place, dest.origin)
    sizes = [ext for _, ext, _ in place]
    if piece.ssa == dest.ssa:
        return dest
    if not parallel and _at_origin(offsets) and tuple(sizes) == dest.shape and \
            piece.shape == dest.shape:
        return dest.renamed(piece.ssa)
    stem = symbol_name(dest.ssa[1:])
    # scf.forall.in_parallel holds only the inserts: offsets go in the thread's body
    at = blk.parent if parallel and blk.parent is not None else blk
    offs, lens = at.operands(offsets, f"{stem}_off"), at.operands(sizes, f"{stem}_len")
    text = (f"{piece.ssa} into {dest.ssa}[{offs}][{lens}]"
            f"[{', '.join('1' for _ in sizes)}] : {piece.type} into {dest.type}")
    if parallel:
        blk.emit(f"tensor.parallel_insert_slice {text}")
        return dest
    name = blk.fresh(dest.ssa[1:].split("_init")[0])
    blk.emit(f"{name} = tensor.insert_slice {text}")
    return dest.renamed(name)


# -- linalg.generic ----------------------------------------------------------------------------

#: a generic's body: (block, input arguments, output arguments) -> the values it yields
Body = Callable[[Block, list[str], list[str]], list[str]]


def generic(blk: Block, dims: Sequence[str], sizes: Mapping[str, Ix], reductions: Sequence[str],
            ins: list[Slice], outs: list[TensorVal], results: list[str], body: Body, stem: str
            ) -> list[TensorVal]:
    """A ``linalg.generic`` over ``dims`` writing ``outs`` through the map ``results``;
    ``body(block, in_args, out_args)`` returns the yielded values. Dims no operand indexes
    alone get a shape-only operand."""
    n = len(dims)
    # IREE 3.13 crashes on some sums in indexing maps (see iree_safe_map): such an operand is
    # read through a gather into a tensor with one axis per dim, with a plain map
    ins = [s if iree_safe_map(s.results) else gathered(blk, dims, sizes, s) for s in ins]
    maps = [s.results for s in ins] + [results for _ in outs]
    pure = {r for m in maps for r in m}
    n_ins = len(ins)
    for i, d in enumerate(dims):
        if f"d{i}" not in pure:
            ins.append(Slice.of(empty(blk, f"range_{d}", [sizes[d]], "i8"), [f"d{i}"]))
    all_maps = [s.results for s in ins] + [results for _ in outs]
    iters = ", ".join('"reduction"' if d in reductions else '"parallel"' for d in dims)
    maps_text = ", ".join(affine_map(n, m) for m in all_maps)
    res = blk.fresh(stem)
    head = f"{res}:{len(outs)}" if len(outs) > 1 else res
    ins_text = (f" ins({', '.join(s.ssa for s in ins)} : "
                f"{', '.join(s.type for s in ins)})") if ins else ""
    out_types = ", ".join(o.type for o in outs)
    blk.emit(f"{head} = linalg.generic {{indexing_maps = [{maps_text}], iterator_types = "
             f"[{iters}]}}{ins_text} outs({', '.join(o.ssa for o in outs)} : {out_types}) {{")
    inner = blk.child()
    in_args = [inner.fresh("in") for _ in ins]
    out_args = [inner.fresh("out") for _ in outs]
    header = ", ".join(f"{a}: {s.elt}" for a, s in zip(in_args, ins, strict=True))
    header += (", " if ins else "") + ", ".join(
        f"{a}: {o.elt}" for a, o in zip(out_args, outs, strict=True))
    blk.emit(f"^bb0({header}):")
    yields = body(inner, in_args[:n_ins], out_args)
    blk.extend(inner)
    blk.emit(f"{INDENT}linalg.yield {', '.join(yields)} : {', '.join(o.elt for o in outs)}")
    blk.emit(f"}} -> {out_types if len(outs) == 1 else f'({out_types})'}")
    names = [res] if len(outs) == 1 else [f"{res}#{i}" for i in range(len(outs))]
    return [o.renamed(nm) for o, nm in zip(outs, names, strict=True)]


def elementwise(blk: Block, vals: Sequence[TensorVal], out: TensorVal, body: Body, stem: str
                ) -> TensorVal:
    """A generic over the axes of ``vals`` (of one shape, ``out``'s) reading each at the point
    it writes."""
    ident = [f"d{i}" for i in range(len(vals[0].shape))]
    sizes = {f"p{i}": n for i, n in enumerate(vals[0].shape)}
    return generic(blk, list(sizes), sizes, [], [Slice.of(v, ident) for v in vals], [out],
                   ident, body, stem)[0]


def gathered(blk: Block, dims: Sequence[str], sizes: Mapping[str, Ix], s: Slice) -> Slice:
    """Operand ``s`` of a generic over ``dims`` copied into a tensor with one axis per dim its
    map uses (in the order of ``dims``) by a ``tensor.extract`` at the map's index, and read
    back through a projection. The copy has no input map, so IREE's fusions cannot give the
    consumer the sum back (an elementwise copy reading through the sum fuses into the consumer
    and crashes it again)."""
    used = sorted({int(i) for r in s.results for i in _DIM.findall(r)})
    local = {i: k for k, i in enumerate(used)}
    exprs = [_DIM.sub(lambda m: f"d{local[int(m.group(1))]}", r) for r in s.results]
    names = [dims[i] for i in used]
    stem = f"{s.ssa[1:]}_g"
    init = empty(blk, stem, [sizes[d] for d in names], s.elt)

    def body(b: Block, args: list[str], outs: list[str]) -> list[str]:
        idx = [b.linalg_index(k, f"i{k}") for k in range(len(used))]
        at = []
        for e in exprs:
            plain = _DIM.fullmatch(e)
            if plain is not None:
                at.append(idx[int(plain.group(1))])
                continue
            a = b.fresh("at")
            b.emit(f"{a} = affine.apply {affine_map(len(used), [e])}({', '.join(idx)})")
            at.append(a)
        x = b.fresh("x")
        b.emit(f"{x} = tensor.extract {s.ssa}[{', '.join(at)}] : {s.type}")
        return [x]

    out = [f"d{k}" for k in range(len(used))]
    copy = generic(blk, names, {d: sizes[d] for d in names}, [], [], [init], out, body, stem)[0]
    return Slice.of(copy, [f"d{i}" for i in used])
