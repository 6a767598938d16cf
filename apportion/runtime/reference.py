"""What a program means, in numpy: ops over boxes of their iteration space, the unplanned run.

A run maps tensor names to numpy arrays (``kernels.STORAGE``: bfloat16 lives in float32 arrays
rounded to bfloat16). ``run_op_boxes`` computes every box of an op's iteration space on its
own, combines split reductions from the boxes' partials, and checks that the boxes cover the
iteration space exactly once; the reference backend (``apportion.backends.reference``) runs a
plan's schedule with it, and ``compare`` holds a run's outputs against ``run_unplanned``'s.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from apportion.errors import ExecutionError
from apportion.ir.dtypes import FLOAT_DTYPES, FLOAT_EPS, least_precise
from apportion.ir.kinds import Category
from apportion.ir.op import Access, Op
from apportion.ir.program import Program
from apportion.plans.tiles import Box
from apportion.runtime import kernels
from apportion.runtime.kernels import Partial


def random_inputs(program: Program, seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays for the program's inputs, in ranges every op accepts.

    Floats are uniform in [0.5, 1.5) (positive and non-zero: log, sqrt, div and pow stay
    finite), divided by sqrt(K) where a matmul reads the input with K reduction points, so
    that chains of matmuls stay far from float16's overflow (65504) and inf never hides a
    difference. Ints are in {1, 2, 3} (no division by zero), bools fair coin flips.

    >>> from apportion.frontend.json_format import load
    >>> sorted(random_inputs(load("examples/mlp.json")))   # doctest: +SKIP
    ['wd', 'wg', 'wu', 'x']
    """
    rng = np.random.default_rng(seed)
    volume: dict[str, int] = {}
    for op in program.ops:
        if op.category is Category.MATMUL:
            for acc in op.ins:
                volume[acc.tensor] = max(volume.get(acc.tensor, 1), _reduction_count(op))
    out: dict[str, np.ndarray] = {}
    for name in program.inputs:
        t = program.tensor(name)
        if t.dtype in FLOAT_DTYPES:
            scale = 1.0 / math.sqrt(volume.get(name, 1))
            out[name] = kernels.to_storage(rng.uniform(0.5, 1.5, t.shape) * scale, t.dtype)
        elif t.dtype == "bool":
            out[name] = rng.random(t.shape) < 0.5
        else:
            out[name] = rng.integers(1, 4, t.shape).astype(kernels.storage_dtype(t.dtype))
    return out


# --- one op over one box -------------------------------------------------------------------

def _full_box(op: Op) -> Box:
    return {d: (0, n) for d, n in op.dims}


def _check_box(op: Op, ranges: Mapping[str, tuple[int, int]]) -> Box:
    unknown = [d for d in ranges if d not in op.sizes]
    if unknown:
        raise ExecutionError(f"op {op.name!r}: box names unknown dim {unknown[0]!r}; "
                             f"dims: {', '.join(op.dim_names)}")
    box = {d: tuple(ranges.get(d, (0, n))) for d, n in op.dims}
    for d, (lo, hi) in box.items():
        if not 0 <= lo < hi <= op.sizes[d]:
            raise ExecutionError(f"op {op.name!r}: range {(lo, hi)} of dim {d!r} is empty or "
                                 f"outside 0..{op.sizes[d]}")
    return box  # type: ignore[return-value]


def _operand(op: Op, acc: Access, arr: np.ndarray, box: Box, dtype: type) -> np.ndarray:
    """The operand over the box, one axis per op dim in op order (size 1 where unused)."""
    dims = op.dim_names
    singles = [e.single_dim for e in acc.index]
    named = [s for s in singles if s is not None]
    plain = all(s is not None or not e.terms for s, e in zip(singles, acc.index, strict=True))
    if plain and len(set(named)) == len(named):
        # Plain dims and literals: basic slicing gives a view, no copy until the cast.
        view = arr[tuple(slice(*box[s]) if s else e.const
                         for s, e in zip(singles, acc.index, strict=True))]
        view = view.transpose(sorted(range(len(named)), key=lambda i: dims.index(named[i])))
        used = set(named)
        view = view[tuple(slice(None) if d in used else None for d in dims)]
    else:
        # Sums of dims (128*h+d, 11008+f): gather with index arrays that broadcast over the box.
        def coord(d: str) -> np.ndarray:
            shape = [1] * len(dims)
            shape[dims.index(d)] = box[d][1] - box[d][0]
            return np.arange(*box[d]).reshape(shape)

        view = arr[tuple(e.const + sum((c * coord(d) for d, c in e.terms), np.zeros((), int))
                         for e in acc.index)]
        view = view.reshape(view.shape + (1,) * (len(dims) - view.ndim))
    return view.astype(dtype, copy=False)


def _einsum(op: Op, operands: Sequence[np.ndarray], box: Box) -> np.ndarray:
    """Sum of products over the reduction dims, via einsum so that BLAS does big matmuls."""
    dims = op.dim_names
    if len(dims) > len(string.ascii_letters):
        raise ExecutionError(f"op {op.name!r}: {len(dims)} dims exceed einsum's letters")
    letter = dict(zip(dims, string.ascii_letters, strict=False))
    subs, arrays = [], []
    for acc, x in zip(op.ins, operands, strict=True):
        keep = [i for i, d in enumerate(dims) if d in acc.dims]
        arrays.append(x.reshape([x.shape[i] for i in keep]))
        subs.append("".join(letter[dims[i]] for i in keep))
    read = {d for acc in op.ins for d in acc.dims}
    par = op.parallel_dims
    out = "".join(letter[d] for d in par if d in read)
    res = np.einsum(f"{subs[0]},{subs[1]}->{out}", *arrays, optimize=True)
    # A reduction dim no input reads adds the same product once per point of it.
    scale = math.prod(box[d][1] - box[d][0] for d in op.reduction_dims if d not in read)
    if scale != 1:
        res = res * scale
    res = res[tuple(slice(None) if d in read else None for d in par)]
    return np.broadcast_to(res, tuple(box[d][1] - box[d][0] for d in par))


def _to_out_layout(op: Op, res: np.ndarray) -> np.ndarray:
    """From the op's parallel dims in op order to the axes of the output as written (literal
    0: size 1; a merged axis: one axis per dim, see ``Op.split_out``)."""
    par = list(op.parallel_dims)
    out_dims = [e.single_dim for e in op.split_out.index]
    res = res.transpose([par.index(d) for d in out_dims if d is not None])
    return res[tuple(slice(None) if d else None for d in out_dims)]


def _out_slice(op: Op, box: Box) -> tuple[slice, ...]:
    """The box's slice of the output as written (``split_view``)."""
    return tuple(slice(*box[e.single_dim]) if e.single_dim else slice(0, 1)
                 for e in op.split_out.index)


def split_view(op: Op, out: np.ndarray) -> np.ndarray:
    """The output array viewed as ``op`` writes it, each merged axis split into its dims (a
    reshape of a row-major array: a view, so writes through it land in ``out``)."""
    if not op.merges_output:
        return out
    view = out.reshape(op.split_shape(out.shape))
    assert np.shares_memory(view, out) or view.size == 0, "output must be contiguous"
    return view


def operand_dtypes(op: Op, program: Program) -> list[type[np.generic]]:
    """The numpy type each input of ``op`` is read as: value inputs the op's compute dtype
    (``kernels.compute_dtype``), condition inputs bools (non-zero is true), so that a float
    condition such as 0.5 stays true when the values compute in int64."""
    kind = op.kind
    values = kind.value_inputs(len(op.ins))
    dt = kernels.compute_dtype([program.tensor(op.ins[i].tensor).dtype for i in values], kind)
    return [dt if i in values else np.bool_ for i in range(len(op.ins))]


def partial_result(op: Op, program: Program, env: Mapping[str, np.ndarray], box: Box) -> Partial:
    """The raw result of ``op`` over ``box`` in the output's layout as written (a merged axis
    split, see ``Op.split_out``), before any combine.

    Reductions give the plain partial (mean: the partial sum; argmax: values and global flat
    indices); all of it in the compute dtype, not yet cast to the output dtype.
    """
    xs = [_operand(op, a, env[a.tensor], box, dt)
          for a, dt in zip(op.ins, operand_dtypes(op, program), strict=True)]
    dims = op.dim_names
    shape = tuple(box[d][1] - box[d][0] for d in dims)
    red_axes = tuple(i for i, d in enumerate(dims) if d in op.reduction_dims)
    kind = op.kind
    if kind.elementwise:
        value = kernels.pointwise(kind, *xs, attrs=dict(op.attrs))
        return _to_out_layout(op, np.broadcast_to(value, shape))
    if kind.category is Category.MATMUL:  # a sum of products: einsum, so that BLAS does it
        return _to_out_layout(op, _einsum(op, xs, box))
    if kind.reducer is None:
        raise ExecutionError(f"op {op.name!r}: a {kind.category} op has no per-box result")
    part = kernels.reduce_partial(
        kind.reducer, np.broadcast_to(xs[0], shape), red_axes,
        [box[d][0] for d in op.reduction_dims], [op.sizes[d] for d in op.reduction_dims])
    if kind.reducer.pairs:
        return _to_out_layout(op, part[0]), _to_out_layout(op, part[1])
    return _to_out_layout(op, part)


def _reduction_count(op: Op) -> int:
    return math.prod(op.sizes[d] for d in op.reduction_dims)


def _finish(op: Op, program: Program, partial: Partial) -> np.ndarray:
    value = partial if op.kind.reducer is None else \
        kernels.finish(op.kind.reducer, partial, _reduction_count(op))
    return kernels.to_storage(value, program.tensor(op.out.tensor).dtype)


def _run_whole(op: Op, program: Program, env: Mapping[str, np.ndarray]) -> np.ndarray:
    # A whole-tensor fallback (gather, reshape, constants): every input as stored, the result
    # in the output's shape
    out_t = program.tensor(op.out.tensor)
    attrs = op.kind.numeric_attrs(dict(op.attrs))
    assert op.kind.compute is not None, f"op kind {op.kind.name!r} has no semantics"
    try:
        with np.errstate(all="ignore"):
            res = np.asarray(op.kind.compute(kernels.XP, *(env[a.tensor] for a in op.ins),
                                             shape=out_t.shape, **attrs))
        res = res.reshape(out_t.shape)
    except (IndexError, ValueError, TypeError) as e:
        # an index out of range or not an integer, shapes that do not fit
        raise ExecutionError(f"op {op.name!r}: {op.kind.name} failed: {e}") from None
    return kernels.to_storage(res, out_t.dtype)


def _run_fallback(op: Op, program: Program, env: Mapping[str, np.ndarray]) -> np.ndarray:
    if op.kind.whole:
        return _run_whole(op, program, env)
    # The whole input tensor along its last axis, as stored (a fallback has no iteration-space
    # model); the result is then read through the input's index map and written through the
    # output's, so y[n,m] = sort(x[m,n]) comes out transposed.
    src = op.ins[0]
    dtype = kernels.compute_dtype([program.tensor(src.tensor).dtype], op.kind)
    res = kernels.fallback(op.kind, env[src.tensor].astype(dtype))
    by_dim = _operand(op, src, res, _full_box(op), dtype)
    out = _to_out_layout(op, by_dim.reshape([n for _, n in op.dims]))
    return kernels.to_storage(out, program.tensor(op.out.tensor).dtype)


def evaluate_op(op: Op, program: Program, env: Mapping[str, np.ndarray],
                ranges: Mapping[str, tuple[int, int]] | None = None) -> Partial:
    """``op`` over a box of its iteration space (None: all of it; a missing dim: all of it).

    Returns the output tensor's slice for the box, cast to the output dtype, when the box
    covers every reduction dim whole; otherwise the partial of ``partial_result``.

    >>> from apportion.frontend.json_format import loads
    >>> p = loads('{"tensors": {"x": {"shape": [2, 4], "dtype": "float32"}}, "inputs": ["x"],'
    ...           '"outputs": ["s"], "ops": [{"op": "sum", "out": "s[i]", "ins": ["x[i,k]"]}]}')
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> evaluate_op(p.ops[0], p, {"x": x}).tolist()
    [6.0, 22.0]
    >>> evaluate_op(p.ops[0], p, {"x": x}, {"k": (0, 2)}).tolist()   # a partial sum
    [1.0, 9.0]
    """
    if not op.kind.divisible:
        if ranges is not None and _check_box(op, ranges) != _full_box(op):
            raise ExecutionError(f"op {op.name!r}: a fallback op runs only on its whole space")
        return _run_fallback(op, program, env)
    box = _full_box(op) if ranges is None else _check_box(op, ranges)
    part = partial_result(op, program, env, box)
    if any(box[d] != (0, op.sizes[d]) for d in op.reduction_dims):
        return part
    done = _finish(op, program, part)
    if op.merges_output and box == _full_box(op):  # the whole tensor: in its own shape
        return done.reshape(program.tensor(op.out.tensor).shape)
    return done


# --- one op over a decomposition of its iteration space ------------------------------------

def check_cover(op: Op, boxes: Sequence[Box]) -> None:
    """Raise ExecutionError unless ``boxes`` cover ``op``'s iteration space exactly once."""
    dims = op.dim_names
    for i, b in enumerate(boxes):
        if set(b) != set(dims):
            raise ExecutionError(f"op {op.name!r}: core {i} box names dims {sorted(b)}, "
                                 f"expected {list(dims)}")
        _check_box(op, b)
    # rank-0 ops (all indices literal) have boxes with no dims: shape (boxes, 0)
    lo = np.array([[b[d][0] for d in dims] for b in boxes], dtype=np.int64).reshape(
        len(boxes), len(dims))
    hi = np.array([[b[d][1] for d in dims] for b in boxes], dtype=np.int64).reshape(
        len(boxes), len(dims))
    for i in range(len(boxes) - 1):
        # Boxes overlap when their ranges intersect in every dim.
        hit = np.all(np.maximum(lo[i], lo[i + 1:]) < np.minimum(hi[i], hi[i + 1:]), axis=1)
        if hit.any():
            j = i + 1 + int(np.argmax(hit))
            raise ExecutionError(f"op {op.name!r}: cores {i} and {j} both compute iteration "
                                 f"points: {boxes[i]} overlaps {boxes[j]}")
    covered = sum(math.prod(h - s for s, h in b.values()) for b in boxes)
    if covered != op.points:
        raise ExecutionError(f"op {op.name!r}: the cores cover {covered} of {op.points} "
                             "iteration points; some points are computed by no core")


def _sentinel(dtype: str) -> float | int | bool:
    # Visible garbage where no core wrote: NaN for floats, the most negative int, False.
    if dtype in FLOAT_DTYPES:
        return float("nan")
    if dtype == "bool":
        return False
    return int(np.iinfo(kernels.storage_dtype(dtype)).min)


def run_op_boxes(op: Op, program: Program, env: Mapping[str, np.ndarray],
                 boxes: Sequence[Box], pool: Executor | None = None,
                 order: Sequence[int] | None = None) -> np.ndarray:
    """Run ``op`` box by box and assemble its output tensor; boxes must tile the space exactly.

    Boxes with the same parallel ranges (a split reduction) are combined in the given order,
    then finished and cast once. ``pool`` runs the boxes concurrently; results do not depend
    on it. ``order`` (a permutation of the box indices) computes the boxes in that order, as a
    sequential schedule of a parallel loop would; partials still combine in box order. A
    tiled loop is this call with each iteration's boxes offset into the whole space.

    >>> from apportion.frontend.json_format import loads
    >>> p = loads('{"tensors": {"x": {"shape": [2, 4], "dtype": "float32"}}, "inputs": ["x"],'
    ...           '"outputs": ["s"], "ops": [{"op": "sum", "out": "s[i]", "ins": ["x[i,k]"]}]}')
    >>> x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> run_op_boxes(p.ops[0], p, {"x": x}, [{"i": (0, 2), "k": (0, 1)},
    ...                                      {"i": (0, 2), "k": (1, 4)}]).tolist()
    [6.0, 22.0]
    """
    if not op.kind.divisible:
        raise ExecutionError(f"op {op.name!r}: a fallback op runs whole, not box by box")
    check_cover(op, boxes)
    out_t = program.tensor(op.out.tensor)
    whole = np.full(out_t.shape, _sentinel(out_t.dtype),
                    dtype=kernels.storage_dtype(out_t.dtype))
    out = split_view(op, whole)
    # Reduction points each output element received; must end as the full reduction volume.
    counts = np.zeros(out.shape, dtype=np.int64)
    par = op.parallel_dims
    groups: dict[tuple[tuple[int, int], ...], int] = {}
    for b in boxes:
        key = tuple(b[d] for d in par)
        groups[key] = groups.get(key, 0) + 1
    pending: dict[tuple[tuple[int, int], ...], list[Partial]] = {}
    if order is None:
        results = zip(boxes, _map(pool, op, program, env, boxes), strict=True)
    else:
        if sorted(order) != list(range(len(boxes))):
            raise ExecutionError(f"op {op.name!r}: order {list(order)} is not a permutation of "
                                 f"the {len(boxes)} boxes")
        done = dict(zip(order, _map(pool, op, program, env, [boxes[i] for i in order]),
                        strict=True))
        results = ((b, done[i]) for i, b in enumerate(boxes))
    for box, part in results:
        key = tuple(box[d] for d in par)
        parts = pending.setdefault(key, [])
        parts.append(part)
        sl = _out_slice(op, box)
        counts[sl] += math.prod(box[d][1] - box[d][0] for d in op.reduction_dims)
        if len(parts) == groups[key]:
            out[sl] = _finish(op, program, _combine(op, parts))
            del pending[key]
    counts = counts.reshape(out_t.shape)
    bad = np.argwhere(counts != _reduction_count(op))
    if bad.size:
        at = tuple(int(i) for i in bad[0])
        raise ExecutionError(f"op {op.name!r}: output {out_t.name!r}{list(at)} received "
                             f"{int(counts[at])} of {_reduction_count(op)} reduction points "
                             f"({len(bad)} elements wrong)")
    return whole


def _combine(op: Op, parts: list[Partial]) -> Partial:
    """The partials of one output slice combined by the op's reducer (one part: as it is)."""
    if op.kind.reducer is None:
        if len(parts) != 1:
            raise ExecutionError(f"op {op.name!r}: {len(parts)} cores computed one slice of a "
                                 f"{op.category} op, which has nothing to combine")
        return parts[0]
    return kernels.combine_partials(op.kind.reducer, parts)


def _map(pool: Executor | None, op: Op, program: Program, env: Mapping[str, np.ndarray],
         boxes: Iterable[Box]) -> Iterator[Partial]:
    # In box order either way, so that combines (and float sums) run in one fixed order.
    def one(box: Box) -> Partial:
        return partial_result(op, program, env, box)

    return pool.map(one, boxes) if pool is not None else map(one, boxes)


# --- whole programs ------------------------------------------------------------------------

def bind_inputs(program: Program, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The program's inputs checked (every one given, nothing else, right shapes) and cast to
    their storage arrays."""
    extra = [n for n in inputs if n not in program.inputs]
    if extra:
        raise ExecutionError(f"{extra[0]!r} is not an input of program {program.name!r}; "
                             f"inputs: {', '.join(program.inputs)}")
    env: dict[str, np.ndarray] = {}
    for name in program.inputs:
        t = program.tensor(name)
        if name not in inputs:
            raise ExecutionError(f"input {name!r} of program {program.name!r} is missing")
        try:
            a = np.asarray(inputs[name])
        except (TypeError, ValueError) as e:  # ragged nested lists and the like
            raise ExecutionError(f"input {name!r} is not an array: {e}") from None
        if a.dtype.kind not in "biuf":  # None in an object array would compute as NaN
            raise ExecutionError(f"input {name!r} has numpy dtype {a.dtype} (kind "
                                 f"{a.dtype.kind!r}); give an array of numbers (bool, int or "
                                 f"float) for its dtype {t.dtype}")
        if a.shape != t.shape:
            raise ExecutionError(f"input {name!r} has shape {a.shape}, expected {t.shape}")
        env[name] = kernels.to_storage(a, t.dtype)
    return env


def run_unplanned(program: Program, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run every op whole, in program order; returns every tensor (inputs too) by name.

    >>> from apportion.frontend.json_format import load
    >>> p = load("examples/mlp.json")                               # doctest: +SKIP
    >>> run_unplanned(p, random_inputs(p))["y"].shape               # doctest: +SKIP
    (256, 1024)
    """
    env = bind_inputs(program, inputs)
    for op in program.ops:
        env[op.out.tensor] = evaluate_op(op, program, env)  # type: ignore[assignment]
    return env


def check_gathers(program: Program, tensors: Mapping[str, np.ndarray]) -> None:
    """Raise ExecutionError, as ``evaluate_op`` does (numpy's ``take``), for a gather index in
    ``tensors`` outside ``[-rows, rows)`` of its table: a compiled module reads a clamped row
    there, so a backend running one checks the indices before and after the run."""
    for op in program.ops:
        if op.kind.name != "gather" or op.ins[1].tensor not in tensors:
            continue
        table, ids = (program.tensor(a.tensor) for a in op.ins)
        out = program.tensor(op.out.tensor)
        n_ids = math.prod(ids.shape)
        rows = math.prod(table.shape) // max(math.prod(out.shape) // max(n_ids, 1), 1)
        flat = np.asarray(tensors[op.ins[1].tensor]).reshape(-1).astype(np.int64)
        bad = flat[(flat < -rows) | (flat >= rows)]
        if bad.size:
            raise ExecutionError(f"op {op.name!r}: gather failed: index {int(bad[0])} is out "
                                 f"of bounds for axis 0 with size {rows}")


# --- comparing runs ------------------------------------------------------------------------

@dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol + rtol * |expected|`` (np.allclose); zeros mean exact.
    ``basis`` says where the numbers come from, printed after them."""

    atol: float
    rtol: float
    basis: str = ""

    def __str__(self) -> str:
        nums = ("exact" if self.atol == self.rtol == 0 else
                f"atol={self.atol:.3g} rtol={self.rtol:.3g}")
        return f"{nums} ({self.basis})" if self.basis else nums


#: dtype -> tolerance of planned against unplanned: summation orders differ across cores, and
#: one rounding step of the output dtype (fp16 eps ~1e-3, bf16 ~8e-3) can compound along a chain
TOLERANCES: dict[str, Tolerance] = {
    "float16": Tolerance(1e-2, 1e-2),
    "bfloat16": Tolerance(5e-2, 5e-2),
    "float32": Tolerance(1e-5, 1e-4),
    "int8": Tolerance(0, 0), "int32": Tolerance(0, 0), "int64": Tolerance(0, 0),
    "bool": Tolerance(0, 0),
}


#: float32 epsilons of an output's largest finite value that any of its values may differ by,
#: besides ``TOLERANCES``' atol: a value near zero computed from larger ones (the cumsum of
#: mean-centred values, a difference of two dot products) carries their rounding, which another
#: summation order changes by a few ulps of them per term; 64 covers sums of thousands of terms,
#: while a wrong slice (missing, doubled, misplaced) is off by values of the output's own scale
FLOAT32_SCALE_EPS = 64


def planned_tolerance(dtype: str, expected: np.ndarray) -> Tolerance:
    """The tolerance of a planned run's output of ``dtype`` against the unplanned run's
    ``expected``: ``TOLERANCES``, and for float32 an atol of at least ``FLOAT32_SCALE_EPS``
    epsilons of the largest finite value of ``expected`` (named in the basis when it wins).

    >>> str(planned_tolerance("float32", np.array([0.5, -1.0])))
    'atol=1e-05 rtol=0.0001'
    >>> str(planned_tolerance("float32", np.array([26.0, 1e-4])))
    'atol=0.000198 rtol=0.0001 (atol 64 float32 eps at max |expected| 26)'
    """
    base = TOLERANCES[dtype]
    if dtype != "float32":
        return base
    e = np.abs(np.asarray(expected, dtype=np.float64))
    scale = float(e[np.isfinite(e)].max(initial=0.0))  # an inf must not excuse every value
    atol = FLOAT32_SCALE_EPS * FLOAT_EPS["float32"] * scale
    if atol <= base.atol:
        return base
    return Tolerance(atol, base.rtol, f"atol {FLOAT32_SCALE_EPS} float32 eps at max |expected| "
                                      f"{scale:.3g}")


#: machine epsilons of its least precise float dtype that an output may differ by from the
#: model it was lowered from, run eagerly in PyTorch, where that dtype is float16 or bfloat16.
#: Eager rounds each ATen op's result to the dtype; the lowered program rounds where its
#: decomposed ops do, after computing in float32, and sums in another order across cores: a
#: few roundings of values at the output's scale apart (tiny Llama and GPT-2 models in either
#: dtype differ by at most 0.9 eps times their largest output value), like the rtol of
#: torch.testing.assert_close (bfloat16 1.6e-2, float16 1e-3: one or two eps) over one op.
EAGER_EPS = 4


def eager_tolerance(program: Program, output: str, expected: np.ndarray) -> Tolerance:
    """The tolerance of ``output`` of a run of ``program`` against ``expected``, the output
    of the model ``program`` was lowered from, run eagerly in PyTorch.

    It follows the least precise float dtype among the output and every tensor it is computed
    from (bfloat16 weights feeding a float32 norm: bfloat16): for float16 and bfloat16,
    ``EAGER_EPS`` of its epsilon, relative, and absolute at the scale of the largest finite
    value of ``expected`` (a value near zero carries the rounding errors of the larger values
    it is computed from); for float32 alone and for integers, ``TOLERANCES``.

    >>> from apportion.frontend.json_format import loads
    >>> p = loads('{"format": "apportion.program/1", "name": "p", "tensors": {"x": '
    ...     '{"shape": [4], "dtype": "bfloat16"}, "y": {"shape": [4], "dtype": "float32"}}, '
    ...     '"inputs": ["x"], "outputs": ["y"], "ops": [{"name": "e", "op": "exp", '
    ...     '"out": "y[i]", "ins": ["x[i]"]}]}')
    >>> str(eager_tolerance(p, "y", np.array([0.5, -2.0, 1.0, 0.0])))
    'atol=0.0625 rtol=0.0312 (4 bfloat16 eps; atol at max |expected| 2)'
    """
    t = program.tensor(output)
    narrow = least_precise(program.tensor(n).dtype for n in _computed_from(program, output))
    if t.dtype not in FLOAT_DTYPES or narrow not in ("float16", "bfloat16"):
        return TOLERANCES[t.dtype]
    e = np.abs(np.asarray(expected, dtype=np.float64))
    scale = float(e[np.isfinite(e)].max(initial=0.0))  # an inf must not excuse every value
    eps = EAGER_EPS * FLOAT_EPS[narrow]
    return Tolerance(eps * scale, eps, f"{EAGER_EPS} {narrow} eps; atol at max |expected| "
                                       f"{scale:.3g}")


def _computed_from(program: Program, tensor: str) -> set[str]:
    """``tensor`` and every tensor it is computed from."""
    seen, todo = {tensor}, [tensor]
    while todo:
        op = program.producer(todo.pop())
        for acc in op.ins if op is not None else ():
            if acc.tensor not in seen:
                seen.add(acc.tensor)
                todo.append(acc.tensor)
    return seen


@dataclass(frozen=True)
class OutputCheck:
    """How one output of a run compares with the expected one."""

    tensor: str
    dtype: str
    max_abs_err: float
    max_rel_err: float
    tolerance: Tolerance
    ok: bool


def compare(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
            program: Program, tolerances: Mapping[str, Tolerance] | None = None
            ) -> list[OutputCheck]:
    """Check every program output of ``actual`` against ``expected`` with
    ``planned_tolerance`` (``TOLERANCES``, float32 at the output's scale too), or, for a float
    output named in ``tolerances``, with its tolerance there.

    Equal infinities and NaN against NaN count as equal (both runs overflowed alike).

    >>> from apportion.frontend.json_format import load
    >>> p = load("examples/mlp.json")
    >>> xs = random_inputs(p)
    >>> all(c.ok for c in compare(run_unplanned(p, xs), run_unplanned(p, xs), p))
    True
    """
    checks = []
    for name in program.outputs:
        t = program.tensor(name)
        for which, run in (("expected", expected), ("actual", actual)):
            if name not in run:
                raise ExecutionError(f"output {name!r} is missing from the {which} run")
            if np.shape(run[name]) != t.shape:
                raise ExecutionError(f"output {name!r} of the {which} run has shape "
                                     f"{np.shape(run[name])}, expected {t.shape}")
        if t.dtype not in FLOAT_DTYPES:
            checks.append(_compare_exact(name, t.dtype, np.asarray(expected[name]),
                                         np.asarray(actual[name])))
            continue
        e = np.asarray(expected[name]).astype(np.float64)
        a = np.asarray(actual[name]).astype(np.float64)
        same = (a == e) | (np.isnan(a) & np.isnan(e))
        with np.errstate(invalid="ignore"):
            diff = np.where(same, 0.0, np.abs(a - e))
        diff = np.where(np.isnan(diff), np.inf, diff)
        with np.errstate(invalid="ignore"):
            rel = np.where(same, 0.0, diff / np.maximum(np.abs(e), np.finfo(np.float64).tiny))
        given = (tolerances or {}).get(name)
        tol = given if given is not None else planned_tolerance(t.dtype, e)
        with np.errstate(invalid="ignore"):
            # isfinite: an inf expected must not excuse any finite actual through rtol * inf.
            ok = bool(np.all(same | (np.isfinite(diff)
                                     & (diff <= tol.atol + tol.rtol * np.abs(e)))))
        checks.append(OutputCheck(name, t.dtype, float(diff.max(initial=0.0)),
                                  float(np.nan_to_num(rel, nan=np.inf).max(initial=0.0)), tol, ok))
    return checks


def _compare_exact(name: str, dtype: str, expected: np.ndarray, actual: np.ndarray
                   ) -> OutputCheck:
    """Integers and bools: equal or wrong, compared as integers (through float64,
    9007199254740993 would equal 9007199254740992). The errors reported are the exact
    differences (Python ints: int64 differences overflow), as floats."""
    e, a = expected.reshape(-1), actual.reshape(-1)
    if e.dtype.kind == "f" or a.dtype.kind == "f":
        # a run that handed back floats for an integer tensor: NaN or a fraction is wrong
        e, a = e.astype(np.float64), a.astype(np.float64)
    wrong = np.flatnonzero(e != a)
    diff = rel = 0.0
    if wrong.size:
        pairs = zip(e[wrong].tolist(), a[wrong].tolist(), strict=True)
        errs = [(abs(int(x) - int(y)), abs(int(x))) if math.isfinite(x) and math.isfinite(y)
                else (math.inf, 1) for x, y in pairs]
        diff = float(max(d for d, _ in errs))
        rel = max(d / max(m, 1) for d, m in errs)
    return OutputCheck(name, dtype, diff, rel, TOLERANCES[dtype], not wrong.size)
