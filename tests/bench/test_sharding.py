"""`apportion bench sharding`: the search on model blocks over meshes of 2, 4 and 8 devices."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from apportion.bench import sharding as bench_sharding
from apportion.cli.main import main
from apportion.frontend.models import load_models


@pytest.mark.slow
def test_blocks_of_a_model_are_searched_on_every_mesh(tmp_path):
    doc = load_models()
    doc["models"] = {"gpt2-small": doc["models"]["gpt2-small"]}
    f = tmp_path / "models.json"
    f.write_text(json.dumps(doc))
    console = Console(record=True, width=200)
    rows, fwd, measured = bench_sharding.run(str(f), console=console, forward=False)
    assert fwd == [] and measured is None
    assert [(r.block, r.devices) for r in rows] == [
        (b, n) for b in ("attention", "mlp") for n in (2, 4, 8, 4, 8)]
    for r in rows:
        assert 0 < r.predicted_us < r.one_device_us and r.solve_s > 0
    eight = [r for r in rows if r.devices == 8 and r.mesh == "tp=8"]
    assert all(r.speedup > 4 for r in eight)
    assert "sharding search: blocks" in console.export_text()


def test_the_sharding_suite_refuses_options_of_other_suites(capsys):
    assert main(["bench", "sharding", "--cores", "4"]) == 2
    assert "--cores is not an option of the sharding suite" in capsys.readouterr().err


class FakeSearch:
    """A search that takes made-up seconds on a fake clock: ``seconds[mesh]`` per call, in
    turn."""

    def __init__(self, seconds: dict[str, list[float]]) -> None:
        self.now = 0.0
        self.seconds = {k: iter(v) for k, v in seconds.items()}

    def clock(self) -> float:
        return self.now

    def __call__(self, program, mesh) -> str:
        self.now += next(self.seconds[mesh.spec()])
        return f"plan on {mesh.spec()}"


def test_the_forward_searches_are_timed_until_the_solve_goal_settles():
    from apportion.sharding.mesh import cards, cluster

    meshes = (cards(8), cluster(2, 4))
    quiet = FakeSearch({"tp=8": [2.0, 2.1, 2.0], "dp=2@node,tp=4": [6.0, 6.2, 6.1]})
    plans, m = bench_sharding.time_solves(None, meshes, quiet, quiet.clock, lambda: 0.5)
    assert plans == ["plan on tp=8", "plan on dp=2@node,tp=4"]
    assert m.stable and m.rounds == 3 and m.least == (2.0, 6.0)
    # one quiet round under the limit, the rest over it: too noisy to say, up to the cap
    noisy = FakeSearch({"tp=8": [2.0] * 6, "dp=2@node,tp=4": [9.5] + [10.5] * 5})
    _, m = bench_sharding.time_solves(None, meshes, noisy, noisy.clock, lambda: 0.5)
    assert not m.stable and m.rounds == bench_sharding.FORWARD_MAX_ROUNDS
    rows = [bench_sharding.ForwardRow("llama3-8b", 32, mesh.spec(), 934, 81, 1.0, 0, "", s,
                                      m.rounds) for mesh, s in zip(meshes, m.least, strict=True)]
    (goal,) = bench_sharding.forward_goals(rows, m)
    assert goal.inconclusive and goal.figure.startswith("9.50 s [9.50 s, 10.50 s]")
