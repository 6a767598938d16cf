"""Plans: per-op splits, loop nests and allocations; JSON (de)serialisation; per-core views."""

from apportion.plans.export import coefficient_splits as coefficient_splits
from apportion.plans.memory import Buffer as Buffer
from apportion.plans.memory import CombineOp as CombineOp
from apportion.plans.memory import CopyOp as CopyOp
from apportion.plans.memory import FinishOp as FinishOp
from apportion.plans.memory import GroupPlan as GroupPlan
from apportion.plans.memory import InitOp as InitOp
from apportion.plans.plan import LoopInfo as LoopInfo
from apportion.plans.plan import OpPlan as OpPlan
from apportion.plans.plan import Plan as Plan
from apportion.plans.serialize import from_json as from_json
from apportion.plans.serialize import to_json as to_json
from apportion.plans.tiles import core_boxes as core_boxes
from apportion.plans.tiles import tile_box as tile_box
from apportion.plans.views import core_slices as core_slices
