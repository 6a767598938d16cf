"""Split-K resolvers: how a target splits an op's reduction dim across cores.

A resolver sees an op's reduction problem (``ReductionShape``: batch, M, N and K extents, the
reduction dim's name and dtype) and returns the number of slices to cut K into, or ``None`` to
leave the choice to the cost model's search (``cost``, the Spyre resolver: the split that
minimises predicted time among every assignment work distribution weighs). A target names its
resolver in ``Target.split_k``, a typed object (``ByCost()``, ``IreeGpu()``, ``ByTable()``,
``NoSplit()``) that a TOML file and a preset spell by its name:

* ``cost``: the cost model decides (``None``);
* ``gpu``: IREE's split-reduction heuristic for matmul-like ops on GPUs (below);
* ``table``: the first row of ``Target.split_k_table`` whose ranges hold the shape;
* ``none``: never split a reduction.

A program may pin a factor per op (``"split_k": {"mm": 8}``) whatever the resolver.

The ``gpu`` resolver is IREE's split-reduction pass (``SetSplitReductionSizes.cpp`` in
``compiler/src/iree/compiler/DispatchCreation``), which sorts an op into one of four families and
asks the family's rule, in this order (the first family that takes the op decides). IREE gives
tile sizes (elements per slice) per reduction dim; here they are slices (dim size / tile). The
constants were fitted by IREE on data-center GPUs (the CDNA path; the small-GPU rules IREE adds
for targets with fewer than 4096 concurrent workgroups are not carried over). ``TARGET_SIZE`` is
the pass option ``splitReductionTargetSize`` as IREE's own tests run it (a 4096-element
arg-compare is cut into tiles of 1024).

* **outer reduction** (``getOuterReductionSizes``; e.g. batch norm's statistics): the reduction
  dim is outermost in the input. Skipped when all reduction dims hold fewer than ``TARGET_SIZE``
  elements; else the target tile is ``min(TARGET_SIZE, max(4, ceil(sqrt(total))))`` and the
  dims are tiled innermost first, each with the smallest divisor of its size at least the
  target still missing (a dim tiled after the target is met is cut into single elements).
* **convolution** (``getConvolutionReductionSizes``): a matmul-like op whose first input reads
  a window pair (an output image dim plus a filter dim, ``h+kh``) and that has a batch, an output
  channel and a filter dim. Skipped when output channels x the main distributed size (the image
  for batch-first outputs, else the batch) reach 640000, or when the reduction is at most 64 x
  sqrt of that and under 8192 elements. The output size (channels x batch x image x depth) caps
  the slices: under 32 x 32: 2048; under 128 x 128: 128; under 256 x 256: 64; under 512 x 512:
  16; else min(8, the first tiled dim). Dims are tiled innermost first for batch-first outputs,
  else outermost first, each with the smallest divisor at least size / cap; the cap shrinks by
  each dim's slices and a dim left with tiles above one element ends the walk (the data of inner
  dims would not be contiguous).
* **matmul-like** (``getMatmulLikeReductionSizes``): a contraction with two or more parallel
  dims. Skipped for outputs larger than 2048 x 4096 elements (enough workgroups already) and when
  K < 18000 and K / sqrt(M N) / batch < 48 (too little reduction to pay for the combine);
  otherwise at most 2048 slices when the output is at most 16 x 16 or K > 1e7, 128 when it is at
  most 64 x 64 or K > 1e6, 64 up to 128 x 128, 32 up to 256 x 256, 16 up to 512 x 512, else
  min(8, the outermost reduction dim); the reduction dims are tiled outermost first as for a
  convolution. A plain reduction over inner dims (``sum(x[m, k])``) is no IREE family (IREE's
  reduction codegen spreads it within workgroups); apportion asks it the matmul-like rule with
  its output as M and N = 1, as it always has (family ``inner_reduction``).
* **arg-compare** (``getArgCompareReductionSizes``; argmax, argmin): a reduction of at least
  ``TARGET_SIZE`` elements is cut into tiles of the smallest divisor at least ``TARGET_SIZE``.

Every divisor search is IREE's trial division from the lower bound up to min(size, 2^15).

A reduction dim of several whose size is known only at run time (``ReductionShape.runtime``)
is never cut by these rules: its planning size decides the totals, but a static slice count
would cut it into whole slices only at its multiples. It stays whole, as IREE leaves a dim it
cannot tile (the walks end there; the outer-reduction walk tiles the others). A single
run-time reduction dim gets a select chain instead (``gpu_chain``).

>>> gpu_slices(ReductionShape(batch=1, m=32, n=32, k=40960))   # 128 slices of 320
128
>>> gpu_slices(ReductionShape(batch=1, m=4096, n=4096, k=8192)) is None   # output too large
True
>>> gpu_split(ReductionShape(1, 1, 1, 4096, family="arg_compare"))   # tiles of 1024
{'k': 4}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Protocol

from apportion.errors import TargetError

#: IREE's matmul-like constants (see the module docstring)
GPU_LARGE_OUTPUT = 2048 * 4096
GPU_LARGE_K = 18000
GPU_RATIO_THRESHOLD = 48
#: (largest output, or smallest K beyond which) -> most slices, checked in order
GPU_LIMITS = ((16 * 16, 1e7, 2048), (64 * 64, 1e6, 128), (128 * 128, None, 64),
              (256 * 256, None, 32), (512 * 512, None, 16))
GPU_DEFAULT_LIMIT = 8
#: IREE bounds its divisor search by trial division up to this size
GPU_MAX_TILE_SEARCH = 1 << 15
#: IREE's ``splitReductionTargetSize`` (outer reductions and arg-compare)
TARGET_SIZE = 1024
#: IREE's outer-reduction floor on the scaled target tile
OUTER_MIN_TILE = 4
#: IREE's convolution constants: parallel size that skips, reduction size and ratio that split
CONV_LARGE_PARALLEL = 640000
CONV_LARGE_REDUCTION = 8192
CONV_RATIO_THRESHOLD = 64
#: (output below) -> most slices, checked in order; else min(8, the first tiled dim)
CONV_LIMITS = ((32 * 32, 2048), (128 * 128, 128), (256 * 256, 64), (512 * 512, 16))

#: the families an op's reduction is sorted into (``passes.split_k.family``)
FAMILIES = ("outer_reduction", "convolution", "matmul_like", "inner_reduction", "arg_compare")


@dataclass(frozen=True)
class ReductionShape:
    """What a resolver sees of an op: output extents split into batch, M and N (products of
    the dims only the first input, only the second, or both inputs index; all output dims count
    as M for a plain reduction), the reduction extent K, the reduction dim and dtype.

    The family rules also see the op's ``family`` (``FAMILIES``), its reduction dims outermost
    first with their sizes (``reduction``; empty: ``dim`` alone, of size ``k``) and, for a
    convolution, its output channels, image, depth and batch extents and whether the batch is
    the output's outermost dim."""

    batch: int
    m: int
    n: int
    k: int
    dim: str = "k"
    dtype: str = "float16"
    op: str = ""
    #: the symbol naming K when K is known only at run time (``k`` is then its planning size)
    symbol: str | None = None
    family: str = "matmul_like"
    reduction: tuple[tuple[str, int], ...] = ()
    channels: int = 1
    image: int = 1
    depth: int = 1
    conv_batch: int = 1
    batch_first: bool = True
    #: the reduction dims whose sizes are known only at run time (``reduction`` holds their
    #: planning sizes): the gpu rules leave them whole
    runtime: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise TargetError(f"reduction shape of op {self.op!r}: family must be one of "
                              f"{', '.join(FAMILIES)}, got {self.family!r}")

    @property
    def output(self) -> int:
        return self.batch * self.m * self.n

    @property
    def dims(self) -> tuple[tuple[str, int], ...]:
        """The reduction dims, outermost first, with their sizes."""
        return self.reduction or ((self.dim, self.k),)


def _smallest_tile(k: int, lower: int) -> int | None:
    """The smallest divisor of ``k`` at least ``lower`` (None past IREE's search bound)."""
    for tile in range(max(lower, 1), min(k, GPU_MAX_TILE_SEARCH) + 1):
        if k % tile == 0:
            return tile
    return None


def _matmul_limit(out: int, k: int, first: int) -> int:
    return next((lim for most, big_k, lim in GPU_LIMITS
                 if out <= most or (big_k is not None and k > big_k)),
                min(GPU_DEFAULT_LIMIT, first))


def _walk(dims: tuple[tuple[str, int], ...], limit: int,
          runtime: tuple[str, ...] = ()) -> dict[str, int] | None:
    """IREE's tiling walk of the convolution and matmul-like rules: each dim in turn takes the
    smallest tile giving at most ``limit`` slices, the limit shrinks by its slices, and a dim
    left with tiles of more than one element ends the walk, as a ``runtime`` dim (left whole)
    does. Slices per dim (those above 1).

    >>> _walk((("k", 64), ("j", 16)), 2048), _walk((("k", 64), ("j", 16)), 2048, ("k",))
    ({'k': 64, 'j': 16}, None)
    >>> _walk((("j", 16), ("k", 64)), 2048, ("k",))
    {'j': 16}
    """
    out: dict[str, int] = {}
    for d, size in dims:
        if d in runtime:
            break
        tile = _smallest_tile(size, -(-size // max(limit, 1)))
        if tile is None:
            return None
        if size // tile > 1:
            out[d] = size // tile
        limit //= size // tile
        if tile > 1:
            break
    return out or None


def matmul_like_split(shape: ReductionShape) -> dict[str, int] | None:
    """IREE's matmul-like rule (also asked for inner reductions): slices per reduction dim."""
    out, k = shape.output, shape.k
    if out > GPU_LARGE_OUTPUT:
        return None
    ratio = k / math.sqrt(shape.m * shape.n) / shape.batch
    if k < GPU_LARGE_K and ratio < GPU_RATIO_THRESHOLD:
        return None
    return _walk(shape.dims, _matmul_limit(out, k, shape.dims[0][1]), shape.runtime)


def outer_reduction_split(shape: ReductionShape, target: int = TARGET_SIZE
                          ) -> dict[str, int] | None:
    """IREE's outer-reduction rule: slices per reduction dim.

    >>> outer_reduction_split(ReductionShape(1, 64, 1, 100000, family="outer_reduction"))
    {'k': 250}
    """
    total = math.prod(size for _, size in shape.dims)
    if total < target:
        return None
    scaled = min(target, max(OUTER_MIN_TILE, math.ceil(math.sqrt(total))))
    out, done = {}, 1
    for d, size in reversed(shape.dims):  # innermost first
        tile = size if d in shape.runtime else _smallest_tile(size, -(-scaled // done)) or size
        if size // tile > 1:
            out[d] = size // tile
        done *= tile
    return {d: out[d] for d, _ in shape.dims if d in out} or None


def convolution_split(shape: ReductionShape) -> dict[str, int] | None:
    """IREE's convolution rule: slices per reduction dim.

    >>> convolution_split(ReductionShape(1, 1, 1, 2304, family="convolution",
    ...     reduction=(("c", 256), ("kh", 3), ("kw", 3)), channels=8, image=16))
    {'c': 128, 'kh': 3, 'kw': 3}
    """
    main = shape.image if shape.batch_first else shape.conv_batch
    parallel = shape.channels * main
    if parallel >= CONV_LARGE_PARALLEL:
        return None
    total = math.prod(size for _, size in shape.dims)
    if int(total / math.sqrt(parallel)) <= CONV_RATIO_THRESHOLD and \
            total < CONV_LARGE_REDUCTION:
        return None
    out = shape.channels * shape.conv_batch * shape.image * shape.depth
    dims = tuple(reversed(shape.dims)) if shape.batch_first else shape.dims
    limit = next((lim for below, lim in CONV_LIMITS if out < below),
                 min(GPU_DEFAULT_LIMIT, dims[0][1]))
    split = _walk(dims, limit, shape.runtime)
    return None if split is None else {d: split[d] for d, _ in shape.dims if d in split}


def arg_compare_split(shape: ReductionShape, target: int = TARGET_SIZE
                      ) -> dict[str, int] | None:
    """IREE's arg-compare rule: tiles of the smallest divisor at least ``target``."""
    (d, size), = shape.dims[-1:]
    if size < target or d in shape.runtime:
        return None
    tile = _smallest_tile(size, target) or size
    return {d: size // tile} if size // tile > 1 else None


#: each family's rule
FAMILY_RULES = {"outer_reduction": outer_reduction_split, "convolution": convolution_split,
                "matmul_like": matmul_like_split, "inner_reduction": matmul_like_split,
                "arg_compare": arg_compare_split}


def gpu_split(shape: ReductionShape) -> dict[str, int] | None:
    """The ``gpu`` resolver: slices per reduction dim by the rule of the op's family (None:
    left whole)."""
    return FAMILY_RULES[shape.family](shape)


def gpu_slices(shape: ReductionShape) -> int | None:
    """The slices of the ``gpu`` resolver in all (the product over the dims it splits), or None
    where it leaves the reduction whole."""
    split = gpu_split(shape)
    return None if split is None else math.prod(split.values())


@dataclass(frozen=True)
class TableRow:
    """One row of a target's ``split_k_table``: inclusive ranges of the shape's extents (None:
    any) and the slices to cut K into. ``cores``: the core count the row's factor was measured
    at (a host's own table); a target of that many cores takes the factor as measured, however
    many slices a core then runs, where a row measured one core per slice (None) is cut to the
    cores."""

    slices: int
    k: tuple[int | None, int | None] = (None, None)
    m: tuple[int | None, int | None] = (None, None)
    n: tuple[int | None, int | None] = (None, None)
    batch: tuple[int | None, int | None] = (None, None)
    cores: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.slices, bool) or not isinstance(self.slices, int) or self.slices < 1:
            raise TargetError(f"split_k_table: slices must be an int >= 1, got {self.slices!r}")
        for name in ("k", "m", "n", "batch"):
            lo, hi = getattr(self, name)
            for v in (lo, hi):
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                    raise TargetError(f"split_k_table: {name} bounds must be ints >= 1, got "
                                      f"{v!r}")

    def holds(self, shape: ReductionShape) -> bool:
        for name in ("k", "m", "n", "batch"):
            lo, hi = getattr(self, name)
            v = getattr(shape, name)
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                return False
        return True


def table_slices(rows: tuple[TableRow, ...], shape: ReductionShape) -> int | None:
    """The slices of the first row holding ``shape`` (None: no row does)."""
    row = table_row(rows, shape)
    return None if row is None else row.slices


def table_row(rows: tuple[TableRow, ...], shape: ReductionShape) -> TableRow | None:
    """The first row holding ``shape`` (None: no row does)."""
    return next((r for r in rows if r.holds(shape)), None)


@dataclass(frozen=True)
class Case:
    """One case of a select chain: K in ``[lo, hi]`` (None: open) and a multiple of
    ``multiple`` takes ``factor`` slices."""

    factor: int
    lo: int | None = None
    hi: int | None = None
    multiple: int = 1

    def __post_init__(self) -> None:
        for what, v in (("factor", self.factor), ("multiple", self.multiple),
                        ("lo", self.lo), ("hi", self.hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise TargetError(f"select case: {what} must be an int >= 1, got {v!r}")

    def holds(self, k: int) -> bool:
        return ((self.lo is None or k >= self.lo) and (self.hi is None or k <= self.hi)
                and k % self.multiple == 0)

    def __str__(self) -> str:
        parts = [f"{self.lo}<=" if self.lo is not None else "", "K",
                 f"<={self.hi}" if self.hi is not None else ""]
        cond = "".join(parts) if self.lo is not None or self.hi is not None else ""
        if self.multiple > 1:
            cond = f"{cond} & " if cond else ""
            cond += f"K%{self.multiple}==0"
        return f"{cond or 'any K'} -> {self.factor}"


@dataclass(frozen=True)
class SelectChain:
    """The split of a reduction whose size ``size`` is known only at run time: the first case
    holding the size gives the slices, else ``default``. Emitted as a chain of ``arith.select``;
    evaluated by the executors when the size is bound.

    >>> chain = SelectChain("K", (Case(128, lo=40960, multiple=128), Case(8, multiple=8)))
    >>> chain.evaluate(40960), chain.evaluate(800), chain.evaluate(801)
    (128, 8, 1)
    """

    size: str
    cases: tuple[Case, ...]
    default: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.default, bool) or not isinstance(self.default, int) or \
                self.default < 1:
            raise TargetError(f"select chain of {self.size!r}: default must be an int >= 1, "
                              f"got {self.default!r}")

    def evaluate(self, k: int) -> int:
        return next((c.factor for c in self.cases if c.holds(k)), self.default)

    @property
    def factors(self) -> tuple[int, ...]:
        """Every factor the chain can take, largest first."""
        return tuple(sorted({*(c.factor for c in self.cases), self.default}, reverse=True))

    def __str__(self) -> str:
        return "; ".join([*(str(c) for c in self.cases), f"else {self.default}"])


def _power_of_two_factors(most: int) -> list[int]:
    out, f = [], 2
    while f <= most:
        out.append(f)
        f *= 2
    return out[::-1]


def gpu_chain(shape: ReductionShape, unit: int = 1) -> SelectChain | None:
    """IREE's GPU heuristic as a select chain on a run-time K (``shape.k`` ignored; None where
    the output alone rules a split out). IREE searches every tile size dividing K; a chain
    cannot, so it tries power-of-two slice counts, largest first: on a K the heuristic splits
    into a power of two (every power-of-two K, 40960 = 128 x 320) it agrees with
    ``gpu_slices``. A case also needs whole ``unit``-element slices. Its slices are not
    clamped to any core count, as ``gpu_slices`` is not: a run divides them over the cores.

    >>> chain = gpu_chain(ReductionShape(batch=1, m=32, n=32, k=0, symbol="K"))
    >>> chain.evaluate(40960) == gpu_slices(ReductionShape(batch=1, m=32, n=32, k=40960))
    True
    >>> chain.evaluate(1000)   # K / sqrt(M N) < 48: left whole
    1
    """
    out = shape.output
    if out > GPU_LARGE_OUTPUT:
        return None
    # the ratio test passes from the smallest K with K / sqrt(M N) / batch >= 48
    lo = math.ceil(GPU_RATIO_THRESHOLD * math.sqrt(shape.m * shape.n) * shape.batch)
    while lo > 1 and (lo - 1) / math.sqrt(shape.m * shape.n) / shape.batch >= \
            GPU_RATIO_THRESHOLD:
        lo -= 1
    lo = min(lo, GPU_LARGE_K)
    # the slice limit by K range: rows above the output's own row fire past their big K
    regions: list[tuple[int, int | None, int]] = []  # (K from, K to, limit)
    hi: int | None = None
    for most, big_k, limit in GPU_LIMITS:
        if out <= most:
            regions.append((lo, hi, limit))
            break
        if big_k is not None:
            start = int(big_k) + 1
            regions.append((start, hi, limit))
            hi = start - 1
    else:
        regions.append((lo, hi, GPU_DEFAULT_LIMIT))
    cases = []
    for start, stop, limit in regions:
        for f in _power_of_two_factors(limit):
            # IREE's divisor search stops at 2^15: a larger tile leaves K whole
            top = f * GPU_MAX_TILE_SEARCH if stop is None else min(stop, f * GPU_MAX_TILE_SEARCH)
            if max(start, lo) <= top:
                cases.append(Case(f, lo=max(start, lo), hi=top, multiple=f * unit))
    return SelectChain(shape.symbol or shape.dim, tuple(cases), 1)


def table_chain(rows: tuple[TableRow, ...], shape: ReductionShape, unit: int = 1,
                cap: int | None = None, cores: int | None = None) -> SelectChain | None:
    """A target table as a select chain on a run-time K: the rows whose M, N and batch ranges
    hold the shape, in order, each a case on its K range (and whole ``unit``-element slices);
    None when no row can hold the shape. A row's slices are cut to ``cap`` unless it was
    measured at ``cores`` (``TableRow.cores``), as the static table resolver cuts them.

    >>> rows = (TableRow(64, k=(2048, 8192), cores=2), TableRow(16, k=(8193, None)))
    >>> str(table_chain(rows, ReductionShape(1, 1, 4096, 0, symbol="K"), cap=2, cores=2))
    '2048<=K<=8192 & K%64==0 -> 64; 8193<=K & K%2==0 -> 2; else 1'
    """
    cases = []
    for r in rows:
        if not all((lo is None or getattr(shape, n) >= lo) and (hi is None or
                   getattr(shape, n) <= hi) for n in ("m", "n", "batch")
                   for lo, hi in (getattr(r, n),)):
            continue
        f = r.slices if cap is None or (cores is not None and r.cores == cores) else min(
            r.slices, cap)
        cases.append(Case(f, lo=r.k[0], hi=r.k[1], multiple=f * unit))
    if not cases:
        return None
    return SelectChain(shape.symbol or shape.dim, tuple(cases), 1)


#: a user resolver: the shape in, the slices (1: no split), a ``SelectChain`` (for a run-time
#: K, ``shape.symbol`` set) or None (let the cost model decide)
Resolver = Callable[[ReductionShape], "int | SelectChain | None"]


# --- the target's resolver: a typed object, as the planning strategy is --------------------------

#: what a target's resolver decides for one op: the slices (an int, slices per dim for the gpu
#: rules, a ``SelectChain`` for a run-time K, or None: left to the cost model's search) and who
#: decided (the resolver's name, or ``cost`` where it leaves the op to the search)
Decision = tuple["int | dict[str, int] | SelectChain | None", str]


class ResolverTarget(Protocol):
    """What a resolver reads of its target: a ``Target`` (which imports this module)."""

    @property
    def cores(self) -> int: ...

    @property
    def split_k_table(self) -> tuple[TableRow, ...]: ...


@dataclass(frozen=True)
class TargetResolver:
    """A target's split-K resolver (``Target.split_k``): ``decide`` is what the split-K pass asks
    of it for each op with a reducer, ``name`` how a TOML file, a preset and a plan's
    ``SplitK.by`` spell it. A new resolver is a subclass (a target carries it, nothing else
    changes); the stock ones are ``ByCost``, ``IreeGpu``, ``ByTable`` and ``NoSplit``."""

    name: ClassVar[str] = ""
    #: it reads the target's ``split_k_table`` (a target naming it needs rows)
    needs_table: ClassVar[bool] = False

    def decide(self, shape: ReductionShape, target: ResolverTarget | None, budget: int,
               unit: int) -> Decision:
        """The decision for ``shape`` on ``target``, within ``budget`` cores (those the op's pins
        leave), a run-time K's slices whole ``unit``-element pieces."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class ByCost(TargetResolver):
    """``cost`` (Spyre's): decides nothing; work distribution's search splits the reduction by
    predicted time.

    >>> ByCost().decide(ReductionShape(1, 32, 32, 40960), None, 8, 1)
    (None, 'cost')
    """

    name: ClassVar[str] = "cost"

    def decide(self, shape: ReductionShape, target: ResolverTarget | None, budget: int,
               unit: int) -> Decision:
        return None, "cost"


@dataclass(frozen=True)
class NoSplit(TargetResolver):
    """``none``: never split a reduction.

    >>> NoSplit().decide(ReductionShape(1, 32, 32, 40960), None, 8, 1)
    (1, 'none')
    """

    name: ClassVar[str] = "none"

    def decide(self, shape: ReductionShape, target: ResolverTarget | None, budget: int,
               unit: int) -> Decision:
        return 1, "none"


@dataclass(frozen=True)
class IreeGpu(TargetResolver):
    """``gpu``: IREE's split-reduction heuristic (the module docstring), slices per dim not
    clamped to the cores; a run-time K's select chain for the matmul-like families, every other
    family's run-time reduction left whole, as IREE leaves it.

    >>> IreeGpu().decide(ReductionShape(1, 32, 32, 40960), None, 8, 1)
    ({'k': 128}, 'gpu')
    """

    name: ClassVar[str] = "gpu"

    def decide(self, shape: ReductionShape, target: ResolverTarget | None, budget: int,
               unit: int) -> Decision:
        if shape.symbol is None:
            return gpu_split(shape) or 1, "gpu"
        if shape.family not in ("matmul_like", "inner_reduction"):
            return 1, "gpu"  # IREE leaves a run-time reduction of these families whole
        # the heuristic's factors, not clamped (a case's slices are divided over the cores)
        chain = gpu_chain(shape, unit)
        return (1, "gpu") if chain is None else (chain, "gpu")


@dataclass(frozen=True)
class ByTable(TargetResolver):
    """``table``: the first row of the target's ``split_k_table`` holding the shape (no row: the
    cost model's search). A factor measured at the target's core count is taken as measured
    (the slices then divided over the cores, as the gpu resolver's are); one measured one core
    per slice is cut to the cores.

    >>> from apportion.target.presets import CPU_SPLIT_K, cpu
    >>> ByTable().decide(ReductionShape(1, 1, 4096, 14336), cpu(2, CPU_SPLIT_K), 2, 1)
    (32, 'table')
    """

    name: ClassVar[str] = "table"
    needs_table: ClassVar[bool] = True

    def decide(self, shape: ReductionShape, target: ResolverTarget | None, budget: int,
               unit: int) -> Decision:
        assert target is not None  # a table is the target's
        if shape.symbol is None and shape.dim in shape.runtime:
            # every reduction dim of several is a run-time size: one static count would cut
            # one into whole slices only at its multiples (the gpu rules leave them whole)
            return None, "cost"
        if shape.symbol is not None:
            # a row measured at this core count as measured, any other cut to the cores the
            # op's pins leave (a case's slices are divided over the cores as a static split's)
            chain = table_chain(target.split_k_table, shape, unit, cap=budget,
                                cores=target.cores)
            return (None, "cost") if chain is None else (chain, "table")
        row = table_row(target.split_k_table, shape)
        if row is None:
            return None, "cost"
        return ({shape.dim: row.slices} if row.cores == target.cores else row.slices), "table"


#: every stock resolver, by the name a TOML file and a preset spell it
BY_NAME: Mapping[str, TargetResolver] = MappingProxyType(
    {r.name: r for r in (ByCost(), IreeGpu(), ByTable(), NoSplit())})
RESOLVERS = tuple(BY_NAME)


def parse_split_k(value: object, where: str = "split_k") -> TargetResolver:
    """The resolver ``value`` names (``cost``, ``gpu``, ``table``, ``none``), or ``value``
    itself when it is one; anything else a ``TargetError`` naming ``where``.

    >>> parse_split_k("gpu"), str(parse_split_k(ByTable()))
    (IreeGpu(), 'table')
    >>> parse_split_k("magic", "target 'x'")
    Traceback (most recent call last):
    ...
    apportion.errors.TargetError: target 'x': split_k must be one of cost, gpu, table, none, \
got 'magic' (str)
    """
    if isinstance(value, TargetResolver):
        return value
    if isinstance(value, str) and value in BY_NAME:
        return BY_NAME[value]
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    if not isinstance(value, int | float) or isinstance(value, bool):  # a number's value is all
        text += f" ({type(value).__name__})"
    raise TargetError(f"{where}: split_k must be one of {', '.join(RESOLVERS)}, got {text}")
