"""The CLI on a program with run-time sizes: plan report, --param sizes, errors."""

import json

import pytest

from apportion.cli.main import main

DOC = {"name": "dynk", "symbols": {"K": {"max": 65536}},
       "tensors": {"x": {"shape": [32, "K"], "dtype": "float32"},
                   "w": {"shape": ["K", 32], "dtype": "float32"}},
       "inputs": ["x", "w"], "outputs": ["y"],
       "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]", "ins": ["x[m,k]", "w[k,n]"]}]}


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "dynk.json"
    path.write_text(json.dumps(DOC))
    return str(path)


def test_plan_reports_the_planning_sizes_and_the_select_chain(program, capsys):
    assert main(["plan", program, "--target", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "planned at K=65536" in out
    assert "mm.partial: slices of K (gpu):" in out and "else 1" in out


@pytest.mark.parametrize("k", ["40960", "1000"])
def test_run_check_binds_a_size_given_as_a_param(program, k, capsys):
    assert main(["run", program, "--target", "gpu", "--check", "--param", f"K={k}"]) == 0
    out = capsys.readouterr().out
    assert f"K={k} (given)" in out and "matches the unplanned program" in out


def test_run_without_a_size_uses_the_planning_size(program, capsys):
    assert main(["run", program, "--cores", "4", "--check"]) == 0
    assert "K=65536 (planning size)" in capsys.readouterr().out


def test_a_size_outside_the_bounds_is_a_usage_error_naming_the_symbol(program, capsys):
    assert main(["run", program, "--param", "K=70000"]) == 2
    err = capsys.readouterr().err
    assert "--param K=70000: symbol 'K' = 70000 is outside its bounds 1..65536" in err
    assert "Traceback" not in err


def test_an_unknown_param_lists_the_symbolic_sizes(program, capsys):
    assert main(["run", program, "--param", "Q=4"]) == 2
    assert "its symbolic sizes: K" in capsys.readouterr().err


def test_emit_bundle_of_a_symbolic_program_needs_its_sizes(program, capsys):
    assert main(["emit", program, "--bundle", "--cores", "4"]) == 2
    assert "pass --param K=N" in capsys.readouterr().err
    assert main(["emit", program, "--bundle", "--cores", "4", "--param", "K=4096"]) == 0
    assert "apportion.execute" in capsys.readouterr().out
    assert main(["emit", program, "--loopspec", "--cores", "4", "--param", "K=512"]) == 0


def test_a_planned_symbolic_program_at_sizes_is_static():
    import apportion as ap
    from apportion.errors import PlanningError
    from apportion.frontend.json_format import from_dict

    planned = ap.plan(from_dict(DOC), ap.targets.spyre(cores=4))
    with pytest.raises(PlanningError, match=r"run-time sizes \(K\).*\.at\("):
        planned.loopspec()
    at = planned.at({"K": 1024})
    assert at.program.tensor("x").shape == (32, 1024) and not at.symbols
    assert all(c.ok for c in at.check())
