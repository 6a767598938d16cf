"""Sharding over a device mesh: annotations, propagation, strategy search, per-device
programs, and their lowering to the mesh schedule every backend runs.

Work division (``ap.plan``) splits one device's work over its cores; sharding splits a program
over several devices. A ``ShardingPlan`` says for every tensor how it is laid out over the mesh
(``Sharding``), for every op what each device computes (``OpSharding``) and where data moves
(``Transfer``: resharding steps, collectives priced by the mesh's links). ``propagate``
completes the user's annotations along the ops' indexing maps; ``search`` chooses every op's
strategy as an integer program (HiGHS) for the least predicted time within each device's
memory. ``lower_plan`` lowers a plan to the ``MeshSchedule`` every backend's ``run_mesh`` runs
(the dtensor backend's with one process per device on ``torch.distributed``; the IREE backend
emits it too), through its per-device programs (``unroll``). A mesh axis size may be symbolic
(``dp=N~4``): plans are made at its planning size, and ``lower_plan`` binds it
(``sizes={"N": 2}``, ``ShardingPlan.bind``).

Modules: ``mesh`` (meshes, presets, TOML), ``spec`` (shardings, annotations, ``ap.shard``),
``collectives`` (resharding steps, their cost, numpy collectives), ``rules`` (per-op
strategies), ``plan`` (the plan value, costs, memory), ``propagate``, ``search``, ``unroll``
(per-device programs), ``lower`` (the mesh schedule), ``oracle`` (the per-device programs run
with numpy collectives: an independent check of the lowered path), ``upstream_check``
(upstream MLIR's propagation beside apportion's).
"""

from apportion.sharding.collectives import Step as Step
from apportion.sharding.lower import lower_plan as lower_plan
from apportion.sharding.mesh import PRESETS as PRESETS
from apportion.sharding.mesh import Axis as Axis
from apportion.sharding.mesh import Link as Link
from apportion.sharding.mesh import Mesh as Mesh
from apportion.sharding.mesh import load_toml as load_toml
from apportion.sharding.mesh import parse as parse_mesh
from apportion.sharding.mesh import resolve as resolve_mesh
from apportion.sharding.plan import ShardingPlan as ShardingPlan
from apportion.sharding.plan import Transfer as Transfer
from apportion.sharding.propagate import propagate as propagate
from apportion.sharding.rules import DeviceFinish as DeviceFinish
from apportion.sharding.rules import OpSharding as OpSharding
from apportion.sharding.rules import make_strategy as make_strategy
from apportion.sharding.rules import op_strategies as op_strategies
from apportion.sharding.search import search as search
from apportion.sharding.spec import Sharding as Sharding
from apportion.sharding.spec import annotations_of as annotations_of
from apportion.sharding.spec import load as load
from apportion.sharding.spec import loads as loads
from apportion.sharding.spec import shard as shard

__all__ = ["PRESETS", "Axis", "DeviceFinish", "Link", "Mesh", "Sharding", "ShardingPlan", "Step",
           "OpSharding", "Transfer", "annotations_of", "load", "load_toml", "loads",
           "make_strategy", "op_strategies", "lower_plan", "parse_mesh", "propagate",
           "resolve_mesh", "search", "shard"]
