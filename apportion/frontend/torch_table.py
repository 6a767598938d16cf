"""The ATen lowering table's common parts: what a lowering function sees of its node (``Ctx``),
how it is registered (``registrar``), and the reading of torch's dtypes, shapes and dim
arguments.

A lowering is a function ``(cx, *args, **kwargs)`` that receives the node's arguments with
every input node replaced by its ``Value`` (``torch_lower``) and returns the node's value: a
``Value``, a tuple of them, or a Python number. Each module of lowerings (``torch_aten``,
``torch_layout``, ``torch_conv``) fills a table of its own with ``aten = registrar(LOWERINGS)``
and ``@aten("mm.default")``; ``torch_aten.LOWERINGS`` is the one table of them all, by target
name as ``str(node.target)`` prints it (``"aten.mm.default"``). ``DROPPED`` are the no-op
asserts, which lower to nothing.

This module imports torch only inside the functions that need it.

>>> table: dict[str, Lower] = {}
>>> aten = registrar(table)
>>> @aten("neg.default")
... def _neg(cx, x):
...     return cx.lw.elementwise("neg", [x])
>>> list(table), torch_dtype("torch.bfloat16"), dim_list(-1), dim_list([0, 2])
(['aten.neg.default'], 'bfloat16', [-1], [0, 2])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from apportion.errors import ProgramError
from apportion.frontend.torch_lower import Lowering, Value
from apportion.ir.dtypes import DTYPE_BYTES

__all__ = ["DROPPED", "Ctx", "Lower", "dim_list", "registrar", "static_shape", "torch_dtype"]

#: node targets that check something at export time and compute nothing
DROPPED = frozenset({
    "aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
    "aten._assert_async.default", "aten._assert_async.msg",
    "aten._functional_assert_async.msg", "aten._functional_assert_scalar.default",
    "aten.sym_constrain_range.default", "aten.sym_constrain_range_for_size.default",
})


def torch_dtype(dt: Any, what: str = "dtype") -> str:
    """An apportion dtype for a torch dtype (``torch.float32`` -> ``"float32"``)."""
    name = str(dt).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ProgramError(f"{what} {name} is not supported; apportion has "
                           f"{', '.join(DTYPE_BYTES)}")
    return name


def static_shape(shape: Sequence[Any]) -> tuple[int, ...]:
    """A torch shape of plain ints; a symbolic size is refused."""
    if not all(isinstance(n, int) for n in shape):
        raise ProgramError(f"shape {list(shape)} has a symbolic size; symbolic sizes are not "
                           "supported yet")
    return tuple(shape)


def dim_list(dim: Any) -> list[int] | None:
    """A torch dim argument (an int, a list of them, or None for every dim) as a list."""
    if dim is None:
        return None
    return [int(d) for d in dim] if isinstance(dim, list | tuple) else [int(dim)]


@dataclass
class Ctx:
    """What a lowering function sees: the program being built and the node being lowered."""

    lw: Lowering
    node: Any  # torch.fx.Node

    @property
    def val(self) -> Any:
        v = self.node.meta.get("val")
        return v[0] if isinstance(v, list | tuple) else v

    def dtype(self) -> str:
        return torch_dtype(self.val.dtype, "result dtype")

    def shape(self) -> tuple[int, ...]:
        return static_shape(self.val.shape)

    def promoted(self) -> str:
        """torch's promoted dtype of the node's first two arguments (tensors or numbers): the
        dtype a comparison compares in."""
        import torch

        args = []
        for a in self.node.args[:2]:
            meta = getattr(a, "meta", None)
            if meta is not None:  # a tensor, or a zero-dim one, which promotes like a number
                v = meta["val"]
                args.append(torch.empty((0,) if v.dim() else (), dtype=v.dtype))
            else:
                args.append(a)
        return torch_dtype(torch.result_type(*args))

    def operand(self, x: Value | float | int | bool, dtype: str) -> Value:
        """A tensor operand in ``dtype``: a cast, or a rank-0 constant for a Python number."""
        if isinstance(x, Value):
            return self.lw.cast(x, dtype)
        if not isinstance(x, int | float | bool):
            raise ProgramError(f"operand {x!r} is neither a tensor nor a number")
        return self.lw.scalar(x, dtype)


#: a lowering: (cx, *args, **kwargs) -> the node's value
Lower = Callable[..., Any]


def registrar(table: dict[str, Lower]) -> Callable[..., Callable[[Lower], Lower]]:
    """The decorator ``aten(*names)`` that registers a lowering in ``table`` for the targets
    ``aten.<name>`` (``"mm.default"``)."""
    def aten(*names: str) -> Callable[[Lower], Lower]:
        def register(fn: Lower) -> Lower:
            for n in names:
                table[f"aten.{n}"] = fn
            return fn
        return register
    return aten
