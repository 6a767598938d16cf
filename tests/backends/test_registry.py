"""The one backend interface: the registry's names are what ``run(backend=)``, ``check(backend=)``
and ``apportion run --backend`` take; each backend says what it supports as documented limits;
an emitting or mesh-only backend is refused naming its limit; importing apportion imports no
backend's heavy dependency."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import apportion as ap
from apportion.backends import BACKENDS, Backend, get, require
from apportion.cli.main import main
from apportion.errors import ExecutionError
from apportion.limits import LIMITS_BY_ID, Unsupported, cited
from apportion.runtime import compare, random_inputs, run_unplanned

ROOT = Path(__file__).parents[2]


def fused(cores: int = 8):
    return ap.plan(ap.load(ROOT / "examples/fused.json"), ap.targets.spyre(cores=cores))


def test_the_registry_names_every_backend_once_in_order():
    assert list(BACKENDS) == ["reference", "torch", "iree", "bundle", "dtensor", "openmp",
                              "cuda"]
    assert len(BACKENDS) == 7 and "numpy" not in BACKENDS
    for name, backend in BACKENDS.items():
        assert isinstance(backend, Backend) and backend.name == name
    assert [get(n).does for n in BACKENDS] == ["run", "run", "run", "emit", "run", "run", "run"]


def test_an_unknown_backend_is_refused_listing_the_valid_names():
    for bad in ("tpu", None, 3, "Reference"):
        with pytest.raises(ExecutionError, match="unknown backend .*; valid: reference, torch, "
                                                 "iree, bundle, dtensor, openmp"):
            get(bad)
    with pytest.raises(ExecutionError, match="unknown backend 'tpu'; valid: reference, torch"):
        fused().run(backend="tpu")


def test_a_backend_runs_or_emits_not_both_and_may_run_meshes_only():
    with pytest.raises(ValueError, match="give run, emit or run_mesh"):
        Backend("x", "neither", lambda p: ())
    with pytest.raises(ValueError, match="not both"):
        Backend("x", "both", lambda p: (), run=lambda *a, **k: {}, emit=lambda p: "")
    assert Backend("x", "meshes", lambda p: (), run_mesh=lambda *a, **k: {}).does == "run"


def test_reference_torch_iree_and_openmp_run_meshes_and_the_emitter_does_not():
    assert [name for name in BACKENDS if BACKENDS[name].run_mesh is not None
            and name != "dtensor"] == ["reference", "torch", "iree", "openmp"]
    assert get("bundle").run_mesh is None


def test_every_backend_answers_for_a_mesh_schedule_and_the_emitter_cites_its_limit():
    from apportion.sharding.lower import lower_plan
    from apportion.sharding.mesh import parse
    from apportion.sharding.search import search

    schedule = lower_plan(search(ap.load(ROOT / "examples/megatron.json"), parse("tp=2")))
    for name in ("reference", "torch", "iree", "openmp"):
        assert get(name).supports(schedule) == (), name
    assert get("bundle").supports(schedule) == (LIMITS_BY_ID["bundle-emits-only"],)
    with pytest.raises(Unsupported, match="limit bundle-emits-only"):
        require(get("bundle"), schedule)


def test_importing_apportion_and_the_registry_imports_no_torch_iree_or_adapter():
    code = ("import sys, apportion, apportion.backends as b; list(b.BACKENDS); "
            "import apportion.cli.main; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'iree') "
            "or m.endswith('.adapter')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", ["reference", "torch", "iree"])
def test_each_running_backend_matches_the_unplanned_program(name):
    if name == "torch":
        pytest.importorskip("torch")
    planned = fused()
    xs = random_inputs(planned.program, seed=2)
    got = get(name).run(planned.lowered, xs)
    assert get(name).supports(planned) == ()
    assert set(planned.program.outputs) <= set(got)
    assert all(c.ok for c in compare(run_unplanned(planned.program, xs), got, planned.program))
    assert all(c.ok for c in planned.check(seed=2, backend=name))


def test_the_torch_backend_runs_run_time_sizes_at_the_size_asked():
    pytest.importorskip("torch")
    planned = ap.plan(ap.load(ROOT / "examples/dynamic_k.json"), ap.targets.spyre(cores=4))
    size = planned.symbols[0]
    checks = planned.check(params={size: 40}, backend="torch", threads=2)
    assert checks and all(c.ok for c in checks)


def test_bundle_emits_and_is_refused_as_a_runner_naming_its_limit():
    planned = fused()
    text = get("bundle").emit(planned)
    assert text == planned.bundle_mlir()
    with pytest.raises(ExecutionError, match=r"emits, it does not run.*"
                                             r"\[limit bundle-emits-only, docs/limits\.md\]"):
        planned.run(backend="bundle")
    with pytest.raises(ExecutionError, match=r"limit bundle-emits-only"):
        planned.check(backend="bundle")


def test_dtensor_refuses_a_plan_for_one_device_naming_its_limit():
    planned = fused()
    assert get("dtensor").supports(planned) == (LIMITS_BY_ID["dtensor-needs-mesh"],)
    with pytest.raises(Unsupported, match=r"backend 'dtensor' cannot run program 'fused'.*"
                                          r"\[limit dtensor-needs-mesh, docs/limits\.md\]") as e:
        planned.run(backend="dtensor")
    assert e.value.limits == (LIMITS_BY_ID["dtensor-needs-mesh"],)
    assert cited(str(e.value)) is LIMITS_BY_ID["dtensor-needs-mesh"]


def test_bundle_refuses_run_time_sizes_until_they_are_bound():
    from apportion.frontend.json_format import from_dict

    p = from_dict({"name": "dyn", "symbols": {"T": {"max": 64, "min": 8}},
                   "tensors": {"x": {"shape": [4, "T"], "dtype": "float32"}},
                   "inputs": ["x"], "outputs": ["z"],
                   "ops": [{"name": "s", "op": "sum", "out": "z[r]", "ins": ["x[r,t]"]}]})
    planned = ap.plan(p, ap.targets.spyre(cores=4))
    assert get("bundle").supports(planned) == (LIMITS_BY_ID["bundle-static-sizes"],)
    with pytest.raises(Unsupported, match="limit bundle-static-sizes"):
        require(get("bundle"), planned)
    assert get("bundle").supports(planned.at({"T": 16})) == ()
    with pytest.raises(ap.PlanningError, match="limit bundle-static-sizes"):
        planned.loopspec()


def test_iree_runs_random_numbers_beside_run_time_sizes():
    from apportion.frontend.json_format import from_dict

    # random numbers are made on the host before the module, at the run's sizes
    p = from_dict({"name": "dynu", "symbols": {"T": {"max": 64, "min": 8}},
                   "tensors": {"x": {"shape": [4, "T"], "dtype": "float32"}},
                   "inputs": ["x"], "outputs": ["z", "u"],
                   "ops": [{"name": "s", "op": "sum", "out": "z[r]", "ins": ["x[r,t]"]},
                           {"name": "u", "op": "uniform", "out": "u[a,b]", "ins": [],
                            "dims": {"a": 4, "b": 8}, "dtype": "float32", "low": 0.0,
                            "high": 1.0, "seed": 1}]})
    planned = ap.plan(p, ap.targets.spyre(cores=4))
    assert get("iree").supports(planned) == ()
    assert all(c.ok for c in planned.check(params={"T": 16}, backend="iree"))


def test_iree_supports_turns_a_cited_emitter_error_into_its_limit(monkeypatch):
    from apportion.backends.iree import adapter
    from apportion.limits import cite

    def refuse(*args, **kwargs):
        raise ap.EmitError(f"op 'x': no MLIR for it {cite('iree-kind-without-mlir')}")

    monkeypatch.setattr(adapter, "forall_mlir", refuse)
    assert get("iree").supports(fused()) == (LIMITS_BY_ID["iree-kind-without-mlir"],)

    def crash(*args, **kwargs):  # an error citing no limit is a bug: it is not hidden
        raise ap.EmitError("op 'x': something broke")

    monkeypatch.setattr(adapter, "forall_mlir", crash)
    with pytest.raises(ap.EmitError, match="something broke"):
        get("iree").supports(fused())


def test_cli_run_takes_exactly_the_registry_names(capsys):
    path = str(ROOT / "examples/mlp.json")
    with pytest.raises(SystemExit) as e:
        main(["run", path, "--backend", "tpu"])
    assert e.value.code == 2
    assert "choose from 'reference', 'torch', 'iree', 'bundle', 'dtensor'" in \
        capsys.readouterr().err


def test_cli_refuses_bundle_and_dtensor_without_a_mesh_naming_the_limit(capsys):
    path = str(ROOT / "examples/mlp.json")
    assert main(["run", path, "--backend", "bundle"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "emit --bundle" in err and "limit bundle-emits-only" in err
    assert main(["run", path, "--backend", "dtensor"]) == 2
    err = capsys.readouterr().err
    assert "give --mesh" in err and "limit dtensor-needs-mesh" in err


def test_cli_run_backend_torch_check_on_a_program_file(capsys):
    pytest.importorskip("torch")
    path = str(ROOT / "examples/attention.json")
    assert main(["run", path, "--cores", "8", "--backend", "torch", "--threads", "2",
                 "--check"]) == 0
    out = capsys.readouterr().out
    assert "planned run of attention (balanced, 8 cores, torch) matches the unplanned " \
           "program" in out
    assert main(["run", path, "--cores", "8", "--backend", "torch"]) == 0
    assert "ran 7 ops of attention over 8 cores with torch" in capsys.readouterr().out


def test_run_returns_numpy_storage_arrays_on_every_running_backend():
    pytest.importorskip("torch")
    planned = fused()
    xs = random_inputs(planned.program, seed=1)
    for name in ("reference", "torch"):
        out = planned.run(xs, backend=name)
        assert isinstance(out["z"], np.ndarray)
        assert out["z"].dtype == run_unplanned(planned.program, xs)["z"].dtype


def test_dtensor_takes_a_mesh_schedule_and_names_the_limit_it_cannot_express():
    pytest.importorskip("torch")
    from apportion.sharding.lower import lower_plan
    from apportion.sharding.mesh import parse
    from apportion.sharding.propagate import propagate
    from apportion.sharding.spec import Sharding

    program = ap.load(ROOT / "examples/mlp.json")
    plan = propagate(program, parse("tp=2"), annotations={"x": Sharding((("tp",), ()))})
    assert get("dtensor").supports(lower_plan(plan)) == ()
    assert get("dtensor").supports(plan) == (LIMITS_BY_ID["dtensor-needs-mesh"],)  # unlowered
    # a dim split over two axes out of mesh order: DTensor nests the cuts in mesh order
    mesh = parse("a=2,b=2")
    out_of_order = propagate(program, mesh, annotations={"x": Sharding((("b", "a"), ()))})
    assert get("dtensor").supports(lower_plan(out_of_order)) == \
        (LIMITS_BY_ID["dtensor-axes-in-mesh-order"],)


def test_iree_runs_a_mesh_schedule_as_per_device_modules():
    from apportion.sharding.lower import lower_plan
    from apportion.sharding.mesh import parse
    from apportion.sharding.propagate import propagate
    from apportion.sharding.spec import Sharding

    program = ap.load(ROOT / "examples/mlp.json")
    schedule = lower_plan(propagate(program, parse("tp=2"),
                                    annotations={"x": Sharding((("tp",), ()))}))
    assert get("iree").supports(schedule) == ()
    xs = random_inputs(program, seed=3)
    got = get("iree").run_mesh(schedule, xs)
    assert all(c.ok for c in compare(run_unplanned(program, xs), got, program))
    with pytest.raises(ExecutionError, match="runs by run_mesh"):
        get("iree").run(schedule, xs)


def test_a_backend_runs_the_schedule_it_is_given_and_lowers_nothing(monkeypatch):
    """``run`` takes the schedule of the run: a planned program lowers once, binds a run's
    sizes once per binding, and no backend lowers (IREE renders the lowered schedule)."""
    lowering = importlib.import_module("apportion.schedule.lower")
    planned = ap.plan(ap.load(ROOT / "examples/dynamic_k.json"), ap.targets.spyre(cores=4))
    module = planned.lowered
    calls = []
    real = lowering.lower

    def counted(*args, **kwargs):
        calls.append(args[0].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(lowering, "lower", counted)
    for name in ("reference", "torch", "iree"):
        if name == "torch" and importlib.util.find_spec("torch") is None:
            continue
        assert all(c.ok for c in planned.check(params={"K": 64}, backend=name)), name
    assert calls == ["dynamic_k"]  # the binding at K = 64, once for every backend
    assert planned.schedule({"K": 64}).unbound is module and planned.lowered is module


def test_cuda_is_registered_and_says_what_stops_it_here():
    from apportion.backends.cuda.adapter import has_gpu

    spyre = fused()
    assert get("cuda").supports(spyre) == (LIMITS_BY_ID["cuda-needs-gpu-target"],)
    gpu = ap.plan(ap.load(ROOT / "examples/fused.json"), ap.targets.gpu(cores=8))
    if has_gpu():
        assert get("cuda").supports(gpu) == ()
        return
    assert get("cuda").supports(gpu) == (LIMITS_BY_ID["cuda-needs-gpu"],)
    with pytest.raises(Unsupported, match=r"backend 'cuda' cannot run program 'fused'.*"
                                          r"\[limit cuda-needs-gpu, docs/limits\.md\]"):
        gpu.run(backend="cuda")


def test_cuda_refuses_a_mesh_schedule_naming_its_limit():
    from apportion.sharding.lower import lower_plan
    from apportion.sharding.mesh import parse
    from apportion.sharding.search import search

    schedule = lower_plan(search(ap.load(ROOT / "examples/mlp.json"), parse("tp=2")))
    assert get("cuda").supports(schedule) == (LIMITS_BY_ID["cuda-one-device"],)
    assert get("cuda").run_mesh is None
