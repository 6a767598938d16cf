"""Small program builders shared by the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program

#: examples the run sweeps leave out (they are planned, emitted and checked by name elsewhere):
#: the README's span-limit tensor and its symbolic loop count
NOT_RUN = {
    "big.json": "a 256 MiB tensor: about 50 s and 7 GB to run and check",
    "softmax_symbolic.json": "a symbolic loop count: a run needs --param T=...",
}


def runnable_examples(root: Path, *also_skip: str) -> list[Path]:
    """``examples/*.json`` under ``root`` but those in ``NOT_RUN`` and ``also_skip``."""
    return sorted(p for p in root.joinpath("examples").glob("*.json")
                  if p.name not in NOT_RUN and p.name not in also_skip)


def program(tensors: dict[str, tuple[list[int], str]], ops: list[dict[str, Any]],
            outputs: list[str], **extra: Any) -> Program:
    """A program from declared input tensors and op dicts in program format v1."""
    return from_dict({"format": "apportion.program/1", "name": extra.pop("name", "t"),
                      "tensors": {n: {"shape": s, "dtype": d} for n, (s, d) in tensors.items()},
                      "inputs": list(tensors), "outputs": outputs, "ops": ops, **extra})


def one_op(fn: str, out: str, ins: list[str], tensors: dict[str, tuple[list[int], str]],
           **extra: Any) -> Program:
    return program(tensors, [{"name": fn, "op": fn, "out": out, "ins": ins}],
                   [out.split("[")[0]], **extra)


def edge_accesses_program() -> Program:
    """Rank-0 tensors, literal indices, a diagonal, strided and offset reads, a window of sums
    (64*h+d), a transposed write, a reduction dim no input reads, an input returned as is."""
    return program({"s": ([], "float16"), "x": ([8, 256], "float16"), "q": ([8, 8], "float32"),
                 "w": ([256, 16], "float16")},
                [{"name": "bcast", "op": "mul", "out": "b[i,j]", "ins": ["x[i,j]", "s[]"]},
                 {"name": "total", "op": "sum", "out": "t[]", "ins": ["x[i,j]"]},
                 {"name": "corner", "op": "copy", "out": "c[0,0]", "ins": ["x[0,0]"]},
                 {"name": "diag", "op": "exp", "out": "g[i]", "ins": ["q[i,i]"]},
                 {"name": "stride", "op": "neg", "out": "st[i,j]", "ins": ["x[2*i,j]"],
                  "dims": {"i": 4}},
                 {"name": "offset", "op": "neg", "out": "of[i,f]", "ins": ["x[i,72+f]"],
                  "dims": {"f": 128}},
                 {"name": "window", "op": "sum", "out": "wn[i,h]", "ins": ["x[i,64*h+d]"],
                  "dims": {"h": 3, "d": 128}},
                 {"name": "trans", "op": "relu", "out": "tr[j,i]", "ins": ["x[i,j]"]},
                 {"name": "unread", "op": "matmul", "out": "mm[i,j]",
                  "ins": ["b[i,k]", "w[k,j]"], "dims": {"r": 3}}],
                ["b", "t", "c", "g", "st", "of", "wn", "tr", "mm", "q"], name="edges")


def assert_runs_as_unplanned(text: str, prog: Program) -> None:
    """``text`` (MLIR whose function ``prog``'s name keeps its signature: the unrolled shard
    form) compiled and run by upstream MLIR on random inputs (seed 0) matches the unplanned
    program on every output (numpy's overflow warnings of random programs silenced)."""
    import warnings

    import numpy as np

    from apportion.mlir.text import symbol_name
    from apportion.runtime.reference import compare, random_inputs, run_unplanned
    from apportion.runtime.upstream_mlir import run_function

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        xs = random_inputs(prog, 0)
        outs = run_function(text, symbol_name(prog.name), [xs[n] for n in prog.inputs],
                            [(prog.tensor(n).shape, prog.tensor(n).dtype)
                             for n in prog.outputs],
                            [prog.tensor(n).dtype for n in prog.inputs])
        checks = compare(run_unplanned(prog, xs), dict(zip(prog.outputs, outs, strict=True)),
                         prog)
    assert all(c.ok for c in checks), [str(c) for c in checks]


def cli_status(argv: list[str]) -> int:
    """``apportion``'s exit status for ``argv``, whether ``main`` returns it or argparse raises
    it (SystemExit)."""
    from apportion.cli.main import main

    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def one_error_line(capsys: Any) -> str:
    """The one stderr line of a refused command (no traceback)."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
