"""Plans: per-op splits, loop nests and allocations; JSON (de)serialisation; per-core views."""

from apportion.plan.export import coefficient_splits as coefficient_splits
from apportion.plan.memory import Buffer as Buffer
from apportion.plan.memory import CombineOp as CombineOp
from apportion.plan.memory import CopyOp as CopyOp
from apportion.plan.memory import FinishOp as FinishOp
from apportion.plan.memory import GroupPlan as GroupPlan
from apportion.plan.memory import InitOp as InitOp
from apportion.plan.plan import LoopInfo as LoopInfo
from apportion.plan.plan import OpPlan as OpPlan
from apportion.plan.plan import Plan as Plan
from apportion.plan.serialize import from_json as from_json
from apportion.plan.serialize import to_json as to_json
from apportion.plan.tiles import core_boxes as core_boxes
from apportion.plan.tiles import tile_box as tile_box
from apportion.plan.views import core_slices as core_slices
