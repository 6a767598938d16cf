"""Tensors, tiling groups and programs, with whole-program validation."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from apportion.errors import ProgramError
from apportion.ir.dtypes import check_dtype, check_name, dtype_bytes
from apportion.ir.op import MAX_DIMS, Op


@dataclass(frozen=True)
class Symbol:
    """A dim size known only at run time, bounded by ``min`` and ``max`` (None: unbounded).

    A program is planned at ``planning_size``: the bound when there is one (every span and
    memory check then holds for any run-time size), else ``min``.
    """

    name: str
    max: int | None = None
    min: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ProgramError(f"symbol name {self.name!r} must be an identifier")
        for what, v in (("min", self.min), ("max", self.max)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ProgramError(f"symbol {self.name!r}: {what} must be an int >= 1, got {v!r}")
        if self.max is not None and self.max < self.min:
            raise ProgramError(f"symbol {self.name!r}: max {self.max} is below min {self.min}")

    @property
    def planning_size(self) -> int:
        return self.max if self.max is not None else self.min

    def check(self, value: object) -> int:
        """``value`` as a size of this symbol, or a ProgramError naming the bound it breaks."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProgramError(f"symbol {self.name!r} needs an int size, got {value!r}")
        if value < self.min or (self.max is not None and value > self.max):
            bound = f"{self.min}..{self.max}" if self.max is not None else f">= {self.min}"
            raise ProgramError(f"symbol {self.name!r} = {value} is outside its bounds {bound}")
        return value


@dataclass(frozen=True)
class TensorType:
    """A named tensor: shape and dtype. ``dim_names`` optionally names its dims.

    ``dynamic`` pairs a dim index with the symbol naming its run-time size; ``shape`` holds
    that symbol's planning size there.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    dim_names: tuple[str, ...] = ()
    dynamic: tuple[tuple[int, str], ...] = ()

    def __post_init__(self) -> None:
        check_name(self.name, "tensor")
        check_dtype(self.dtype, f"tensor {self.name!r}")
        if len(self.shape) > MAX_DIMS:
            raise ProgramError(f"tensor {self.name!r} has rank {len(self.shape)}; at most "
                               f"{MAX_DIMS} dims are supported (numpy's limit on an array's "
                               "rank)")
        for i, s in enumerate(self.shape):
            if not isinstance(s, int) or s <= 0:
                raise ProgramError(
                    f"tensor {self.name!r}: dim {i} has size {s!r}; must be positive")
        if self.dim_names and len(self.dim_names) != len(self.shape):
            raise ProgramError(f"tensor {self.name!r}: {len(self.dim_names)} dim names for "
                               f"rank {len(self.shape)}")
        for i, _ in self.dynamic:
            if not 0 <= i < len(self.shape):
                raise ProgramError(f"tensor {self.name!r}: symbolic dim {i} out of rank "
                                   f"{len(self.shape)}")

    @property
    def symbols(self) -> dict[int, str]:
        """Dim index -> the symbol naming its run-time size."""
        return dict(self.dynamic)

    def shape_text(self) -> list[int | str]:
        """The shape as the program format writes it: symbols by name."""
        sym = self.symbols
        return [sym.get(i, s) for i, s in enumerate(self.shape)]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class LoopLevel:
    """One counted loop of a tiling group: ``count`` iterations over ``dims``.

    ``count`` is an int, or a name for a count known only at run time. A symbolic count may be
    bounded: ``min`` (default 1) and ``max`` (default none: the target's ``max_loop_count``).
    The planner sizes every tile for the smallest value the count can take (see pass
    ``coarse_tile``), so a run takes any count in the bounds that divides the tiled dims.
    """

    count: int | str
    dims: tuple[str, ...]
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int | str):
            raise ProgramError(f"loop count must be an int or a symbol name, got {self.count!r}")
        if isinstance(self.count, int) and self.count <= 0:
            raise ProgramError(f"loop count must be positive, got {self.count}")
        if isinstance(self.count, str) and not self.count.isidentifier():
            raise ProgramError(f"symbolic loop count {self.count!r} must be an identifier")
        if not self.dims:
            raise ProgramError("a loop level must tile at least one dim")
        for what, v in (("min", self.min), ("max", self.max)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ProgramError(f"loop count {self.count!r}: {what} must be an int >= 1, "
                                   f"got {v!r}")
        if isinstance(self.count, int) and (self.min != 1 or self.max is not None):
            raise ProgramError(f"loop count {self.count}: bounds (min, max) belong to a "
                               "symbolic count only")
        if self.max is not None and self.max < self.min:
            raise ProgramError(f"loop count {self.count!r}: max {self.max} is below min "
                               f"{self.min}")


@dataclass(frozen=True)
class TilingGroup:
    """A contiguous run of ops wrapped in nested counted loops, outermost level first.

    Every op sits in every level unless ``depths`` says otherwise: ``(op, d)`` puts ``op`` in
    the outer ``d`` levels only, so it runs once per iteration of those, next to the inner
    loops of its neighbours (consecutive ops deeper than ``d`` share one inner loop).
    """

    ops: tuple[str, ...]
    loops: tuple[LoopLevel, ...]
    depths: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.ops:
            raise ProgramError("a tiling group needs at least one op")
        if not self.loops:
            raise ProgramError(f"tiling group {list(self.ops)} has no loop levels")
        seen: set[str] = set()
        for name, d in self.depths:
            if name not in self.ops:
                raise ProgramError(f"tiling group {list(self.ops)}: depths name op {name!r}, "
                                   "which is not in the group")
            if name in seen:
                raise ProgramError(f"tiling group {list(self.ops)}: depth of op {name!r} is "
                                   "given twice")
            seen.add(name)
            if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= len(self.loops):
                raise ProgramError(f"tiling group {list(self.ops)}: op {name!r} depth {d!r} "
                                   f"must be an int in 1..{len(self.loops)} (its loop levels)")

    def depth(self, op: str) -> int:
        """How many of the group's levels (outermost first) ``op`` sits in."""
        return dict(self.depths).get(op, len(self.loops))


#: the ``split_k`` pin meaning "the target's resolver decides"
SPLIT_K_AUTO = "?"


@dataclass(frozen=True)
class SplitKPin:
    """A split-K pin given per reduction dim: its slices, or its tile size (the elements in one
    slice). Dim ``""`` is the dim the split-K pass would split (the op's widest reduction dim),
    as in ``{"mm": {"tile": 512}}``; ``{"conv": {"slices": {"c": 4, "kh": 3}}}`` names dims.

    >>> SplitKPin(tiles=(("", 512),)).to_doc(), SplitKPin(slices=(("c", 4),)).to_doc()
    ({'tile': 512}, {'slices': {'c': 4}})
    """

    slices: tuple[tuple[str, int], ...] = ()
    tiles: tuple[tuple[str, int], ...] = ()

    def to_doc(self) -> dict[str, object]:
        """The pin as the program format writes it."""
        if self.tiles:
            return {"tile": self.tiles[0][1]} if self.tiles[0][0] == "" else {
                "tile": dict(self.tiles)}
        return {"slices": dict(self.slices)}


@dataclass(frozen=True)
class Program:
    """An ordered list of ops over named tensors.

    >>> from apportion.frontend.json_format import loads
    >>> p = loads('{"format": "apportion.program/1", "name": "t", '
    ...   '"tensors": {"x": {"shape": [4, 8], "dtype": "float16"}}, "inputs": ["x"], '
    ...   '"outputs": ["y"], "ops": [{"name": "e", "op": "exp", "out": "y[i,j]", '
    ...   '"ins": ["x[i,j]"]}]}')
    >>> p.tensor("y").shape
    (4, 8)
    """

    name: str
    tensors: tuple[TensorType, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ops: tuple[Op, ...]
    tiling: tuple[TilingGroup, ...] = ()
    work_division: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = field(default=())
    #: pinned split-K factors: op -> slices of its reduction, ``"?"`` (the target's resolver
    #: decides) or a ``SplitKPin`` (slices or tile sizes per dim); the target decides the others
    split_k: tuple[tuple[str, int | str | SplitKPin], ...] = ()
    #: dim sizes known only at run time (``TensorType.dynamic`` names them)
    symbols: tuple[Symbol, ...] = ()

    def __post_init__(self) -> None:
        check_name(self.name, "program")
        validate(self)

    @cached_property
    def tensor_map(self) -> dict[str, TensorType]:
        return {t.name: t for t in self.tensors}

    def tensor(self, name: str) -> TensorType:
        try:
            return self.tensor_map[name]
        except KeyError:
            raise ProgramError(f"program {self.name!r} has no tensor {name!r}") from None

    @cached_property
    def op_map(self) -> dict[str, Op]:
        return {o.name: o for o in self.ops}

    def op(self, name: str) -> Op:
        try:
            return self.op_map[name]
        except KeyError:
            valid = ", ".join(self.op_map)
            raise ProgramError(f"program {self.name!r} has no op {name!r}; ops: {valid}") from None

    @cached_property
    def producer_map(self) -> dict[str, Op]:
        """Tensor -> the op writing it (inputs have none). Built once: passes ask per tensor,
        and a scan of every op per question made planning quadratic in the program's size.
        Read-only by convention, like ``tensor_map`` (a plain dict, so a Program pickles)."""
        return {o.out.tensor: o for o in self.ops}

    @cached_property
    def consumer_map(self) -> dict[str, tuple[Op, ...]]:
        """Tensor -> the ops reading it, in program order, each once however many operands
        read it (tensors nobody reads are absent). Built once, as ``producer_map``."""
        readers: dict[str, list[Op]] = {}
        for o in self.ops:
            for t in dict.fromkeys(a.tensor for a in o.ins):
                readers.setdefault(t, []).append(o)
        return {t: tuple(ops) for t, ops in readers.items()}

    @cached_property
    def output_set(self) -> frozenset[str]:
        """``outputs`` as a set, for membership tests per tensor."""
        return frozenset(self.outputs)

    @cached_property
    def op_positions(self) -> dict[str, int]:
        """Op name -> its index in ``ops`` (program order)."""
        return {o.name: i for i, o in enumerate(self.ops)}

    def with_group(self, index: int, group: TilingGroup) -> Program:
        """This program with tiling group ``index`` replaced by ``group`` over the same ops
        (other loop counts, as auto-tiling tries them): equal to ``replace(self, tiling=...)``,
        without validating the ops and tensors again and keeping the indexes built so far,
        none of which depends on the tiling (a trial per candidate must not cost the whole
        program)."""
        tiling = (*self.tiling[:index], group, *self.tiling[index + 1:])
        if self.symbols or group.ops != self.tiling[index].ops:
            return replace(self, tiling=tiling)  # validation looks at grouped ops here
        new = copy.copy(self)  # the fields and every cached index (none depends on tiling)
        object.__setattr__(new, "tiling", tiling)
        return new

    def producer(self, tensor: str) -> Op | None:
        return self.producer_map.get(tensor)

    def consumers(self, tensor: str) -> tuple[Op, ...]:
        return self.consumer_map.get(tensor, ())

    @cached_property
    def pins(self) -> dict[str, dict[str, int]]:
        return {op: dict(splits) for op, splits in self.work_division}

    @cached_property
    def split_k_pins(self) -> dict[str, int | str | SplitKPin]:
        return dict(self.split_k)

    @cached_property
    def symbol_map(self) -> dict[str, Symbol]:
        return {s.name: s for s in self.symbols}

    @cached_property
    def dim_symbols(self) -> dict[str, dict[str, str]]:
        """Op -> {its dim: the symbol naming that dim's run-time size}, for symbolic dims."""
        return {op.name: _op_symbols(op, self.tensor_map) for op in self.ops}

    def planning_sizes(self) -> dict[str, int]:
        """Symbol -> the size the program is planned at."""
        return {s.name: s.planning_size for s in self.symbols}

    def bind(self, sizes: Mapping[str, int] | None = None) -> Program:
        """This program with every symbol replaced by its size in ``sizes`` (default: its
        planning size): a program with static shapes only.

        >>> from apportion.frontend.json_format import loads
        >>> p = loads('{"format": "apportion.program/1", "name": "t", "symbols": {"K": '
        ...   '{"max": 64}}, "tensors": {"x": {"shape": [4, "K"], "dtype": "float32"}}, '
        ...   '"inputs": ["x"], "outputs": ["y"], "ops": [{"name": "s", "op": "sum", '
        ...   '"out": "y[m]", "ins": ["x[m,k]"]}]}')
        >>> p.tensor("x").shape, p.bind({"K": 8}).op("s").sizes
        ((4, 64), {'m': 4, 'k': 8})
        """
        if not self.symbols:
            if sizes:
                raise ProgramError(f"program {self.name!r} has no symbolic sizes; got "
                                   f"{sorted(sizes)}")
            return self
        given = dict(sizes or {})
        unknown = sorted(set(given) - set(self.symbol_map))
        if unknown:
            raise ProgramError(f"program {self.name!r} has no symbol {unknown[0]!r}; its "
                               f"symbols: {', '.join(self.symbol_map)}")
        values = {name: sym.check(given.get(name, sym.planning_size))
                  for name, sym in self.symbol_map.items()}
        tensors = tuple(replace(t, shape=tuple(values[t.symbols[i]] if i in t.symbols else n
                                               for i, n in enumerate(t.shape)), dynamic=())
                        for t in self.tensors)
        ops = tuple(replace(op, dims=tuple((d, values[syms[d]] if d in syms else n)
                                           for d, n in op.dims))
                    for op in self.ops for syms in (self.dim_symbols[op.name],))
        return replace(self, tensors=tensors, ops=ops, symbols=())


def validate(p: Program) -> None:
    """Check names, shapes against dims, single definition, order (no cycles) and index bounds."""
    tmap: dict[str, TensorType] = {}
    for t in p.tensors:
        if t.name in tmap:
            raise ProgramError(f"tensor {t.name!r} is declared twice")
        tmap[t.name] = t
    defined: set[str] = set()
    for name in p.inputs:
        if name not in tmap:
            raise ProgramError(f"input {name!r} has no entry in tensors (shape and dtype)")
        if name in defined:
            raise ProgramError(f"input {name!r} is listed twice")
        defined.add(name)
    _check_symbols(p, tmap)
    names: set[str] = set()
    for op in p.ops:
        if op.name in names:
            raise ProgramError(f"op name {op.name!r} is used twice")
        names.add(op.name)
        for acc in op.ins:
            if acc.tensor not in defined:
                later = any(o.out.tensor == acc.tensor for o in p.ops)
                why = "is produced by a later op (a cycle or an out-of-order program)" if later \
                    else "is neither an input nor produced by an op"
                raise ProgramError(f"op {op.name!r}: tensor {acc.tensor!r} {why}")
            _check_access(op, acc.tensor, acc.index, tmap[acc.tensor], read=True)
        if op.out.tensor in defined:
            raise ProgramError(f"op {op.name!r}: tensor {op.out.tensor!r} is defined twice")
        if op.out.tensor not in tmap:
            raise ProgramError(f"op {op.name!r}: output {op.out.tensor!r} has no type")
        _check_access(op, op.out.tensor, op.out.index, tmap[op.out.tensor])
        _check_constant(op, tmap[op.out.tensor])
        defined.add(op.out.tensor)
    for name in p.outputs:
        if name not in defined:
            raise ProgramError(f"output {name!r} is never produced")
    for name in tmap:
        if name not in defined:
            raise ProgramError(f"tensor {name!r} is declared but neither an input nor produced")
    for op_name, factor in p.split_k:
        if op_name not in names:
            raise ProgramError(f"split_k pins unknown op {op_name!r}")
        if isinstance(factor, SplitKPin):
            _check_split_k_pin(p.op_map[op_name], factor)
        elif factor != SPLIT_K_AUTO and (isinstance(factor, bool) or not isinstance(factor, int)
                                         or factor < 1):
            raise ProgramError(f"split_k for op {op_name!r} must be an int >= 1, \"?\" or "
                               f"{{\"tile\": n}}, got {factor!r}")
        if op_name in p.pins:
            raise ProgramError(f"op {op_name!r} is pinned by both work_division and split_k; "
                               "give its reduction split in one of them")
    for op_name, splits in p.work_division:
        if op_name not in names:
            raise ProgramError(f"work_division pins unknown op {op_name!r}")
        op = p.op_map[op_name]
        for d, _ in splits:
            if d not in op.sizes:
                raise ProgramError(f"work_division for op {op_name!r}: unknown dim {d!r}; "
                                   f"dims: {', '.join(op.dim_names)}")


def with_symbols(program: Program, seeds: Mapping[str, Mapping[int, str]],
                 symbols: tuple[Symbol, ...]) -> Program:
    """``program`` with the input axes in ``seeds`` (tensor -> axis -> symbol) sized by
    ``symbols``, and every axis an op writes with a dim that reads a symbolic axis alone sized
    by the same symbol, in program order. The shapes must already hold the planning sizes;
    validation refuses a symbolic size used any other way (in a sum, against a static axis).

    >>> from apportion.frontend.json_format import loads
    >>> p = loads('{"name": "t", "tensors": {"x": {"shape": [8, 4], "dtype": "float32"}},'
    ...   '"inputs": ["x"], "outputs": ["y"], "ops": [{"name": "e", "op": "exp", '
    ...   '"out": "y[b,c]", "ins": ["x[b,c]"]}]}')
    >>> with_symbols(p, {"x": {0: "B"}}, (Symbol("B", max=8),)).tensor("y").symbols
    {0: 'B'}
    """
    dynamic: dict[str, dict[int, str]] = {t: dict(axes) for t, axes in seeds.items()}
    for op in program.ops:
        dims: dict[str, str] = {}
        for acc in op.ins:
            for i, e in enumerate(acc.index):
                sym = dynamic.get(acc.tensor, {}).get(i)
                if sym is not None and e.single_dim is not None:
                    dims.setdefault(e.single_dim, sym)
        for i, e in enumerate(op.out.index):
            if e.single_dim in dims:
                dynamic.setdefault(op.out.tensor, {})[i] = dims[e.single_dim]
    tensors = tuple(replace(t, dynamic=tuple(sorted(dynamic.get(t.name, {}).items())))
                    for t in program.tensors)
    return replace(program, tensors=tensors, symbols=tuple(symbols))


def _op_symbols(op: Op, tensors: Mapping[str, TensorType]) -> dict[str, str]:
    """{dim: symbol} for the dims of ``op`` that index a symbolic tensor dim."""
    out: dict[str, str] = {}
    for acc in op.operands:
        if acc.tensor not in tensors:  # validation names the missing tensor
            continue
        syms = tensors[acc.tensor].symbols
        for i, e in enumerate(acc.index):
            if i in syms and e.single_dim is not None:
                out.setdefault(e.single_dim, syms[i])
    return out


def _check_symbols(p: Program, tmap: Mapping[str, TensorType]) -> None:
    """Symbols are declared, tensors hold their planning sizes, and every access of a symbolic
    tensor dim is one op dim of that symbol (and every use of that op dim is symbolic too), so
    binding a size changes shapes and op dims together."""
    declared = {s.name: s for s in p.symbols}
    if len(declared) != len(p.symbols):
        raise ProgramError(f"program {p.name!r} declares a symbol twice")
    for t in p.tensors:
        for i, sym in t.dynamic:
            if sym not in declared:
                raise ProgramError(f"tensor {t.name!r} dim {i} is sized by undeclared symbol "
                                   f"{sym!r}")
            if t.shape[i] != declared[sym].planning_size:
                raise ProgramError(f"tensor {t.name!r} dim {i}: symbol {sym!r} is planned at "
                                   f"{declared[sym].planning_size}, the shape says {t.shape[i]}")
    used = {sym for t in p.tensors for _, sym in t.dynamic}
    unused = [n for n in declared if n not in used]
    if unused:  # a --param for it would bind nothing: a misspelt shape, most likely
        raise ProgramError(f"program {p.name!r} declares symbol {unused[0]!r} but no tensor's "
                           "shape uses it; size a tensor dim with it or drop it")
    if not declared:
        return
    for op in p.ops:
        syms = _op_symbols(op, tmap)
        for acc in op.operands:
            t = tmap.get(acc.tensor)
            if t is None or len(acc.index) != t.rank:  # validation names these
                continue
            for i, e in enumerate(acc.index):
                sym = t.symbols.get(i)
                if sym is not None and (e.single_dim is None or syms[e.single_dim] != sym):
                    raise ProgramError(
                        f"op {op.name!r}: tensor {acc.tensor!r} dim {i} has symbolic size "
                        f"{sym!r}; index it with one dim of that size, not "
                        f"{e.to_source()!r}")
                used = [d for d in e.dims if d in syms]
                if sym is None and used:
                    raise ProgramError(
                        f"op {op.name!r}: dim {used[0]!r} has symbolic size {syms[used[0]]!r} "
                        f"but indexes dim {i} of tensor {acc.tensor!r}, whose size is static; "
                        f"give that dim the size {syms[used[0]]!r} too")


_INT_DTYPES = frozenset({"int8", "int32", "int64"})


def _check_constant(op: Op, t: TensorType) -> None:
    """Refuse a constant (an op without inputs: ``fill``, ``full``, ``arange``) whose literal
    values an integer output cannot hold: one that is not finite or, truncated toward zero,
    outside the dtype's range (an ``arange``'s first and last value at the tensor's size).
    Computed values convert by saturating (``runtime.kernels.saturate``); a number the program
    itself writes is refused rather than silently clamped."""
    if op.ins or t.dtype not in _INT_DTYPES:
        return
    attrs = op.kind.numeric_attrs(dict(op.attrs))
    if op.kind.name == "arange":
        start, step = attrs.get("start", 0.0), attrs.get("step", 1.0)
        last = 1
        for n in t.shape:
            last *= n
        values = [start, start + step * max(last - 1, 0)]
    else:
        values = [attrs[k] for k in ("value",) if k in attrs]
    bits = 8 * dtype_bytes(t.dtype)
    for v in values:
        if not math.isfinite(v) or not -(2 ** (bits - 1)) <= math.trunc(v) < 2 ** (bits - 1):
            raise ProgramError(f"op {op.name!r} writes {v!r}, which tensor {t.name!r} of dtype "
                               f"{t.dtype} cannot hold ({-(2 ** (bits - 1))}.."
                               f"{2 ** (bits - 1) - 1})")


def _check_access(op: Op, tensor: str, index: tuple, t: TensorType, read: bool = False) -> None:
    if len(index) != t.rank:
        raise ProgramError(f"op {op.name!r}: tensor {tensor!r} has rank {t.rank} but is indexed "
                           f"with {len(index)} indices")
    for i, (e, size) in enumerate(zip(index, t.shape, strict=True)):
        if e.single_dim is not None:
            if op.sizes[e.single_dim] != size and not _leading_slice(op, e.single_dim, t, i,
                                                                     read):
                raise ProgramError(
                    f"op {op.name!r}: dim {e.single_dim!r} has size {op.sizes[e.single_dim]} but "
                    f"indexes dim {i} of tensor {tensor!r} of size {size}")
        elif not e.terms:
            if e.const >= size:
                raise ProgramError(f"op {op.name!r}: index {e.const} out of range for dim {i} of "
                                   f"tensor {tensor!r} (size {size})")
        elif not read and e.max_value(op.sizes) + 1 != size:
            raise ProgramError(
                f"op {op.name!r}: output {tensor!r} dim {i} (size {size}) is written through "
                f"{e.to_source()}, which covers 0..{e.max_value(op.sizes)}; a merged write "
                "must cover its axis whole")
        elif e.max_value(op.sizes) >= size:
            raise ProgramError(
                f"op {op.name!r}: index {e.to_source()} of tensor {tensor!r} dim {i} reaches "
                f"{e.max_value(op.sizes)}, beyond its size {size}")


def _leading_slice(op: Op, dim: str, t: TensorType, axis: int, read: bool) -> bool:
    """True when ``dim`` alone reads the leading part of a larger static axis of ``t``
    (``x[:, :n]``: a chunk, a narrow at 0): allowed for the inputs of divisible ops, which
    read boxes; outputs are written whole and fallbacks read whole tensors."""
    return (read and op.kind.divisible and op.sizes[dim] < t.shape[axis]
            and axis not in t.symbols)


def _check_split_k_pin(op: Op, pin: SplitKPin) -> None:
    """A per-dim split-K pin names reduction dims of the op, once each, with ints >= 1 no
    larger than the dim (its sizes may be symbolic: their bounds are checked by the pass)."""
    where = f"split_k for op {op.name!r}"
    if bool(pin.slices) == bool(pin.tiles):
        raise ProgramError(f"{where}: give either slices or tile sizes per dim, got {pin!r}")
    what = "tile" if pin.tiles else "slices"
    given = pin.tiles or pin.slices
    seen: set[str] = set()
    for d, n in given:
        if d == "" and what == "tile" and len(given) == 1:
            pass
        elif d not in op.reduction_dims:
            raise ProgramError(f"{where}: {what} of dim {d!r}: not a reduction dim of the op "
                               f"(its reduction dims: {', '.join(op.reduction_dims) or 'none'})")
        if d in seen:
            raise ProgramError(f"{where}: dim {d!r} is given twice")
        seen.add(d)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ProgramError(f"{where}: {what} of dim {d or 'K'!r} must be an int >= 1, got "
                               f"{n!r}")
        size = op.sizes.get(d) if d else None
        if isinstance(size, int) and n > size:
            raise ProgramError(f"{where}: {what} {n} of dim {d!r} exceeds its size {size}")
