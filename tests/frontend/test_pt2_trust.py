"""A ``.pt2`` holding a part that would run code as ``torch.export.load`` (or the program's
``module()``) reads it is refused before torch reads that part, naming the file, the part and
``--trust-pt2``; what ``torch.export.save`` writes for an ordinary model loads as before. Each
crafted archive below would create a marker file when run: it never appears."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from apportion.cli.main import main
from apportion.errors import ProgramError

torch = pytest.importorskip("torch")

from apportion.frontend.pt2_trust import unsafe_part  # noqa: E402 - needs torch
from apportion.frontend.torch_export import TRUST_FLAG, load_exported  # noqa: E402


class _Touch:
    """Unpickled, creates the file ``path`` (``open(path, "w")``)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


class _Consts(torch.nn.Module):
    """A tensor constant and a string input: the parts an ordinary archive may hold."""

    def forward(self, x, mode: str = "floor"):
        return torch.div(x + torch.tensor([1.0, 2.0]), 2, rounding_mode=mode)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Archives ``torch.export.save`` wrote: the demo MLP static and with a dynamic row count,
    and a model with a tensor constant and a string input."""
    from apportion.frontend.torch_demo import mlp

    model, (x,) = mlp()
    folder = tmp_path_factory.mktemp("saved")
    rows = torch.export.Dim("rows", min=2, max=128)
    torch.export.save(torch.export.export(model, (x,)), folder / "mlp.pt2")
    torch.export.save(torch.export.export(model, (x,), dynamic_shapes=({0: rows},)),
                      folder / "mlp_rows.pt2")
    torch.export.save(torch.export.export(_Consts(), (torch.randn(3, 2),), {"mode": "trunc"}),
                      folder / "consts.pt2")
    return {p.stem: p for p in folder.iterdir()}


def _rewrite(src: Path, dst: Path, edit: Callable[[str, bytes], bytes | None],
             extra: dict[str, bytes] | None = None) -> Path:
    """``src`` with each entry (named without the archive's root folder) passed through
    ``edit`` (None drops it), and ``extra`` entries added."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        root = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            data = edit(info.filename.split("/", 1)[1], zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)
        for name, data in (extra or {}).items():
            zout.writestr(f"{root}/{name}", data)
    return dst


def _torch_pickle(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _edit_json(entry: str, change: Callable[[dict], None]) -> Callable[[str, bytes], bytes]:
    def edit(name: str, data: bytes) -> bytes:
        if name != entry:
            return data
        doc = json.loads(data)
        change(doc)
        return json.dumps(doc).encode()
    return edit


def _pickled_weight(saved: dict[str, Path], tmp: Path, mark: Path) -> tuple[Path, str]:
    def mark_pickled(doc: dict) -> None:
        doc["config"]["gate.weight"]["use_pickle"] = True

    weight = _edit_json("data/weights/model_weights_config.json", mark_pickled)

    def edit(name: str, data: bytes) -> bytes:
        return _torch_pickle(_Touch(mark)) if name == "data/weights/weight_0" else weight(name,
                                                                                        data)
    return _rewrite(saved["mlp"], tmp / "weight.pt2", edit), "data/weights/weight_0: weight " \
        "'gate.weight' stored as a pickle"


def _pickled_constant(saved: dict[str, Path], tmp: Path, mark: Path) -> tuple[Path, str]:
    def add(doc: dict) -> None:
        doc["config"]["extra"] = {"path_name": "opaque_obj_0", "is_param": False,
                                  "use_pickle": True, "tensor_meta": None}

    edit = _edit_json("data/constants/model_constants_config.json", add)
    extra = {"data/constants/opaque_obj_0": pickle.dumps(_Touch(mark))}
    return _rewrite(saved["mlp"], tmp / "constant.pt2", edit, extra), \
        "data/constants/opaque_obj_0: constant 'extra' stored as a pickle"


def _example_inputs(saved: dict[str, Path], tmp: Path, mark: Path) -> tuple[Path, str]:
    def edit(name: str, data: bytes) -> bytes:
        return _torch_pickle(_Touch(mark)) if name == "data/sample_inputs/model.pt" else data
    return _rewrite(saved["mlp"], tmp / "inputs.pt2", edit), \
        "data/sample_inputs/model.pt: a pickle that torch's restricted loader refuses"


def _sympy_eval(saved: dict[str, Path], tmp: Path, mark: Path) -> tuple[Path, str]:
    code = f"__import__('pathlib').Path({str(mark)!r}).touch() or "

    def edit(name: str, data: bytes) -> bytes:
        return data.replace(b'"Symbol(', f'"{code}Symbol('.encode()) \
            if name == "models/model.json" else data
    return _rewrite(saved["mlp_rows"], tmp / "sympy.pt2", edit), \
        "models/model.json: symbolic size"


def _guard_exec(saved: dict[str, Path], tmp: Path, mark: Path) -> tuple[Path, str]:
    def add(doc: dict) -> None:
        doc["guards_code"] = [f"__import__('pathlib').Path({str(mark)!r}).touch() is None"]
    return _rewrite(saved["mlp"], tmp / "guard.pt2", _edit_json("models/model.json", add)), \
        "models/model.json: guard"


def _string_input(saved: dict[str, Path], tmp: Path, mark: Path) -> tuple[Path, str]:
    # module() writes a string input's value between quotes into the guard code it runs
    value = f"x' + str(__import__('pathlib').Path({str(mark)!r}).touch()) + '"

    def edit(name: str, data: bytes) -> bytes:
        return data.replace(b'"trunc"', json.dumps(value).encode()) \
            if name == "models/model.json" else data
    return _rewrite(saved["consts"], tmp / "string.pt2", edit), \
        "input 'mode': its constant value"


def _quoted_name(saved: dict[str, Path], tmp: Path, mark: Path) -> tuple[Path, str]:
    # a graph's names end up in the Python torch.fx generates (a subgraph's between quotes)
    name = 'x") or __import__("os") or ("'

    def edit(n: str, data: bytes) -> bytes:
        return data.replace(b'"name": "x"', b'"name": ' + json.dumps(name).encode()) \
            if n == "models/model.json" else data
    return _rewrite(saved["mlp"], tmp / "name.pt2", edit), "models/model.json: name"


def _native_code(saved: dict[str, Path], tmp: Path, mark: Path) -> tuple[Path, str]:
    extra = {"data/aotinductor/model/model.so": b"\x7fELF"}
    return _rewrite(saved["mlp"], tmp / "aoti.pt2", lambda n, d: d, extra), \
        "data/aotinductor/model/model.so: a program compiled by AOTInductor"


def _old_format(saved: dict[str, Path], tmp: Path, mark: Path) -> tuple[Path, str]:
    # torch.export.load reads this format (torch < 2.7) when its reader fails on an archive
    from torch._export.serde.schema import SCHEMA_VERSION

    path = tmp / "old.pt2"
    with zipfile.ZipFile(saved["mlp"]) as z:
        program = next(z.read(n) for n in z.namelist() if n.endswith("models/model.json"))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        z.writestr("serialized_exported_program.json", program)
        z.writestr("serialized_state_dict.pt", _torch_pickle(_Touch(mark)))
        z.writestr("serialized_constants.pt", _torch_pickle({}))
        z.writestr("serialized_example_inputs.pt", _torch_pickle(((torch.zeros(1),), {})))
    return path, "serialized_state_dict.pt: the format of torch before 2.7"


CRAFTED = [_pickled_weight, _pickled_constant, _example_inputs, _sympy_eval, _guard_exec,
           _string_input, _quoted_name, _native_code, _old_format]
#: refused as kinds of part: a payload that runs needs a compiled library, or a name torch's
#: code generation does not rename first
UNPROVEN = (_quoted_name, _native_code)


@pytest.mark.parametrize("name", ["mlp", "mlp_rows", "consts"])
def test_an_archive_torch_export_save_wrote_holds_nothing_that_runs_and_loads(saved, name):
    with saved[name].open("rb") as f:
        assert unsafe_part(f) is None
    loaded = load_exported(str(saved[name]))
    assert loaded.args is not None
    assert loaded.dynamic == (name == "mlp_rows")


@pytest.mark.parametrize("craft", CRAFTED, ids=lambda c: c.__name__.strip("_"))
def test_an_archive_with_a_part_that_runs_code_is_refused_before_it_runs(saved, tmp_path,
                                                                         craft):
    mark = tmp_path / "ran"
    path, part = craft(saved, tmp_path, mark)
    with pytest.raises(ProgramError) as e:
        load_exported(str(path))
    message = str(e.value)
    assert message.startswith(f"{str(path)!r}: refused: {part}"), message
    assert TRUST_FLAG in message and "\n" not in message
    assert not mark.exists()


@pytest.mark.parametrize("craft", [c for c in CRAFTED if c not in UNPROVEN],
                         ids=lambda c: c.__name__.strip("_"))
def test_trust_reads_the_archive_as_torch_does_its_code_included(saved, tmp_path, craft):
    # what each refusal stood between: with trust, torch reads the archive, the program is
    # made a module and run (as planning and --check do), and the crafted part runs
    mark = tmp_path / "ran"
    path, _ = craft(saved, tmp_path, mark)
    try:
        loaded = load_exported(str(path), trust=True)
        loaded.exported.module()(*loaded.args, **loaded.kwargs)
    except Exception:  # noqa: BLE001 - most crafted archives fail once their code has run
        pass
    assert mark.exists()


def test_the_cli_refuses_with_status_2_and_one_line_naming_the_flag(saved, tmp_path, capsys):
    mark = tmp_path / "ran"
    path, part = _pickled_weight(saved, tmp_path, mark)
    for argv in (["plan", str(path)], ["run", "--torch", str(path), "--check"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert part in err and "--trust-pt2" in err
    assert not mark.exists()


def test_the_cli_reads_an_ordinary_archive_with_or_without_the_flag(saved, capsys):
    for flag in ([], ["--trust-pt2"]):
        assert main(["run", str(saved["mlp"]), "--check", "--cores", "8", *flag]) == 0
        assert "matches the model run eagerly" in capsys.readouterr().out
