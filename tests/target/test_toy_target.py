"""A toy target preset, defined entirely here, with a cost term the model does not have.

The toy device is Spyre cut into chiplets of 8 cores: an op spread over more than one chiplet
pays a hop between them. The term is a ``CostTerm`` the target carries (``Target.cost_terms``),
so the preset touches no file of the package: not the cost model, not the search's lower bound
(``work_distribution``), not any list of presets or of target names. Registering it under a
name (``PRESETS``, as a plugin would at import) makes it a preset the TOML loader and
``resolve`` take, as the built-in ones."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

import apportion as ap
from apportion.errors import TargetError
from apportion.passes.geometry import OpContext
from apportion.passes.layouts import layouts, tensor_layouts
from apportion.passes.work_distribution import ranked
from apportion.target.presets import PRESETS
from apportion.target.split_k import ReductionShape, TargetResolver
from apportion.target.terms import CostTerm

ROOT = Path(__file__).parents[2]


@dataclasses.dataclass(frozen=True)
class ChipletHop(CostTerm):
    """Each chiplet an op spreads onto beyond the first costs ``hop_us``."""

    chiplet_cores: int = 8
    hop_us: float = 200.0

    def us(self, op, program, target, sizes, splits, largest) -> float:
        cores = math.prod(splits.get(d, 1) for d in sizes)
        return self.hop_us * (-(-cores // self.chiplet_cores) - 1)

    def least(self, op, program, target, sizes, assigned, small) -> float:
        # every completion uses at least the cores assigned so far
        return self.us(op, program, target, assigned, assigned, small)


@dataclasses.dataclass(frozen=True)
class LooseHop(ChipletHop):
    """The same term, bounded by 0 (``least``'s default): the search prunes less, as exactly."""

    def least(self, op, program, target, sizes, assigned, small) -> float:
        return CostTerm.least(self, op, program, target, sizes, assigned, small)


@dataclasses.dataclass(frozen=True)
class Halves(TargetResolver):
    """A split-K resolver of the toy preset's own: every reduction in two."""

    name = "halves"

    def decide(self, shape: ReductionShape, target, budget: int, unit: int):
        return 2, self.name


def toy(cores: int | None = None, hop_us: float = 200.0) -> ap.Target:
    """The toy preset: Spyre's figures, chiplets of 8 cores."""
    return dataclasses.replace(ap.targets.spyre(cores=cores), name="toy",
                               cost_terms=(ChipletHop(8, hop_us),))


def planned_cores(target: ap.Target, example: str = "mlp") -> dict[str, int]:
    planned = ap.plan(ap.load(ROOT / f"examples/{example}.json"), target)
    return {o.name: math.prod(o.split_map.values()) for o in planned.plan.ops}


def context(p: ap.Program, op_name: str, target: ap.Target) -> OpContext:
    op = p.op(op_name)
    return OpContext(op, p, target, layouts(p, target).ops[op.name], tensor_layouts(p, target),
                     dict(op.dims))


def test_a_cost_term_the_target_carries_changes_the_plan():
    spread = planned_cores(ap.targets.spyre(cores=32))
    assert max(spread.values()) > 8  # without the term the big ops span chiplets
    kept = planned_cores(toy(cores=32, hop_us=1e6))
    assert max(kept.values()) <= 8  # a hop dearer than any op: every op on one chiplet
    assert planned_cores(toy(cores=32, hop_us=0.0)) == spread


def test_the_plans_predicted_time_includes_the_term():
    target = toy(cores=32, hop_us=5.0)
    planned = ap.plan(ap.load(ROOT / "examples/mlp.json"), target)
    base = dataclasses.replace(target, cost_terms=())
    for o in planned.plan.ops:
        ctx = context(planned.program, o.name, target)
        hops = -(-math.prod(o.split_map.values()) // 8) - 1
        assert o.predicted_time_us == pytest.approx(
            context(planned.program, o.name, base).time_us(o.split_map) + 5.0 * hops)
        assert o.predicted_time_us == pytest.approx(ctx.time_us(o.split_map))


@pytest.mark.parametrize("term", [ChipletHop(8, 30.0), LooseHop(8, 30.0), ChipletHop(4, 2.0)])
@pytest.mark.parametrize("example", ["mlp", "attention", "softmax_tiled"])
def test_the_bounded_search_stays_exact_with_the_term(term, example):
    # the trap of a new term: a lower bound that assumes the model's own terms only would skip
    # the best assignment; the term's own bound (or 0) keeps the search the exhaustive one's
    target = dataclasses.replace(ap.targets.spyre(cores=32), name="toy", cost_terms=(term,))
    p = ap.load(ROOT / f"examples/{example}.json")
    for op in p.ops:
        ctx = context(p, op.name, target)
        ones = {d: 1 for d in ctx.sizes}
        assert ranked(ctx, ones, 3) == ranked(ctx, ones, 3, exhaustive=True), op.name


def test_a_registered_toy_preset_loads_from_toml_under_its_own_name(tmp_path, monkeypatch):
    monkeypatch.setitem(PRESETS, "toy", toy)
    assert ap.targets.resolve("toy", 16).cost_terms == (ChipletHop(),)
    path = tmp_path / "mine.toml"
    path.write_text('preset = "toy"\nname = "mine"\ncores = 16\n')
    mine = ap.targets.resolve(str(path))
    assert mine.name == "mine" and mine.cost_terms == (ChipletHop(),)
    assert planned_cores(mine) == planned_cores(toy(cores=16))


def test_a_target_resolver_of_its_own_decides_split_k():
    target = dataclasses.replace(toy(cores=16), split_k=Halves())
    planned = ap.plan(ap.load(ROOT / "examples/mlp.json"), target)
    decided = [o.split_k for o in planned.plan.ops if o.split_k is not None]
    assert decided and all(s.by == "halves" and s.factor == 2 for s in decided)


def test_a_term_of_negative_time_is_refused_naming_it():
    @dataclasses.dataclass(frozen=True)
    class Refund(CostTerm):
        def us(self, op, program, target, sizes, splits, largest) -> float:
            return -1.0

    target = dataclasses.replace(ap.targets.spyre(cores=8), cost_terms=(Refund(),))
    with pytest.raises(TargetError, match=r"cost term Refund gave -1.0 for op '\w+'.*>= 0"):
        ap.plan(ap.load(ROOT / "examples/mlp.json"), target)


@pytest.mark.parametrize("terms", [[ChipletHop()], (ChipletHop, ), ("hop",)])
def test_cost_terms_must_be_a_tuple_of_term_objects(terms):
    with pytest.raises(TargetError, match="cost_terms must be a tuple of CostTerm objects"):
        dataclasses.replace(ap.targets.spyre(), cost_terms=terms)


def test_a_toml_file_cannot_give_cost_terms(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('preset = "spyre"\ncost_terms = ["hop"]\n')
    with pytest.raises(TargetError, match=r"t\.toml.*cost_terms must be a tuple of CostTerm"):
        ap.targets.resolve(str(path))
