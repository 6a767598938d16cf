"""Plans of every example and built-in model program equal the golden ones written before the
op-kind registry refactor (regenerate with ``python tests/golden/generate.py`` only for a change
that is meant to change plans, and say so in the commit)."""

from __future__ import annotations

import json

import pytest

from tests.golden.generate import OUT, cases, plan_json

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plan_equals_golden_plan(case):
    stem, prog, strategy, cores, auto_tile = case
    golden = json.loads((OUT / f"{stem}.json").read_text())
    assert plan_json(prog, strategy, cores, auto_tile) == golden
