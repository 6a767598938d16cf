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

    from apportion.mlir.builder import symbol_name
    from apportion.mlir.upstream import run_function
    from apportion.runtime.check import expect

    def run(xs: dict[str, Any]) -> dict[str, Any]:
        outs = run_function(text, symbol_name(prog.name), [xs[n] for n in prog.inputs],
                            [(prog.tensor(n).shape, prog.tensor(n).dtype)
                             for n in prog.outputs],
                            [prog.tensor(n).dtype for n in prog.inputs])
        return dict(zip(prog.outputs, outs, strict=True))

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = expect(prog, 0)
        checks = want.compare(run(want.inputs))
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


# -- running a plan at (program, plan) or a planned program at sizes: what the tests of the
# -- backends share now that a backend takes a schedule (issue 29)

def schedule_of(program: Program, plan: Any, target: Any = None,
                params: dict[str, int] | None = None) -> Any:
    """``plan`` lowered for ``program`` (on ``target``, default the target it names) at the
    symbolic loop counts ``params``: the schedule a backend runs."""
    from apportion.schedule.lower import lower

    return lower(program, plan, plan.target if target is None else target, params=params)


def run_planned(program: Program, plan: Any, inputs: Any, threads: int | None = None,
                params: dict[str, int] | None = None, target: Any = None) -> dict[str, Any]:
    """The reference backend's run of ``plan`` (``execute`` of its schedule)."""
    from apportion.backends.reference.execute import execute

    return execute(schedule_of(program, plan, target, params), inputs, threads)


def run_tiled(program: Program, plan: Any, inputs: Any, threads: int | None = None,
              params: dict[str, int] | None = None) -> dict[str, Any]:
    """``plan``'s schedule run in simulated memory (``loops.run_schedule``)."""
    from apportion.backends.reference.loops import run_schedule

    return run_schedule(schedule_of(program, plan, params=params), inputs, threads)


def run_sliced(program: Program, plan: Any, inputs: Any, threads: int | None = None
               ) -> dict[str, Any]:
    """``plan``'s schedule run op by op on whole arrays (``run_sliced_schedule``)."""
    from apportion.backends.reference.execute import run_sliced_schedule

    return run_sliced_schedule(schedule_of(program, plan), inputs, threads)


def bound(planned: Any, params: dict[str, int] | None = None, inputs: Any = None) -> Any:
    """``planned``'s schedule at the run-time sizes and loop counts ``params`` names (and the
    sizes ``inputs`` have)."""
    from apportion.schedule.bind import infer_sizes

    counts = dict(params or {})
    sizes = {k: counts.pop(k) for k in list(counts) if k in planned.symbols}
    if inputs is not None and planned.symbols:
        sizes = infer_sizes(planned.given, inputs, sizes)
    return planned.schedule(sizes, counts)


def checked(planned: Any, run: Any, seed: int = 0, params: dict[str, int] | None = None
            ) -> tuple[list[Any], Any]:
    """``run(schedule, inputs)`` of ``planned``'s schedule at ``params`` (``bound``) checked
    against the unplanned program on random inputs (``runtime.check``): the program as
    given bound at those sizes, a static one as planned. The checks and what ``run``
    returned."""
    from apportion.runtime.check import expect

    schedule = bound(planned, params)
    sizes = {k: v for k, v in (params or {}).items() if k in planned.symbols}
    unplanned = planned.given.bind(sizes) if planned.symbols else planned.program
    want = expect(unplanned, seed)
    got = run(schedule, want.inputs)
    return want.compare(got), got


def emitted(program: Program, plan: Any, target: Any, symbolic: Program | None = None) -> Any:
    """The schedule a module of ``plan`` is rendered from, as ``PlannedProgram.lowered`` has
    it: lowered at the values its symbolic loop counts were planned at, and, where
    ``symbolic`` (the program as given) has run-time sizes, with it (``program`` and ``plan``
    at its planning sizes): one function for every size."""
    from apportion.schedule.lower import lower, planned_counts

    given = symbolic if symbolic is not None and symbolic.symbols else None
    return lower(program, plan, target, params=planned_counts(plan) or None, given=given)


def runs_checked(runner: Any, schedules: list[Any], seed: int = 0, **launch: Any
                 ) -> list[tuple[list[Any], Any]]:
    """The dtensor ``runner``'s ``run_mesh_many`` of ``schedules`` in one launch (on the
    CPU unless ``launch`` says), each run checked against its unplanned program on random
    inputs of ``seed`` (``runtime.check``): the checks and the run of each."""
    from apportion.runtime.check import expect
    from apportion.runtime.reference import random_inputs

    inputs = [random_inputs(s.program, seed) for s in schedules]
    runs = runner.run_mesh_many(schedules, inputs, seed, **{"device": "cpu", **launch})
    return [(expect(s.program, inputs=xs).compare(run), run)
            for s, xs, run in zip(schedules, inputs, runs, strict=True)]
