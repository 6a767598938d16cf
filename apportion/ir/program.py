"""Tensors, tiling groups and programs, with whole-program validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from apportion.errors import ProgramError
from apportion.ir.dtypes import check_dtype, check_name, dtype_bytes
from apportion.ir.op import Op


@dataclass(frozen=True)
class TensorType:
    """A named tensor: shape and dtype. ``dim_names`` optionally names its dims."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    dim_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_name(self.name, "tensor")
        check_dtype(self.dtype, f"tensor {self.name!r}")
        for i, s in enumerate(self.shape):
            if not isinstance(s, int) or s <= 0:
                raise ProgramError(
                    f"tensor {self.name!r}: dim {i} has size {s!r}; must be positive")
        if self.dim_names and len(self.dim_names) != len(self.shape):
            raise ProgramError(f"tensor {self.name!r}: {len(self.dim_names)} dim names for "
                               f"rank {len(self.shape)}")

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

    ``count`` is an int, or a name for a count known only at run time.
    """

    count: int | str
    dims: tuple[str, ...]

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int | str):
            raise ProgramError(f"loop count must be an int or a symbol name, got {self.count!r}")
        if isinstance(self.count, int) and self.count <= 0:
            raise ProgramError(f"loop count must be positive, got {self.count}")
        if isinstance(self.count, str) and not self.count.isidentifier():
            raise ProgramError(f"symbolic loop count {self.count!r} must be an identifier")
        if not self.dims:
            raise ProgramError("a loop level must tile at least one dim")


@dataclass(frozen=True)
class TilingGroup:
    """A contiguous run of ops wrapped in nested counted loops, outermost level first."""

    ops: tuple[str, ...]
    loops: tuple[LoopLevel, ...]

    def __post_init__(self) -> None:
        if not self.ops:
            raise ProgramError("a tiling group needs at least one op")
        if not self.loops:
            raise ProgramError(f"tiling group {list(self.ops)} has no loop levels")


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
    #: pinned split-K factors: op -> slices of its reduction (the target decides the others)
    split_k: tuple[tuple[str, int], ...] = ()

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

    def producer(self, tensor: str) -> Op | None:
        return next((o for o in self.ops if o.out.tensor == tensor), None)

    def consumers(self, tensor: str) -> tuple[Op, ...]:
        return tuple(o for o in self.ops if any(a.tensor == tensor for a in o.ins))

    @cached_property
    def pins(self) -> dict[str, dict[str, int]]:
        return {op: dict(splits) for op, splits in self.work_division}

    @cached_property
    def split_k_pins(self) -> dict[str, int]:
        return dict(self.split_k)


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
            _check_access(op, acc.tensor, acc.index, tmap[acc.tensor])
        if op.out.tensor in defined:
            raise ProgramError(f"op {op.name!r}: tensor {op.out.tensor!r} is defined twice")
        if op.out.tensor not in tmap:
            raise ProgramError(f"op {op.name!r}: output {op.out.tensor!r} has no type")
        _check_access(op, op.out.tensor, op.out.index, tmap[op.out.tensor])
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
        if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
            raise ProgramError(f"split_k for op {op_name!r} must be an int >= 1, got "
                               f"{factor!r}")
        if op_name in p.pins:
            raise ProgramError(f"op {op_name!r} is pinned by both work_division and split_k; "
                               "give its reduction split in one of them")
    for op_name, splits in p.work_division:
        if op_name not in names:
            raise ProgramError(f"work_division pins unknown op {op_name!r}")
        op = next(o for o in p.ops if o.name == op_name)
        for d, _ in splits:
            if d not in op.sizes:
                raise ProgramError(f"work_division for op {op_name!r}: unknown dim {d!r}; "
                                   f"dims: {', '.join(op.dim_names)}")


def _check_access(op: Op, tensor: str, index: tuple, t: TensorType) -> None:
    if len(index) != t.rank:
        raise ProgramError(f"op {op.name!r}: tensor {tensor!r} has rank {t.rank} but is indexed "
                           f"with {len(index)} indices")
    for i, (e, size) in enumerate(zip(index, t.shape, strict=True)):
        if e.single_dim is not None:
            if op.sizes[e.single_dim] != size:
                raise ProgramError(
                    f"op {op.name!r}: dim {e.single_dim!r} has size {op.sizes[e.single_dim]} but "
                    f"indexes dim {i} of tensor {tensor!r} of size {size}")
        elif not e.terms:
            if e.const >= size:
                raise ProgramError(f"op {op.name!r}: index {e.const} out of range for dim {i} of "
                                   f"tensor {tensor!r} (size {size})")
        elif e.max_value(op.sizes) >= size:
            raise ProgramError(
                f"op {op.name!r}: index {e.to_source()} of tensor {tensor!r} dim {i} reaches "
                f"{e.max_value(op.sizes)}, beyond its size {size}")
