"""The IREE backend runs the ops it has no parallel IR for (numpy's random numbers) on the host
between IREE modules; gathers and the other whole-tensor kinds are parallel IR."""

from __future__ import annotations

import numpy as np
import pytest

import apportion as ap
from apportion.backends.iree.run import iree_run
from apportion.errors import ExecutionError
from apportion.ir.op import Op
from apportion.mlir import bodies
from apportion.mlir.module import host_ops
from apportion.runtime import random_inputs, run_unplanned
from apportion.schedule.parts import segments
from tests.helpers import checked, program

torch = pytest.importorskip("torch")


def noise_program() -> ap.Program:
    """Random numbers (numpy's generator: a host step) between two runs of divisible ops."""
    return program(
        {"table": ([6, 64], "float32"), "w": ([64, 32], "float32")},
        [{"name": "scale", "op": "mul", "out": "t2[v,d]", "ins": ["table[v,d]", "table[v,d]"]},
         {"name": "noise", "op": "uniform", "out": "e[i,d]", "ins": [], "dims": {"i": 6, "d": 64},
          "seed": 3, "dtype": "float32"},
         {"name": "add", "op": "add", "out": "s[i,d]", "ins": ["t2[i,d]", "e[i,d]"]},
         {"name": "mm", "op": "matmul", "out": "y[i,n]", "ins": ["s[i,d]", "w[d,n]"]},
         {"name": "act", "op": "exp", "out": "z[i,n]", "ins": ["y[i,n]"]}],
        ["z", "t2"])


def test_random_numbers_are_made_first_and_the_other_ops_are_one_module():
    p = noise_program()
    planned = ap.plan(p, ap.targets.spyre(cores=8))
    assert host_ops(planned.program) == ("noise",)
    host, part = segments(planned.lowered, host_ops(planned.program))
    assert isinstance(host, Op) and host.name == "noise"  # reads nothing: made before
    assert [o.name for o in part.program.ops] == ["scale", "add", "mm", "act"]
    assert part.program.inputs == ("table", "e", "w") and part.program.outputs == ("t2", "z")
    assert [s.op for s in part.ops] == ["scale", "add", "mm", "act"]


def test_segments_cut_the_program_at_host_ops_that_read_tensors(monkeypatch):
    monkeypatch.delitem(bodies.BODIES, "mul")  # the scale runs on the host
    planned = ap.plan(noise_program(), ap.targets.spyre(cores=8))
    assert host_ops(planned.program) == ("scale", "noise")
    noise, scale, part = segments(planned.lowered, host_ops(planned.program))
    assert (noise.name, scale.name) == ("noise", "scale")
    assert part.program.inputs == ("t2", "e", "w") and part.program.outputs == ("z",)


@pytest.mark.parametrize("cores", [1, 8, 32])
def test_random_numbers_run_on_the_host_between_iree_modules(cores, tmp_path):
    p = noise_program()
    planned = ap.plan(p, ap.targets.spyre(cores=cores))
    inputs = random_inputs(planned.program, seed=2)
    run = iree_run(planned.lowered, inputs, cache_dir=tmp_path)
    want = run_unplanned(planned.program, inputs)
    for name in ("z", "t2"):
        np.testing.assert_allclose(run.tensors[name], want[name], rtol=1e-5, atol=1e-6)


def run_time_noise_program() -> ap.Program:
    doc = {"x": (["B", 64], "float32")}
    return program(doc, [{"name": "noise", "op": "uniform", "out": "e[i,d]", "ins": [],
                          "dims": {"i": 4, "d": 64}, "dtype": "float32"},
                         {"name": "act", "op": "add", "out": "z[b,d]",
                          "ins": ["x[b,d]", "e[0,d]"]}],
                   ["z", "e"], symbols={"B": {"max": 8}})


@pytest.mark.parametrize("size", [3, 8])
def test_random_numbers_beside_run_time_sizes_are_made_on_the_host_first(size, tmp_path):
    planned = ap.plan(run_time_noise_program(), ap.targets.spyre(cores=4))
    checks, run = checked(planned, lambda s, xs: iree_run(s, xs, tmp_path), 1, {"B": size})
    assert checks and all(c.ok for c in checks)
    assert run.tensors["z"].shape == (size, 64)


def test_run_time_sizes_with_host_ops_that_read_tensors_are_refused_naming_them(tmp_path,
                                                                                monkeypatch):
    monkeypatch.delitem(bodies.BODIES, "exp")
    p = program({"x": (["B", 64], "float32")},
                [{"name": "e", "op": "exp", "out": "y[b,d]", "ins": ["x[b,d]"]},
                 {"name": "n", "op": "neg", "out": "z[b,d]", "ins": ["y[b,d]"]}], ["z"],
                symbols={"B": {"max": 8}})
    planned = ap.plan(p, ap.targets.spyre(cores=4))
    with pytest.raises(ExecutionError, match=r"run-time sizes and host ops that read tensors "
                                             r"\(e\)"):
        checked(planned, lambda s, xs: iree_run(s, xs, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["tiny_llama", "tiny_gpt2"])
def test_hugging_face_models_run_in_iree_and_match_eager(factory, tmp_path):
    """Gathers and constants on the host; Llama's rotary embeddings read the query and key
    projections through 64*a+32*c+d, which the emitter gathers for IREE's sake."""
    pytest.importorskip("transformers")
    from apportion.frontend import torch_demo

    model, xs = getattr(torch_demo, factory)()
    tp = ap.from_torch(model, xs)
    planned = ap.plan(tp.program, ap.targets.spyre(cores=32))
    run = iree_run(planned.lowered, tp.inputs(*xs), cache_dir=tmp_path)
    got, = tp.torch_outputs(run.tensors)
    with torch.no_grad():
        want = model(*xs).logits.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_pow_of_negative_bases_and_edge_cases_matches_numpy_in_iree(tmp_path):
    p = program({"x": ([2, 8], "float32"), "y": ([2, 8], "float32")},
                [{"name": "p", "op": "pow", "out": "z[i,j]", "ins": ["x[i,j]", "y[i,j]"]}],
                ["z"])
    x = np.array([[-2, -2, -2, -0.5, 2, 0, -0.0, np.nan],
                  [-3, -1, 4, -np.inf, -np.inf, 1, -1, 0]], dtype=np.float32)
    y = np.array([[3, 2, 0.5, -2, 0.5, 0, 3, 2],
                  [1.5, np.nan, -1, 3, 2, np.inf, np.inf, -1]], dtype=np.float32)
    for cores in (1, 4):
        planned = ap.plan(p, ap.targets.spyre(cores=cores))
        got = iree_run(planned.lowered, {"x": x, "y": y}, cache_dir=tmp_path).tensors["z"]
        with np.errstate(all="ignore"):
            np.testing.assert_allclose(got, np.power(x, y), equal_nan=True)
