"""Tensor values of the parallel IR (``mlir.forall``) and the emitter's tensor work: a
thread's box of an op, operands read as ``tensor.extract_slice`` over their bounding box,
pieces written back with ``tensor.insert_slice`` or ``tensor.parallel_insert_slice``, and
``linalg.generic`` with indexing maps relative to the slices."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from apportion.errors import EmitError
from apportion.ir.op import Access, Op
from apportion.mlir.builder import INDENT, _Block, _Emitter, slice_of
from apportion.mlir.forall.sizes import Sizes
from apportion.mlir.index import Ix, IxLike, _map
from apportion.mlir.text import symbol_name
from apportion.schedule.values import Host, Launch, Loop, Schedule


def _ttype(shape: Sequence[IxLike], elt: str) -> str:
    """``tensor<4x?xf16>`` (``?`` where a size is not constant); rank 0: ``tensor<f16>``."""
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
        return _ttype(self.shape, self.elt)

    def renamed(self, ssa: str) -> TensorVal:
        return TensorVal(ssa, self.shape, self.elt, self.origin)


#: dim -> (start, size) in elements of the whole op's iteration space
Box = dict[str, tuple[Ix, Ix]]


@dataclass
class _Slice:
    """An operand read over a box: the sliced value, its type, and its indexing map results."""

    ssa: str
    type: str
    elt: str
    results: list[str]


def _region(access: Access, box: Box) -> list[tuple[Ix, Ix, bool]]:
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


def _shape_of(ty: str) -> list[int | None]:
    """The sizes of a ranked tensor type (None for a run-time size)."""
    body = ty[len("tensor<"):-1].split("x")[:-1]
    return [None if d == "?" else int(d) for d in body]


def _radix(terms: Sequence[tuple[str, int]], box: Box) -> list[tuple[str, int]] | None:
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


#: a term of an indexing map result as ``_Tensors.read`` writes it: ``d3`` or ``d3 * 64``
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
    consumer), so the emitter writes no such map at all (``_Tensors.generic``). Safe: every
    result one term, or two terms over dims the map uses nowhere else.
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


@dataclass
class _Carried:
    """A tensor a loop group carries in ``iter_args``: a result or an accumulator."""

    tensor: str
    op: Op
    accumulates: bool
    val: TensorVal
    init_level: int = 0


@dataclass
class _Env:
    """Tensor name -> its current value (whole tensors, or one iteration's tile)."""

    vals: dict[str, TensorVal] = field(default_factory=dict)


@dataclass(frozen=True)
class Work:
    """What the emitter reads of one op's step of the schedule: the step (a ``Launch`` over
    its cores, or a ``Host`` fallback) and the loops enclosing it, outermost first. The
    worker grid, the planning units and the dims each loop level tiles all come from it.

    >>> import apportion as ap
    >>> from apportion.schedule.lower import lower
    >>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.spyre(cores=8))
    >>> works = Work.of(lower(planned.program, planned.plan, planned.target))
    >>> w = works["add"]
    >>> w.splits, [w.tiled(level) for level in range(len(w.loops))]
    ({'m': 8, 'n': 1}, [('m',), ('n',)])
    """

    step: Launch | Host
    dims: tuple[str, ...]
    loops: tuple[Loop, ...] = ()

    @staticmethod
    def of(schedule: Schedule) -> dict[str, Work]:
        """Op name -> its work, for every launch and host step of ``schedule``."""
        out: dict[str, Work] = {}
        for s, loops in schedule.walk():
            if isinstance(s, Launch | Host):
                op = schedule.program.op(s.op)
                out[s.op] = Work(s, op.dim_names, loops)
        return out

    @property
    def splits(self) -> dict[str, int]:
        """Dim -> how many workers split it (1: none; a host step runs whole)."""
        axes = self.step.axes if isinstance(self.step, Launch) else ()
        return {d: math.prod(a.size for a in axes if a.name == d) for d in self.dims}

    @property
    def per(self) -> dict[str, int]:
        """Dim -> elements in one planning unit (the workers cut whole units)."""
        if isinstance(self.step, Host) or not self.step.units:
            return dict.fromkeys(self.dims, 1)
        return dict(zip(self.dims, self.step.units, strict=True))

    @property
    def path(self) -> tuple[int, ...]:
        """The path of the innermost loop enclosing the op (empty outside loops)."""
        return self.loops[-1].path if self.loops else ()

    def tiled(self, level: int) -> tuple[str, ...]:
        """The dims loop ``level`` (outermost 0) tiles: those its iterations move the op's
        tile along (a nonzero step)."""
        steps = self.step.steps
        if level >= len(steps):
            return ()
        return tuple(d for d, v in zip(self.dims, steps[level], strict=True) if v)


def forall_mapping(workers: str, ids: int) -> str:
    """The ``mapping`` of a forall of ``ids`` induction variables whose workers are ``workers``
    (the schedule's ``forall_mapping``, its target's), as the text after its region:
    ``gpu_blocks`` maps the worker grid onto GPU blocks (the last id ``x``; beyond three ids
    ``linear_dim_i``); a block's work runs as loops in it, so nothing maps to GPU threads.
    ``cores`` gives none (a forall's threads are the cores).

    >>> forall_mapping("gpu_blocks", 2), forall_mapping("cores", 2)
    (' {mapping = [#gpu.block<y>, #gpu.block<x>]}', '')
    """
    if workers != "gpu_blocks":
        return ""
    dims = ["x", "y", "z"][:ids] if ids <= 3 else [f"linear_dim_{i}" for i in range(ids)]
    return f" {{mapping = [{', '.join(f'#gpu.block<{d}>' for d in reversed(dims))}]}}"


class _Tensors(_Emitter):
    """The emitter of one schedule's function: the tensors it reads and writes over boxes."""

    def __init__(self, schedule: Schedule) -> None:
        super().__init__()
        self.schedule = schedule
        self.program = program = schedule.program
        self.works = Work.of(schedule)
        ran = [s.op for s in schedule.ops]
        if ran != [o.name for o in program.ops]:
            raise EmitError(f"schedule of {program.name!r} runs ops {ran}, not the program's "
                            f"{[o.name for o in program.ops]} in order")
        #: every op dim and tensor axis as an index expression (run-time sizes: see
        #: ``mlir.forall.sizes``)
        self.sizes = Sizes(program)

    def work(self, op: Op) -> Work:
        """``op``'s step of the schedule (and the loops around it)."""
        found = self.works.get(op.name)
        if found is None:
            raise EmitError(f"op {op.name!r}: the schedule of {self.program.name!r} runs no "
                            "such op")
        return found

    def slice_dims(self, op: Op) -> frozenset[str]:
        """The slice dims of ``op`` where it is a split-K partial (its launch's ``split_k``; the
        split names the cut dims, the partial's output leads with their slice dims): the sums
        they index are read expanded (``expanded``)."""
        found = self.works.get(op.name)
        step = found.step if found is not None else None
        split = step.split_k if isinstance(step, Launch) else None
        if split is None:
            return frozenset()
        # the partial writes [slices..., ...output dims]: one slice dim per cut dim, leading
        return frozenset(e.single_dim for e in op.out.index[:len(split.dims)] if e.single_dim)

    def dtype(self, tensor: str) -> str:
        return self.program.tensor(tensor).dtype

    # -- tensors ----------------------------------------------------------------------------

    def empty(self, blk: _Block, stem: str, shape: Sequence[Ix], elt: str,
              origin: Sequence[Ix] = ()) -> TensorVal:
        dyn = [blk.value(s) for s in shape if not s.is_const]
        name = blk.fresh(f"{stem}_init")
        blk.emit(f"{name} = tensor.empty({', '.join(dyn)}) : {_ttype(shape, elt)}")
        return TensorVal(name, tuple(shape), elt, tuple(origin))

    def filled(self, blk: _Block, stem: str, shape: Sequence[Ix], elt: str, value: float
               ) -> TensorVal:
        e = self.empty(blk, stem, shape, elt)
        c = blk.const(value, elt)
        name = blk.fresh(f"{stem}_fill")
        blk.emit(f"{name} = linalg.fill ins({c} : {elt}) outs({e.ssa} : {e.type}) -> {e.type}")
        return e.renamed(name)

    def thread_ids(self, blk: _Block, inner: _Block, op: Op, split_dims: Sequence[str],
                   splits: Mapping[str, int], linear: bool) -> tuple[dict[str, str], str]:
        """Each split dim's thread id and the forall's ``(ids) in (counts)``. ``linear``
        (shared outputs of a run-time size) makes a grid of several dims one id over all its
        threads, each dim's id an ``affine.apply`` of it in the thread body ``inner``: IREE
        cannot size a dynamic tensor that nested loops carry, as a forall of several dims
        lowered to loops would."""
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
            inner.emit(f"{ivs[d]} = affine.apply {_map(1, [at.render({core: 'd0'})])}({core})")
            self.defs[ivs[d]] = lambda env, at=at: at.evaluate(env)
            stride *= splits[d]
        return ivs, f"({core}) in ({stride})"

    def mapping(self, grid: str) -> str:
        """What follows the region of the forall over ``grid`` (``(%a, %b) in (2, 4)``): its
        ``mapping`` where the schedule's target gives one (``forall_mapping``)."""
        return forall_mapping(self.schedule.forall_mapping,
                              grid.split(" in ")[0].count(",") + 1)

    def thread_slice(self, blk: _Block, tile: tuple[Ix, Ix], per: int, split: int,
                     iv: str | None) -> tuple[Ix, Ix]:
        start, size = tile
        if split == 1 or iv is None:
            return start, size
        lo, n = slice_of(blk, size, per, split, Ix.atom(iv), iv[1:])
        return start + lo, n

    # -- reading and writing slices ---------------------------------------------------------

    def read(self, blk: _Block, val: TensorVal, access: Access, box: Box, dims: Sequence[str],
             split: frozenset[str] = frozenset()) -> _Slice:
        """``access`` of ``val`` over ``box`` as an operand of a generic over ``dims``: the
        slice it reads (the whole value where that is all of it) and its map; a sum over a
        split-K partial's slice dim (in ``split``) read expanded where it can be
        (``expanded``)."""
        region = _region(access, box)
        offsets = [lo - o for (lo, _, _), o in zip(region, val.origin, strict=True)]
        sizes = [ext for _, ext, _ in region]
        keep = [not lit for _, _, lit in region]
        results = []
        for e, k in zip(access.index, keep, strict=True):
            if k:
                terms = [f"d{dims.index(d)}" if c == 1 else f"d{dims.index(d)} * {c}"
                         for d, c in e.terms]
                results.append(" + ".join(terms))
        whole = all(k for k in keep) and all(
            off.is_const and off.value == 0 for off in offsets) and all(
            s == v for s, v in zip(sizes, val.shape, strict=True))
        if whole:
            return self.expanded(blk, _Slice(val.ssa, val.type, val.elt, results),
                                 access, box, dims, split)
        kept = [s for s, k in zip(sizes, keep, strict=True) if k]
        ty = _ttype(kept, val.elt)
        name = blk.fresh(f"{access.tensor}_s")
        stem = symbol_name(access.tensor)
        offs, lens = self.list(blk, offsets, f"{stem}_off"), self.list(blk, sizes, f"{stem}_len")
        blk.emit(f"{name} = tensor.extract_slice {val.ssa}[{offs}][{lens}]"
                 f"[{', '.join('1' for _ in sizes)}] : {val.type} to {ty}")
        return self.expanded(blk, _Slice(name, ty, val.elt, results), access, box, dims, split)

    def expanded(self, blk: _Block, s: _Slice, access: Access, box: Box, dims: Sequence[str],
                 split: frozenset[str]) -> _Slice:
        """Read ``s`` through a ``tensor.expand_shape`` (a view) where an axis is indexed by a
        mixed-radix sum that tiles it exactly (``slice * K/f + k_in``, k_in over all K/f): the
        axis becomes one axis per term and the map a plain projection. IREE's llvm-cpu runs
        the sum form of a split-K partial 4-20x slower than no split, and its CUDA codegen
        cannot pack the sum's reduction at all; other sums (uneven slices, run-time sizes, a
        padded stick's tile) keep the sum, and so do sums of other ops (a head's ``128*h + d``):
        those IREE takes as they are."""
        if not split:
            return s
        axes = [e for e in access.index if e.terms]  # the slice's axes, in order
        shape = _shape_of(s.type)
        groups: list[list[int]] = []
        out_shape: list[int] = []
        results: list[str] = []
        changed = False
        for e, size in zip(axes, shape, strict=True):
            cut = any(d in split for d, _ in e.terms)
            radix = _radix(e.terms, box) if size is not None and cut else None
            if radix is None or len(radix) < 2 or math.prod(n for _, n in radix) != size:
                groups.append([len(out_shape)])
                out_shape.append(size if size is not None else -1)
                results.append(" + ".join(f"d{dims.index(d)}" if c == 1 else
                                          f"d{dims.index(d)} * {c}" for d, c in e.terms))
                continue
            changed = True
            groups.append(list(range(len(out_shape), len(out_shape) + len(radix))))
            out_shape.extend(n for _, n in radix)
            results.extend(f"d{dims.index(d)}" for d, _ in radix)
        if not changed or -1 in out_shape:
            return s
        ty = _ttype([Ix(n) for n in out_shape], s.elt)
        name = blk.fresh(f"{access.tensor}_x")
        blk.emit(f"{name} = tensor.expand_shape {s.ssa} {groups} output_shape "
                 f"[{', '.join(str(n) for n in out_shape)}] : {s.type} into {ty}")
        return _Slice(name, ty, s.elt, results)

    def region_val(self, blk: _Block, val: TensorVal, access: Access, box: Box) -> TensorVal:
        """The region ``access`` reads of ``val`` over ``box``, every axis kept (a literal
        index one element), as a tensor whose origin is the region's corner."""
        region = _region(access, box)
        offsets = [lo - o for (lo, _, _), o in zip(region, val.origin, strict=True)]
        sizes = tuple(ext for _, ext, _ in region)
        if all(off.is_const and off.value == 0 for off in offsets) and sizes == val.shape:
            return val
        name = blk.fresh(f"{access.tensor}_r")
        stem = symbol_name(access.tensor)
        offs, lens = self.list(blk, offsets, f"{stem}_off"), self.list(blk, sizes, f"{stem}_len")
        out = TensorVal(name, sizes, val.elt, tuple(lo for lo, _, _ in region))
        blk.emit(f"{name} = tensor.extract_slice {val.ssa}[{offs}][{lens}]"
                 f"[{', '.join('1' for _ in sizes)}] : {val.type} to {out.type}")
        return out

    def list(self, blk: _Block, items: Sequence[Ix], stem: str = "ix") -> str:
        return ", ".join(blk.operand(i, stem) for i in items)

    def out_region(self, op: Op, box: Box) -> list[tuple[Ix, Ix, bool]]:
        return _region(op.out, box)

    def out_shape(self, op: Op, box: Box) -> list[Ix]:
        """The sizes of the output's non-literal axes over ``box`` (the op's parallel dims in the
        output's order)."""
        return [box[e.single_dim][1] for e in op.out.index if e.single_dim]

    def out_dims(self, op: Op) -> list[str]:
        return [e.single_dim for e in op.out.index if e.single_dim]

    def extract_out(self, blk: _Block, dest: TensorVal, region: list[tuple[Ix, Ix, bool]],
                    stem: str) -> TensorVal:
        """The slice of ``dest`` a piece over ``region`` overwrites (literal axes dropped)."""
        offsets = [lo - o for (lo, _, _), o in zip(region, dest.origin, strict=True)]
        sizes = [ext for _, ext, _ in region]
        kept = tuple(s for s, (_, _, lit) in zip(sizes, region, strict=True) if not lit)
        if all(off.is_const and off.value == 0 for off in offsets) and tuple(sizes) == \
                dest.shape and len(kept) == len(sizes):
            return dest
        name = blk.fresh(f"{stem}_o")
        ty = _ttype(kept, dest.elt)
        stem = symbol_name(stem)
        offs, lens = self.list(blk, offsets, f"{stem}_off"), self.list(blk, sizes, f"{stem}_len")
        blk.emit(f"{name} = tensor.extract_slice {dest.ssa}[{offs}][{lens}]"
                 f"[{', '.join('1' for _ in sizes)}] : {dest.type} to {ty}")
        return TensorVal(name, kept, dest.elt)

    def insert(self, blk: _Block, piece: TensorVal, dest: TensorVal,
               region: list[tuple[Ix, Ix, bool]], parallel: bool) -> TensorVal:
        offsets = [lo - o for (lo, _, _), o in zip(region, dest.origin, strict=True)]
        sizes = [ext for _, ext, _ in region]
        if piece.ssa == dest.ssa:
            return dest
        if not parallel and all(off.is_const and off.value == 0 for off in offsets) and \
                tuple(sizes) == dest.shape and piece.shape == dest.shape:
            return dest.renamed(piece.ssa)
        stem = symbol_name(dest.ssa[1:])
        # scf.forall.in_parallel holds only the inserts: offsets go in the thread's body
        at = blk.parent if parallel and blk.parent is not None else blk
        offs, lens = self.list(at, offsets, f"{stem}_off"), self.list(at, sizes, f"{stem}_len")
        text = (f"{piece.ssa} into {dest.ssa}[{offs}][{lens}]"
                f"[{', '.join('1' for _ in sizes)}] : {piece.type} into {dest.type}")
        if parallel:
            blk.emit(f"tensor.parallel_insert_slice {text}")
            return dest
        name = blk.fresh(dest.ssa[1:].split("_init")[0])
        blk.emit(f"{name} = tensor.insert_slice {text}")
        return dest.renamed(name)

    def parallel_insert(self, blk: _Block, piece: TensorVal, dest: TensorVal,
                        region: list[tuple[Ix, Ix, bool]]) -> None:
        self.insert(blk, piece, dest, region, parallel=True)

    # -- linalg.generic ---------------------------------------------------------------------

    def generic(self, blk: _Block, dims: Sequence[str], sizes: Mapping[str, Ix],
                reductions: Sequence[str], ins: list[_Slice], outs: list[TensorVal],
                out_results: list[str], body: Callable[[_Block, list[str], list[str]],
                                                      list[str]], stem: str) -> list[TensorVal]:
        """A ``linalg.generic`` over ``dims``; ``body(block, in_args, out_args)`` returns the
        yielded values. Dims no operand indexes alone get a shape-only operand."""
        n = len(dims)
        # IREE 3.13 crashes on some sums in indexing maps (see iree_safe_map): such an operand
        # is read through a gather into a tensor with one axis per dim, with a plain map
        ins = [s if iree_safe_map(s.results) else self.gathered(blk, dims, sizes, s)
               for s in ins]
        maps = [s.results for s in ins] + [out_results for _ in outs]
        pure = {r for m in maps for r in m}
        n_ins = len(ins)
        for i, d in enumerate(dims):
            if f"d{i}" not in pure:
                shape = self.empty(blk, f"range_{d}", [sizes[d]], "i8")
                ins.append(_Slice(shape.ssa, shape.type, "i8", [f"d{i}"]))
        all_maps = [s.results for s in ins] + [out_results for _ in outs]
        iters = ", ".join('"reduction"' if d in reductions else '"parallel"' for d in dims)
        maps_text = ", ".join(_map(n, m) for m in all_maps)
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
        blk.emit(f"{INDENT}linalg.yield {', '.join(yields)} : "
                 f"{', '.join(o.elt for o in outs)}")
        blk.emit(f"}} -> {out_types if len(outs) == 1 else f'({out_types})'}")
        names = [res] if len(outs) == 1 else [f"{res}#{i}" for i in range(len(outs))]
        return [o.renamed(nm) for o, nm in zip(outs, names, strict=True)]

    def gathered(self, blk: _Block, dims: Sequence[str], sizes: Mapping[str, Ix], s: _Slice
                 ) -> _Slice:
        """Operand ``s`` of a generic over ``dims`` copied into a tensor with one axis per dim
        its map uses (in the order of ``dims``) by a ``tensor.extract`` at the map's index, and
        read back through a projection. The copy has no input map, so IREE's fusions cannot
        give the consumer the sum back (an elementwise copy reading through the sum fuses into
        the consumer and crashes it again)."""
        used = sorted({int(i) for r in s.results for i in _DIM.findall(r)})
        local = {i: k for k, i in enumerate(used)}
        exprs = [_DIM.sub(lambda m: f"d{local[int(m.group(1))]}", r) for r in s.results]
        names = [dims[i] for i in used]
        stem = f"{s.ssa[1:]}_g"
        init = self.empty(blk, stem, [sizes[d] for d in names], s.elt)

        def body(b: _Block, args: list[str], outs: list[str]) -> list[str]:
            idx = []
            for k in range(len(used)):
                i = b.fresh(f"i{k}")
                b.emit(f"{i} = linalg.index {k} : index")
                idx.append(i)
            at = []
            for e in exprs:
                plain = _DIM.fullmatch(e)
                if plain is not None:
                    at.append(idx[int(plain.group(1))])
                    continue
                a = b.fresh("at")
                b.emit(f"{a} = affine.apply {_map(len(used), [e])}({', '.join(idx)})")
                at.append(a)
            x = b.fresh("x")
            b.emit(f"{x} = tensor.extract {s.ssa}[{', '.join(at)}] : {s.type}")
            return [x]

        out = [f"d{k}" for k in range(len(used))]
        copy = self.generic(blk, names, {d: sizes[d] for d in names}, [], [], [init], out, body,
                            stem)[0]
        return _Slice(copy.ssa, copy.type, copy.elt, [f"d{i}" for i in used])
