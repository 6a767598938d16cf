"""``run --torch --check`` on bfloat16, float16 and mixed-precision models on every backend,
and the exit status of every way a ``run --torch`` can fail: 1 only ever for numbers that
differ, 2 with one error line (no traceback) for everything else."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import apportion.planned  # noqa: E402
from apportion.cli.main import main  # noqa: E402
from apportion.target.presets import resolve  # noqa: E402
from apportion.workflows import torch_model as torch_models  # noqa: E402

FACTORIES = '''
import torch

from apportion.frontend import torch_demo


def llama(dtype):
    model, ids = torch_demo.tiny_llama(layers=1, hidden=64, seq=8)
    return model.to(dtype), ids


def gpt2(dtype):
    model, ids = torch_demo.tiny_gpt2(layers=1, seq=8)
    return model.to(dtype), ids


def llama_bf16():
    return llama(torch.bfloat16)


def llama_fp16():
    return llama(torch.float16)


def gpt2_bf16():
    return gpt2(torch.bfloat16)


def gpt2_fp16():
    return gpt2(torch.float16)


class Mixed(torch.nn.Module):
    """bfloat16 linears between float32 norms, a float32 residual."""

    def __init__(self, width=64):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width).to(torch.bfloat16)
        self.down = torch.nn.Linear(4 * width, width).to(torch.bfloat16)
        self.out_norm = torch.nn.RMSNorm(width)

    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x).to(torch.bfloat16))))
        return self.out_norm(x + h.float())


def mixed():
    torch.manual_seed(0)
    return Mixed().eval(), (torch.randn(8, 64),)


def tiny():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 8).eval(), (torch.randn(2, 8),)


CALLS = [0]  # outside the module: torch.export restores a module's attributes, not this


class Counting(torch.nn.Module):
    """Adds the number of times it ran: the export sees 1, the eager run after it 2."""

    def __init__(self, fail_eagerly=False):
        super().__init__()
        self.fail_eagerly = fail_eagerly

    def forward(self, x):
        CALLS[0] += 1
        if self.fail_eagerly and CALLS[0] > 1:
            raise RuntimeError("the model broke on its second call")
        return x + float(CALLS[0])


def drifts():
    CALLS[0] = 0
    return Counting(), (torch.ones(4, 8),)


def eager_fails():
    CALLS[0] = 0
    return Counting(fail_eagerly=True), (torch.ones(4, 8),)


class DataDependent(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x


def data_dependent():
    return DataDependent(), (torch.ones(4, 8),)


def float64():
    return torch.nn.Linear(8, 8).double(), (torch.ones(2, 8, dtype=torch.float64),)


def int16():
    return torch.nn.Identity(), (torch.ones(2, 8, dtype=torch.int16),)


def broken():
    raise RuntimeError("no weights here")
'''


@pytest.fixture
def factory_dir(tmp_path, monkeypatch):
    (tmp_path / "dtypefactories.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_check(spec, *extra):
    return main(["run", "--torch", f"dtypefactories:{spec}", "--check", "--cores", "8", *extra])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["reference", "torch", "iree"])
@pytest.mark.parametrize(("spec", "dtype"), [("llama_bf16", "bfloat16"),
                                             ("gpt2_fp16", "float16")])
def test_run_torch_check_of_a_narrow_float_model_matches_eager_on_every_backend(
        factory_dir, spec, dtype, backend, capsys):
    assert run_check(spec, "--backend", backend) == 0
    out = capsys.readouterr().out
    assert f"4 {dtype} eps; atol at max |expected|" in out, out
    assert f"{backend}) matches the model run eagerly in PyTorch" in out


def test_a_mixed_model_checks_its_float32_output_at_bfloat16s_precision(factory_dir, capsys):
    assert run_check("mixed") == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "max abs err" in x)
    assert " float32 " in line and "4 bfloat16 eps" in line and line.endswith("ok")


@pytest.fixture(scope="module")
def loaded():
    """Each Hugging Face model in each narrow dtype, exported and lowered once."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        (Path(d) / "dtypefactories.py").write_text(FACTORIES)
        mp.chdir(d)
        yield {spec: torch_models.load_model(f"dtypefactories:{spec}")
               for spec in ("llama_bf16", "llama_fp16", "gpt2_bf16", "gpt2_fp16")}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["reference", "torch",
                                     pytest.param("iree", marks=pytest.mark.slow)])
@pytest.mark.parametrize("spec", ["llama_bf16", "llama_fp16", "gpt2_bf16", "gpt2_fp16"])
def test_llama_and_gpt2_in_bf16_and_fp16_match_eager_on_every_backend(loaded, spec, backend):
    tm = loaded[spec]
    dtype = "bfloat16" if spec.endswith("bf16") else "float16"
    assert tm.lowered.program.tensor(tm.lowered.outputs[0]).dtype == dtype
    planned = torch_models.plan_model(tm, resolve("spyre", 8), "balanced")
    (check,) = torch_models.check_model(tm, planned, backend)
    assert check.ok and check.dtype == dtype, check
    assert check.tolerance.basis.startswith(f"4 {dtype} eps")


# --- every failure of run --torch and its exit status ----------------------------------------

def _crash(*args, **kwargs):
    raise RuntimeError("a kernel crashed")


def _out_of_memory(*args, **kwargs):
    raise MemoryError("Unable to allocate 8.00 GiB")


#: (factory, extra arguments, what to break, exit status, what the error line says)
FAILURES = [
    ("tiny", [], None, 0, None),
    ("drifts", [], None, 1, "differs from the model run eagerly in PyTorch on add"),
    ("nomodule", [], None, 2, "cannot import module"),
    ("missing", [], None, 2, "has no callable 'missing'"),
    ("broken", [], None, 2, "broken() raised RuntimeError: no weights here"),
    ("data_dependent", [], None, 2, "torch.export.export of DataDependent failed"),
    ("float64", [], None, 2, "dtype float64 is not supported"),
    ("int16", [], None, 2, "dtype int16 is not supported"),
    ("tiny", ["--param", "n=2"], None, 2, "--param n=2: 'n' is not a run-time size of --torch"),
    ("tiny", ["--backend", "bundle"], None, 2, "--backend bundle emits"),
    ("tiny", [], ("export", _crash), 2,
     "exporting and lowering the model failed: RuntimeError: a kernel crashed"),
    ("tiny", [], ("run", _crash), 2, "the planned run failed: RuntimeError: a kernel crashed"),
    ("tiny", [], ("run", _out_of_memory), 2, "out of memory: Unable to allocate 8.00 GiB"),
    ("eager_fails", [], None, 2,
     "the eager run in PyTorch failed: RuntimeError: the model broke on its second call"),
]


@pytest.mark.parametrize(("spec", "extra", "breaks", "status", "message"), FAILURES,
                         ids=[f"{f[0]}-{f[3]}-{f[4] or 'ok'}"[:60] for f in FAILURES])
def test_run_torch_exits_1_only_for_differing_numbers_and_2_with_one_line_otherwise(
        factory_dir, monkeypatch, spec, extra, breaks, status, message, capsys):
    if breaks is not None:
        where, fn = breaks
        if where == "export":
            monkeypatch.setattr("apportion.frontend.torch_export.from_torch", fn)
        else:
            monkeypatch.setattr(apportion.planned.PlannedProgram, "run", fn)
    module = "dtypefactories" if spec != "nomodule" else "nosuchfactories"
    code = main(["run", "--torch", f"{module}:{spec}", "--check", "--cores", "2", *extra])
    out, err = capsys.readouterr()
    assert code == status, (out, err)
    if status == 2:
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith("apportion: error: ")
    elif status == 1:
        assert message in out and "MISMATCH" in out and not err
    else:
        assert "matches the model run eagerly in PyTorch" in out and not err
