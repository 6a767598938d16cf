"""Shardings: how one tensor is laid out over a mesh, and the user's annotations.

A ``Sharding`` lists, for each tensor dim, the mesh axes that split it, outer first (none:
replicated along that dim), plus the *partial* axes: along them every device holds a partial
value of the tensor still to be reduced (by ``reducer``: ``sum`` for a matmul or a mean whose
reduction dim was split, ``max`` for an ``amax``, ``argmax`` for an argmax's packed
value-index keys...). A mesh axis splits at most one dim and is never
both splitting and partial; an axis the sharding does not name holds replicas.

Shards may be uneven and are exact. A dim of ``n`` elements split over axes ``(a, b)`` is cut
hierarchically, outer axis first, each cut as the cores' work is cut (``plans.views.dim_slices``
in units of one element: ``floor`` or ``ceil(n / k)`` elements per shard, the larger first, so
10 over 4 is 3, 3, 2, 2): one rule for cores and devices. PyTorch's ``torch.chunk`` (DTensor's
``Shard``) cuts 10 over 4 as 3, 3, 3, 1; the two agree where ``n % k`` is 0 or ``k - 1``
(``chunk_agrees``), and the dtensor backend places its own shards where they differ. A cut
that would leave some device an empty shard (``n < k``) is refused.

Users annotate any subset of tensors: in the builder with ``ap.shard(t, mesh, ("dp", None))``
(in the spirit of JAX's ``PartitionSpec``: one entry per dim, an axis name, a tuple of axis
names outer first, or None), or in a program file's ``"shardings"`` field, ``{"x": [["dp"],
[]]}``. The annotations live beside the ``Program`` (``Annotations``), not inside it:
``load`` reads a program file with them, ``annotations_of`` finds a builder's.

>>> s = Sharding((("dp",), ()))
>>> str(s), s.block((5, 8), {"dp": 1}, {"dp": 2})
('[dp, -]', ((3, 5), (0, 8)))
"""

from __future__ import annotations

import itertools
import json
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.errors import ProgramError, TargetError
from apportion.frontend.builder import ProgramBuilder, Tensor
from apportion.frontend.json_format import from_dict, to_dict
from apportion.ir import jsondoc
from apportion.ir.dtypes import dtype_bytes
from apportion.ir.kinds import REDUCERS
from apportion.ir.program import Program
from apportion.plans.views import dim_slices
from apportion.sharding.mesh import Mesh

#: reducers a partial tensor may wait on: what each reducer's parts wait as across devices
#: (``Reducer.across_devices``): its own partials, a mean's as a ``sum``, an ``argmax``'s as
#: int64 keys packing (value, index) pairs (``schedule.mesh.argmax_keys``: they combine by max,
#: the index is unpacked once reduced)
PARTIAL_REDUCERS = tuple(dict.fromkeys(r.across_devices.waits_as for r in REDUCERS.values()
                                       if r.across_devices is not None))


def chunk(n: int, parts: int) -> tuple[tuple[int, int], ...]:
    """``n`` elements cut in ``parts`` as the cores' work is cut (``dim_slices`` in units of
    one element): ``floor`` or ``ceil(n / parts)`` each, the larger first; empty only where
    ``n < parts``.

    >>> chunk(10, 4)
    ((0, 3), (3, 6), (6, 8), (8, 10))
    >>> chunk(5, 4), chunk(3, 4)
    (((0, 2), (2, 3), (3, 4), (4, 5)), ((0, 1), (1, 2), (2, 3), (3, 3)))
    """
    return tuple(dim_slices(n, 1, parts))


def torch_chunk(n: int, parts: int) -> tuple[tuple[int, int], ...]:
    """``n`` elements cut in ``parts`` as ``torch.chunk`` (and so DTensor's ``Shard``) cuts:
    ``ceil(n / parts)`` each, the last ones what is left (possibly nothing).

    >>> torch_chunk(10, 4)
    ((0, 3), (3, 6), (6, 9), (9, 10))
    """
    c = -(-n // parts)
    return tuple((min(i * c, n), min((i + 1) * c, n)) for i in range(parts))


def chunk_agrees(n: int, axes: Sequence[str], sizes: Mapping[str, int]) -> bool:
    """Whether a dim of ``n`` split over ``axes`` (outer first) is cut as ``torch.chunk``
    nests its cuts: every device's block the same under both rules.

    >>> chunk_agrees(10, ("a",), {"a": 4}), chunk_agrees(7, ("a",), {"a": 4})
    (False, True)
    """
    sizes_now = {n}
    for a in axes:
        if any(chunk(m, sizes[a]) != torch_chunk(m, sizes[a]) for m in sizes_now):
            return False
        sizes_now = {hi - lo for m in sizes_now for lo, hi in chunk(m, sizes[a])}
    return True


def dim_block(n: int, axes: Sequence[str], coords: Mapping[str, int],
              sizes: Mapping[str, int]) -> tuple[int, int]:
    """The elements of a dim of ``n`` that the device at ``coords`` holds when ``axes`` split it
    (outer first)."""
    start, size = 0, n
    for a in axes:
        lo, hi = chunk(size, sizes[a])[coords[a]]
        start, size = start + lo, hi - lo
    return start, start + size


@dataclass(frozen=True)
class Window:
    """The rows of one tensor dim a device *reads* when an op's dim split over mesh axes reads
    that tensor dim through an offset or a sum (a convolution's ``x[h + kh]``, a shifted
    slice's ``x[i + 1]``): the device computing op rows ``[lo, hi)`` of the op dim (of
    ``size``, cut as ``dim_block`` cuts it) reads tensor rows ``[coeff * lo + const,
    coeff * (hi - 1) + const + extent + 1)``, where ``extent`` is what the access's other
    terms add at their largest. Each device's window is exact, uneven cuts included; it may
    reach into its neighbours' shards on both sides (their *halo*). The op dim may be split
    over several mesh axes (outer first), its neighbours then differing along any of them.

    >>> w = Window(8, 1, 0, 2)  # y[h] = sum over kh < 3 of x[h + kh], h of 8
    >>> [w.rows(("tp",), {"tp": c}, {"tp": 3}) for c in range(3)]
    [(0, 5), (3, 8), (6, 10)]
    >>> [w.rows(("a", "b"), {"a": a, "b": b}, {"a": 2, "b": 2}) for a in (0, 1) for b in (0, 1)]
    [(0, 4), (2, 6), (4, 8), (6, 10)]
    """

    size: int
    coeff: int
    const: int
    extent: int

    def rows(self, axes: Sequence[str], coords: Mapping[str, int],
             sizes: Mapping[str, int]) -> tuple[int, int]:
        """The rows the device at ``coords`` reads when ``axes`` split the op dim."""
        lo, hi = dim_block(self.size, axes, coords, sizes)
        return self.coeff * lo + self.const, self.coeff * (hi - 1) + self.const + self.extent + 1

    def __str__(self) -> str:
        start = f"{self.coeff}*i" if self.coeff != 1 else "i"
        return f"{start}+{self.const}..+{self.extent}"


#: partial reducers whose combine selects one of its operands (it rounds nothing): their
#: partials wait in the tensor's own dtype; every other widening reducer's wait in its
#: accumulator dtype
_EXACT_COMBINES = frozenset({"max", "min"})


def partial_dtype(reducer: str, dtype: str) -> str:
    """The dtype a partial value of a ``dtype`` tensor waiting on ``reducer`` is held and
    moved in until it is whole: the reducer's accumulator dtype (``Reducer.accumulator_dtype``:
    float32 for float16 and bfloat16 sums), so that the partials round once, when the
    reduction across devices is done, as a split-K on one device rounds its slices' partials
    (a cancellation after a float16 sum would magnify a rounding per device). A max or min
    combines exactly and keeps ``dtype``.

    >>> partial_dtype("sum", "float16"), partial_dtype("max", "float16")
    ('float32', 'float16')
    >>> partial_dtype("sum", "int8"), partial_dtype("argmax", "int64")
    ('int8', 'int64')
    """
    if reducer in _EXACT_COMBINES:
        return dtype
    return REDUCERS[reducer].accumulator_dtype(dtype)


def shard_sizes(n: int, axes: Sequence[str], sizes: Mapping[str, int]) -> set[int]:
    """Every shard size a dim of ``n`` split over ``axes`` takes."""
    out = {n}
    for a in axes:
        out = {hi - lo for m in out for lo, hi in chunk(m, sizes[a])}
    return out


@dataclass(frozen=True)
class Sharding:
    """Per tensor dim the mesh axes splitting it (outer first), and the partial axes.

    >>> Sharding(((), ("tp",)), partial=("dp",), reducer="sum").axes
    ('tp', 'dp')
    """

    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()
    reducer: str | None = None
    #: per dim the ``Window`` a reader's device reads of it (a halo read), or None; empty:
    #: no windows. Only what an op reads has windows, never what a tensor is made as
    windows: tuple[Window | None, ...] = ()

    def __post_init__(self) -> None:
        if self.windows:
            if len(self.windows) != len(self.dims):
                raise ProgramError(f"a sharding of {len(self.dims)} dims has "
                                   f"{len(self.windows)} windows")
            for i, w in enumerate(self.windows):
                if w is not None and not self.dims[i]:
                    raise ProgramError(f"dim {i}: a window reads a dim split by mesh axes, "
                                       "not an unsplit one")
                if w is not None and self.partial:
                    raise ProgramError("a partial value is never read through a window")
            if not any(w is not None for w in self.windows):
                object.__setattr__(self, "windows", ())
        seen: dict[str, str] = {}
        for i, axes in enumerate(self.dims):
            for a in axes:
                if a in seen:
                    where = seen[a]
                    if where == f"dim {i}":
                        raise ProgramError(f"dim {i} is split twice on mesh axis {a!r}; an axis "
                                           "splits a dim once")
                    raise ProgramError(f"mesh axis {a!r} splits both {where} and dim {i}; an "
                                       "axis splits one dim at most")
                seen[a] = f"dim {i}"
        for a in self.partial:
            if a in seen:
                raise ProgramError(f"mesh axis {a!r} both splits {seen[a]} and is partial")
            seen[a] = "partial"
        if bool(self.partial) != (self.reducer is not None):
            raise ProgramError("a partial sharding needs its reducer, and only a partial one")
        if self.reducer is not None and self.reducer not in PARTIAL_REDUCERS:
            raise ProgramError(f"a tensor cannot wait on a {self.reducer!r} reduction across "
                               f"devices; partial reducers: {', '.join(PARTIAL_REDUCERS)}")

    @staticmethod
    def replicated(rank: int) -> Sharding:
        return Sharding(((),) * rank)

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def axes(self) -> tuple[str, ...]:
        """Every axis the sharding names: splitting ones by dim, then partial ones."""
        return tuple(a for axes in self.dims for a in axes) + self.partial

    def dim_of(self, axis: str) -> int | None:
        return next((i for i, axes in enumerate(self.dims) if axis in axes), None)

    def without_partial(self) -> Sharding:
        return Sharding(self.dims)

    @property
    def base(self) -> Sharding:
        """This sharding without its windows: the shards the windows read around."""
        return Sharding(self.dims, self.partial, self.reducer) if self.windows else self

    def window(self, dim: int) -> Window | None:
        return self.windows[dim] if self.windows else None

    def block(self, shape: Sequence[int], coords: Mapping[str, int],
              sizes: Mapping[str, int]) -> tuple[tuple[int, int], ...]:
        """``(start, stop)`` per dim of the shard the device at ``coords`` holds (a windowed
        dim: the window it reads)."""
        if self.windows:
            return tuple(dim_block(n, axes, coords, sizes) if w is None else
                         w.rows(axes, coords, sizes)
                         for n, axes, w in zip(shape, self.dims, self.windows, strict=True))
        return tuple(dim_block(n, axes, coords, sizes)
                     for n, axes in zip(shape, self.dims, strict=True))

    def local_shape(self, shape: Sequence[int], coords: Mapping[str, int],
                    sizes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(hi - lo for lo, hi in self.block(shape, coords, sizes))

    def largest_shape(self, shape: Sequence[int], sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The shard of the device at every coordinate 0: no other shard is larger (a
        windowed dim: the widest window of any device)."""
        out = self.local_shape(shape, dict.fromkeys(sizes, 0), sizes)
        if not self.windows:
            return out
        widest = list(out)
        for j, w in enumerate(self.windows):
            if w is not None:
                axes = self.dims[j]
                widest[j] = max(hi - lo for c in itertools.product(*(range(sizes[a])
                                                                     for a in axes))
                                for lo, hi in (w.rows(axes, dict(zip(axes, c, strict=True)),
                                                      sizes),))
        return tuple(widest)

    def held_dtype(self, dtype: str) -> str:
        """The dtype each device holds its shard of a ``dtype`` tensor in: a partial value's
        ``partial_dtype``, else ``dtype``.

        >>> Sharding(((),), ("dp",), "sum").held_dtype("float16"), Sharding(((),)).held_dtype(
        ...     "float16")
        ('float32', 'float16')
        """
        return dtype if self.reducer is None else partial_dtype(self.reducer, dtype)

    def local_bytes(self, shape: Sequence[int], dtype: str, sizes: Mapping[str, int]) -> int:
        """Bytes of the largest shard of a tensor of ``dtype`` elements (a collective's price
        passes ``held_dtype``'s)."""
        n = dtype_bytes(dtype)
        for s in self.largest_shape(shape, sizes):
            n *= s
        return n

    def check(self, mesh: Mesh, shape: Sequence[int], tensor: str) -> Sharding:
        """Refuse axes the mesh lacks, a rank that is not the tensor's, and an empty shard;
        errors name the tensor, the dim and the axis."""
        if self.rank != len(shape):
            raise ProgramError(f"tensor {tensor!r}: sharding {self} has {self.rank} dims, the "
                               f"tensor has rank {len(shape)}")
        for i, axes in enumerate(self.dims):
            for a in axes:
                if a not in mesh.axis_map:
                    raise ProgramError(f"tensor {tensor!r} dim {i}: mesh axis {a!r} is not an "
                                       f"axis of mesh {mesh.name!r} (axes: "
                                       f"{', '.join(mesh.names)})")
        for a in self.partial:
            if a not in mesh.axis_map:
                raise ProgramError(f"tensor {tensor!r}: partial mesh axis {a!r} is not an axis "
                                   f"of mesh {mesh.name!r} (axes: {', '.join(mesh.names)})")
        sizes = {a.name: a.size for a in mesh.axes}
        for i, (n, axes) in enumerate(zip(shape, self.dims, strict=True)):
            if axes and min(shard_sizes(n, axes, sizes)) == 0:
                ways = " x ".join(f"{a}={sizes[a]}" for a in axes)
                raise ProgramError(f"tensor {tensor!r} dim {i} of size {n} split over "
                                   f"{ways} leaves a device an empty shard")
        return self

    def to_json(self) -> Any:
        """``[["dp"], []]``; a partial one as ``{"dims": ..., "partial": [...], "reducer":
        ...}``."""
        dims = [list(a) for a in self.dims]
        if self.windows:
            return {"dims": dims, "windows": [None if w is None else
                                              [w.size, w.coeff, w.const, w.extent]
                                              for w in self.windows]}
        if not self.partial:
            return dims
        return {"dims": dims, "partial": list(self.partial), "reducer": self.reducer}

    @staticmethod
    def from_json(doc: Any, where: str = "sharding") -> Sharding:
        if isinstance(doc, dict):
            if set(doc) - {"dims", "partial", "reducer", "windows"}:
                raise ProgramError(f"{where}: a sharding object has dims, partial, reducer "
                                   "and windows")
            base = Sharding.parse(doc.get("dims", []), where)
            partial = doc.get("partial", [])
            if not isinstance(partial, list) or not all(isinstance(a, str) for a in partial):
                raise ProgramError(f"{where}: partial must be a list of mesh axis names")
            windows = doc.get("windows", [])
            if not isinstance(windows, list) or not all(
                    w is None or (isinstance(w, list) and len(w) == 4 and all(
                        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in w))
                    for w in windows):
                raise ProgramError(f"{where}: windows must be a list of null or [size, coeff, "
                                   "const, extent] (integers >= 0) per dim")
            try:
                return Sharding(base.dims, tuple(partial), doc.get("reducer"),
                                tuple(None if w is None else Window(*w) for w in windows))
            except ProgramError as e:
                raise ProgramError(f"{where}: {e}") from None
        return Sharding.parse(doc, where)

    @staticmethod
    def parse(spec: Any, where: str = "sharding") -> Sharding:
        """One entry per dim: None, an axis name, or a list/tuple of axis names (outer first).

        >>> Sharding.parse(("dp", None, ["a", "b"])).dims
        (('dp',), (), ('a', 'b'))
        """
        if isinstance(spec, Sharding):
            return spec
        if isinstance(spec, str) or not isinstance(spec, Sequence):
            raise ProgramError(f"{where}: a sharding is one entry per tensor dim (an axis name, "
                               f"a list of axis names or None), like (\"dp\", None); got "
                               f"{spec!r}"[:200])
        dims = []
        for i, entry in enumerate(spec):
            if entry is None:
                dims.append(())
            elif isinstance(entry, str):
                dims.append((entry,))
            elif isinstance(entry, Sequence) and all(isinstance(a, str) for a in entry):
                dims.append(tuple(entry))
            else:
                raise ProgramError(f"{where} dim {i}: expected an axis name, a list of axis "
                                   f"names or None, got {entry!r}"[:200])
        try:
            return Sharding(tuple(dims))
        except ProgramError as e:
            raise ProgramError(f"{where}: {e}") from None

    def __str__(self) -> str:
        body = ", ".join(("*".join(a) if a else "-") + (f" window {w}" if w else "")
                         for a, w in zip(self.dims, self.windows or (None,) * self.rank,
                                         strict=True))
        text = f"[{body}]"
        if self.partial:
            text += f" partial {self.reducer} over {'*'.join(self.partial)}"
        return text


#: tensor name -> its annotated sharding
Annotations = dict[str, Sharding]


def check_annotations(program: Program, annotations: Mapping[str, Sharding], mesh: Mesh
                      ) -> dict[str, Sharding]:
    """The annotations checked against ``program`` and ``mesh`` (errors name the tensor, dim
    and axis)."""
    out: dict[str, Sharding] = {}
    for name, s in annotations.items():
        if name not in program.tensor_map:
            raise ProgramError(f"sharding annotation names tensor {name!r}, which program "
                               f"{program.name!r} does not have")
        if s.partial:
            raise ProgramError(f"tensor {name!r}: an annotation cannot be partial")
        if s.windows:  # a window is what an op reads, never how a tensor is held
            raise ProgramError(f"tensor {name!r}: an annotation cannot have windows ({s})")
        t = program.tensor(name)
        if t.dynamic:
            raise ProgramError(f"tensor {name!r} has a symbolic size; sharding needs static "
                               "shapes (bind the program's sizes first)")
        out[name] = s.check(mesh, t.shape, name)
    return out


# --- the builder: ap.shard -------------------------------------------------------------------

_BUILT: weakref.WeakKeyDictionary[ProgramBuilder, dict[str, Sharding]] = \
    weakref.WeakKeyDictionary()


def shard(t: Tensor, mesh: Mesh, spec: Any) -> Tensor:
    """Annotate builder tensor ``t``: laid out over ``mesh`` as ``spec`` says (one entry per
    dim: an axis name, a tuple of axis names outer first, or None). Returns ``t``.

    >>> import apportion as ap
    >>> from apportion.sharding.mesh import parse
    >>> with ap.program("p") as p:
    ...     x = shard(p.input("x", [8, 4], "float32"), parse("dp=2"), ("dp", None))
    ...     p.output(ap.exp(x))
    >>> {k: str(v) for k, v in annotations_of(p).items()}
    {'x': '[dp, -]'}
    """
    if not isinstance(t, Tensor):
        raise ProgramError(f"ap.shard needs a builder tensor, got {type(t).__name__}")
    if not isinstance(mesh, Mesh):
        raise TargetError(f"ap.shard needs a Mesh (apportion.sharding.mesh.parse('dp=2')), got "
                          f"{type(mesh).__name__}")
    s = Sharding.parse(spec, f"ap.shard of tensor {t.name!r}")
    s.check(mesh, t.shape, t.name)
    _BUILT.setdefault(t.builder, {})[t.name] = s
    return t


def annotations_of(program: Any) -> dict[str, Sharding]:
    """The annotations ``ap.shard`` recorded on a builder (none for a plain Program)."""
    if isinstance(program, ProgramBuilder):
        return dict(_BUILT.get(program, {}))
    return {}


def annotations_given(annotations: Any, where: str) -> Mapping[str, Sharding] | None:
    """``annotations`` (tensor name -> Sharding, or None), or a ProgramError naming ``where``."""
    if annotations is None:
        return None
    if not isinstance(annotations, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Sharding) for k, v in annotations.items()):
        raise ProgramError(f"{where}: annotations must be a dict of tensor names to Shardings, "
                           f"got {type(annotations).__name__} {annotations!r}"[:200])
    return annotations


def program_of(program: Any, where: str) -> Program:
    """The IR program of a Program or a builder; sharding needs static shapes."""
    if isinstance(program, ProgramBuilder):
        program = program.program
    if not isinstance(program, Program):
        raise ProgramError(f"{where} needs a Program or a builder, got "
                           f"{type(program).__name__}")
    if program.symbols:
        raise ProgramError(f"program {program.name!r} has run-time sizes "
                           f"({', '.join(program.symbol_map)}); sharding needs static shapes: "
                           "bind them first (Program.bind)")
    return program


# --- program files with a "shardings" field ------------------------------------------------

def parse_shardings(doc: Any, where: str = "shardings") -> dict[str, Sharding]:
    if not isinstance(doc, dict):
        raise ProgramError(f"{where} must be an object mapping tensor names to shardings, like "
                           '{"x": [["dp"], []]}')
    return {name: Sharding.from_json(v, f"{where}: tensor {name!r}") for name, v in doc.items()}


def loads(text: str) -> tuple[Program, dict[str, Sharding]]:
    """A program document and its ``"shardings"`` field (tensor -> per dim a list of axes)."""
    try:
        doc = jsondoc.loads(text, ProgramError, "program")
    except json.JSONDecodeError as e:
        raise ProgramError(f"program is not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(doc, dict):
        raise ProgramError("a program document must be a JSON object")
    raw = doc.pop("shardings", {})
    program = from_dict(doc)
    ann = parse_shardings(raw)
    for name, s in ann.items():
        if name not in program.tensor_map:
            raise ProgramError(f"shardings: tensor {name!r} is not a tensor of program "
                               f"{program.name!r}")
        if s.rank != program.tensor(name).rank:
            raise ProgramError(f"shardings: tensor {name!r} has rank "
                               f"{program.tensor(name).rank}, its sharding {s} has {s.rank} dims")
    return program, ann


def load(path: str | Path) -> tuple[Program, dict[str, Sharding]]:
    """Read a program file with its ``"shardings"`` field."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        why = getattr(e, "strerror", None) or e
        raise ProgramError(f"cannot read program file {str(path)!r}: {why}") from None
    try:
        return loads(text)
    except ProgramError as e:
        raise ProgramError(f"{path}: {e}") from None


def dumps(program: Program, annotations: Mapping[str, Sharding]) -> str:
    """The program document with its annotations in ``"shardings"``."""
    doc = to_dict(program)
    if annotations:
        doc["shardings"] = {n: s.to_json() for n, s in annotations.items()}
    return json.dumps(doc, indent=1)


def candidates(shape: Sequence[int], mesh: Mesh) -> tuple[Sharding, ...]:
    """Every non-partial sharding of a tensor of ``shape``: each axis on one dim or none, the
    axes of one dim in mesh order, no empty shard. Replicated first."""
    sizes = {a.name: a.size for a in mesh.axes}
    out = []
    for choice in combos_of(len(shape), mesh.names):
        dims = tuple(tuple(a for a, d in zip(mesh.names, choice, strict=True) if d == i)
                     for i in range(len(shape)))
        if all(not axes or min(shard_sizes(n, axes, sizes)) > 0
               for n, axes in zip(shape, dims, strict=True)):
            out.append(Sharding(dims))
    return tuple(out)


def combos_of(slots: int, axes: Iterable[str]) -> list[tuple[int | None, ...]]:
    """Each axis given a slot in ``0..slots-1`` or None."""
    names = list(axes)
    return list(itertools.product(*([None, *range(slots)] for _ in names)))

