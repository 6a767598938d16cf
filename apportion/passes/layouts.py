"""Pass `layouts`: stick dims and planning units of every op.

A dim is a *stick dim* of an op when it indexes the innermost dim of some operand at a finer
step than one stick (its coefficient there is not a multiple of the operand's elements per
stick). Its planning unit is the fewest of its values that span whole sticks of every such
operand: ``eps / gcd(c, eps)`` for coefficient ``c`` and ``eps`` elements per stick (the lcm over
the operands). A dim read alone (``c = 1``) counts in sticks; the outer digit of a merge,
``t2[d1, 8*d2+d3]`` in float16 (64 per stick), counts in 8 values of ``d2`` (its inner digit
whole: one stick), not 64. Any split of it then hands every core whole sticks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.target.layout import DeviceLayout, device_layout
from apportion.target.target import Target


@dataclass(frozen=True)
class OpLayout:
    """Stick dims of an op and the elements in one planning unit of each of its dims."""

    op: str
    stick_dims: tuple[str, ...]
    unit_elems: tuple[tuple[str, int], ...]

    def units(self, sizes: dict[str, int]) -> dict[str, int]:
        per = dict(self.unit_elems)
        return {d: -(-n // per[d]) for d, n in sizes.items()}


def op_layout(op: Op, program: Program, target: Target) -> OpLayout:
    """Stick dims and unit sizes of ``op`` on ``target``.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.target import spyre
    >>> p = load("examples/mlp.json")
    >>> op_layout(p.op("gate"), p, spyre()).stick_dims
    ('n', 'k')
    """
    eps: dict[str, int] = {}
    for acc in op.operands:
        if not acc.index:
            continue
        e_op = target.elems_per_stick(program.tensor(acc.tensor).dtype)
        for d, c in acc.index[-1].terms:
            if c % e_op:
                # values of d per whole number of sticks: a coefficient of 8 fills a stick of
                # 64 with 8 values (a dim read alone, with 64)
                eps[d] = math.lcm(eps.get(d, 1), e_op // math.gcd(c, e_op))
    sticks = tuple(d for d in op.dim_names if d in eps)
    return OpLayout(op.name, sticks, tuple((d, eps.get(d, 1)) for d in op.dim_names))


@dataclass(frozen=True)
class Layouts:
    """The layouts pass's result: every op's stick dims and units, every tensor's device layout."""

    ops: Mapping[str, OpLayout]
    tensors: Mapping[str, DeviceLayout]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", MappingProxyType(dict(self.ops)))
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))


def layouts(program: Program, target: Target) -> Layouts:
    """The layouts pass: one OpLayout per op and one DeviceLayout per tensor.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.target import spyre
    >>> lay = layouts(load("examples/mlp.json"), spyre())
    >>> lay.ops["act"].stick_dims, lay.tensors["x"].shape
    (('n',), (16, 256, 64))
    """
    return Layouts({op.name: op_layout(op, program, target) for op in program.ops},
                   tensor_layouts(program, target))


def tensor_layouts(program: Program, target: Target) -> dict[str, DeviceLayout]:
    """Device layout of every tensor of the program."""
    return {t.name: device_layout(t.shape, t.dtype, target) for t in program.tensors}
