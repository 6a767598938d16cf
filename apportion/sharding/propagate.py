"""Sharding propagation: the annotations completed over the program by the ops' indexing maps.

No search: starting from the annotated tensors, each op takes the strategy its neighbours
imply, as GSPMD propagates shardings. Forward, an op with inputs of known sharding considers
only strategies over the mesh axes those shardings (and its output's annotation) use, and
takes the one with the least resharding of its known operands, ties to the lower compute time
(a split parallel dim stays split on the output, a split reduction dim makes it partial).
Backward, an op whose output a chosen reader needs in some sharding (or an annotation fixes)
takes the strategy over those axes that makes it with the least resharding. The two passes
repeat until nothing changes; an op nothing reaches is replicated, as is an input nobody
places. An op of a tiling group considers only the strategies the group's counts divide on
every device (``plan.fits_tiling``). Where a reader needs another sharding than a tensor
has, the plan reshards it (``plan.build_plan``); an output is handed back as made, its
pending reductions done.

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.spec import Sharding
>>> p = load("examples/mlp.json")
>>> plan = propagate(p, parse("tp=4"), annotations={
...     "wg": Sharding(((), ("tp",))), "wu": Sharding(((), ("tp",))),
...     "wd": Sharding((("tp",), ()))})
>>> [plan.strategy(o).label for o in ("gate", "up", "act", "glu", "down")]
['n:tp', 'n:tp', 'n:tp', 'n:tp', 'k:tp']
>>> plan.collectives_text()
'1 all_reduce'
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.sharding.collectives import reshard_time
from apportion.sharding.mesh import Mesh, mesh_of
from apportion.sharding.plan import (
    CostModel,
    ShardingPlan,
    build_plan,
    default_target,
    read_us,
    tiled_granules,
    tiling_strategies,
)
from apportion.sharding.rules import OpSharding, op_strategies
from apportion.sharding.spec import (
    Sharding,
    annotations_given,
    annotations_of,
    check_annotations,
    program_of,
)
from apportion.target.target import Target


def _cost(program: Program, mesh: Mesh, op: Op, s: OpSharding, known: Mapping[str, Sharding],
          out_want: Sharding | None, cost: CostModel) -> tuple[float, float, int]:
    moved = 0.0
    for k, acc in enumerate(op.ins):
        if acc.tensor in known:  # a copy, or a read in place from the peers where cheaper
            moved += read_us(program, op, k, s, known[acc.tensor], mesh, cost.target)[0]
    if out_want is not None:
        t = program.tensor(op.out.tensor)
        if not out_want.partial:
            moved += reshard_time(t.shape, t.dtype, s.out, out_want, mesh)
        elif s.out != out_want:
            moved += float("inf")
    return moved, cost.compute_us(op, s), -len(s.axes)


def _pick(program: Program, mesh: Mesh, op: Op, options: tuple[OpSharding, ...],
          known: Mapping[str, Sharding], out_want: Sharding | None, cost: CostModel
          ) -> OpSharding:
    implied: set[str] = set()
    for acc in op.ins:
        if acc.tensor in known:
            implied |= set(known[acc.tensor].axes)
    if out_want is not None:
        implied |= set(out_want.axes)
    usable = [s for s in options if set(s.axes) <= implied]
    return min(usable, key=lambda s: _cost(program, mesh, op, s, known, out_want, cost))


def propagate(program: Any, mesh: Mesh, target: Target | None = None,
              annotations: Mapping[str, Sharding] | None = None) -> ShardingPlan:
    """The plan that propagation completes from the annotations (``ap.shard`` ones of a
    builder, and ``annotations``); see the module docstring."""
    start = time.perf_counter()
    annotations = annotations_given(annotations, "propagate")
    given = {**annotations_of(program), **(annotations or {})}
    prog = program_of(program, "propagate")
    mesh = mesh_of(mesh, "propagate")
    ann = check_annotations(prog, given, mesh)
    tgt = default_target(mesh, target)
    cost = CostModel(prog, mesh, tgt)
    tiled = tiled_granules(prog, tgt)
    options = {op.name: tiling_strategies(op, prog, mesh, tiled[op.name]) if op.name in tiled
               else op_strategies(op, prog, mesh) for op in prog.ops}
    chosen: dict[str, OpSharding] = {}
    known: dict[str, Sharding] = dict(ann)  # what a tensor is, as its readers see it
    wanted: dict[str, Sharding] = {}  # what a chosen reader needs of a tensor not yet known

    def choose(op: Op, s: OpSharding) -> None:
        chosen[op.name] = s
        if op.out.tensor not in ann:
            known[op.out.tensor] = s.out
        for k, acc in enumerate(op.ins):
            if acc.tensor not in known:
                wanted.setdefault(acc.tensor, s.ins[k])

    changed = True
    while changed:
        changed = False
        for op in prog.ops:  # forward
            if op.name in chosen or not any(a.tensor in known for a in op.ins):
                continue
            choose(op, _pick(prog, mesh, op, options[op.name], known, ann.get(op.out.tensor),
                             cost))
            changed = True
        for op in reversed(prog.ops):  # backward
            want = ann.get(op.out.tensor, wanted.get(op.out.tensor))
            if op.name in chosen or want is None:
                continue
            choose(op, _pick(prog, mesh, op, options[op.name], known, want, cost))
            changed = True
        for name in prog.inputs:  # an input a reader placed is known from now on
            if name not in known and name in wanted:
                known[name] = wanted[name]
                changed = True
    for op in prog.ops:
        if op.name not in chosen:
            chosen[op.name] = options[op.name][0]  # nothing reached it: replicated
    inputs = {n: known.get(n, Sharding.replicated(prog.tensor(n).rank)) for n in prog.inputs}
    outputs = {n: ann[n] if n in ann else
               (inputs[n] if n in inputs else chosen[prog.producer(n).name].out  # type: ignore
                ).without_partial() for n in prog.outputs}
    plan = build_plan(prog, mesh, tgt, chosen, inputs, outputs, ann, "propagate", 0.0, cost)
    return replace(plan, solve_s=time.perf_counter() - start)
