"""Every piece of IR apportion emits, for the examples and for random conformance cases, hashed
into one JSON file: run it before and after a change to the emitters and compare the two files
(``--compare A B``) to show the change left the IR byte-identical.

What it collects, each under a key naming source, form and target:

* every example through ``apportion emit`` (``--forall``, ``--bundle``, ``--unrolled``,
  ``--loopspec``, ``--loopspec-json``) on spyre and gpu, and the mesh forms (``--mesh tp=2``:
  the per-device IREE modules, and each ``--shard-form``);
* program case ``s`` of ``bench conformance`` (``--seed``, ``--n``): the parallel IR that the
  iree, openmp and cuda backends emit, the loop bundle (plain and unrolled) and the LoopSpec;
* mesh case ``s``: the mesh schedule's per-device IREE modules and the shard-dialect forms.

A case the planner or an emitter refuses records its error's first line, so a change that
turns IR into a refusal (or back) shows too. Usage::

    python tools/ir_snapshot.py --n 300 -o before.json
    python tools/ir_snapshot.py --n 300 -o after.json
    python tools/ir_snapshot.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

EXAMPLE_FORMS = ("--forall", "--bundle", "--unrolled", "--loopspec", "--loopspec-json")
SHARD_FORMS = ("annotated", "propagated", "partitioned", "unrolled")
TARGETS = ("spyre", "gpu")
#: sizes and meshes an example needs besides the defaults
PARAMS = {"dynamic_k.json": ["--param", "K=3000"], "softmax_symbolic.json": ["--param", "T=16"]}
MESHES = {"halo.json": "die=3@chiplet:peered"}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _record(out: dict[str, str], key: str, make: Callable[..., str], *args: object) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[key] = _digest(make(*args))
    except Exception as e:  # noqa: BLE001 - a refusal is part of what the snapshot records
        first = (str(e).splitlines() or [""])[0]
        out[key] = f"error {type(e).__name__}: {first}"


def _cli(argv: list[str]) -> str:
    from apportion.cli.main import main

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    if code:
        raise RuntimeError(f"exit {code}: {err.getvalue().strip()}")
    return buf.getvalue()


def examples(root: Path, out: dict[str, str]) -> None:
    for path in sorted((root / "examples").glob("*.json")):
        for target in TARGETS:
            for form in EXAMPLE_FORMS:
                _record(out, f"example {path.name} {target} {form}",
                        _cli, ["emit", str(path), "--target", target, "--cores", "8", form,
                               *PARAMS.get(path.name, [])])
            _record(out, f"example {path.name} {target} --forall symbolic",
                    _cli, ["emit", str(path), "--target", target, "--forall"])
        mesh = ["--mesh", MESHES.get(path.name, "tp=2"), *PARAMS.get(path.name, [])]
        _record(out, f"example {path.name} mesh --forall",
                _cli, ["emit", str(path), *mesh, "--forall"])
        for form in SHARD_FORMS:
            _record(out, f"example {path.name} shard-form {form}",
                    _cli, ["emit", str(path), *mesh, "--shard-form", form])


def program_case(seed: int, out: dict[str, str]) -> None:
    import apportion as ap
    from apportion.frontend.random_programs import case

    c = case(seed)
    try:
        planned = ap.plan(c.program, c.target, strategy=c.strategy)
    except Exception as e:  # noqa: BLE001
        out[f"case {seed} plan"] = f"error {type(e).__name__}: {str(e).splitlines()[0]}"
        return
    _parallel_ir(planned, seed, out)
    _record(out, f"case {seed} bundle", lambda: planned.bundle_mlir(False))
    _record(out, f"case {seed} unrolled", lambda: planned.bundle_mlir(True))
    _record(out, f"case {seed} loopspec", lambda: str(planned.loopspec()))


def _parallel_ir(planned: object, seed: int, out: dict[str, str]) -> None:
    """The parallel IR of each backend that emits it (the emitter's entry is looked up where
    it lives now: the tool outlives the move of the emitters)."""
    render = _one_module_ir()
    for backend in ("iree", "openmp", "cuda"):
        _record(out, f"case {seed} forall {backend}",
                render, planned, backend)


def _one_module_ir() -> Callable[[object, str], str]:
    try:
        from apportion.backends.iree.run import one_module_ir
    except ImportError:
        one_module_ir = None
    if one_module_ir is not None:
        def render(planned: object, backend: str) -> str:
            p = planned
            return one_module_ir(p.program, p.plan, p.target,  # type: ignore[attr-defined]
                                 backend, getattr(p, "symbolic", None))[1]
        return render
    # since issue 29: a schedule rendered (apportion.mlir.module); the program as planned, at
    # its planning sizes and planned loop counts, as the old entry rendered it
    from apportion.mlir.module import one_module_ir as render_schedule
    from apportion.schedule.lower import lower, planned_counts

    def render_planned(planned: object, backend: str) -> str:
        p = planned
        schedule = lower(p.program, p.plan, p.target,  # type: ignore[attr-defined]
                         params=planned_counts(p.plan) or None)  # type: ignore[attr-defined]
        return render_schedule(schedule, backend)
    return render_planned


def mesh_case(seed: int, out: dict[str, str]) -> None:
    from apportion.frontend.random_meshes import mesh_case as make

    c = make(seed)
    try:
        schedule = _plan_mesh(c)
    except Exception as e:  # noqa: BLE001
        out[f"mesh {seed} plan"] = f"error {type(e).__name__}: {str(e).splitlines()[0]}"
        return
    _record(out, f"mesh {seed} devices", _mesh_mlir, schedule)
    plan = _sharding_plan(c)
    forms = _shard_forms()
    for name in ("propagated", "partitioned", "dynamic"):
        _record(out, f"mesh {seed} shard-form {name}", forms[name], plan)
    _record(out, f"mesh {seed} shard-form unrolled", forms["unrolled"], schedule,
            getattr(plan, "mesh", None))


def _plan_mesh(c: object) -> object:
    try:  # the old home first (an editable install finds new modules beside an old tree)
        from apportion.cli.bench_conformance import plan_mesh_case
    except ImportError:  # since the bench suites left the CLI
        from apportion.bench.conformance import plan_mesh_case  # type: ignore[no-redef]
    return plan_mesh_case(c)


def _sharding_plan(c: object) -> object:
    from apportion.sharding.mesh import parse
    from apportion.sharding.propagate import propagate
    from apportion.sharding.spec import Sharding

    # the forms render the propagated plan (search is timed, so not reproducible)
    ann = {name: Sharding(dims) for name, dims in c.shardings.items()}  # type: ignore[attr-defined]
    return propagate(c.program, parse(c.mesh), c.target, annotations=ann)  # type: ignore[attr-defined]


def _mesh_mlir(schedule: object) -> str:
    try:  # the old home first, as _plan_mesh
        from apportion.backends.iree.mesh import mesh_mlir
    except ImportError:
        from apportion.mlir.mesh import mesh_mlir  # type: ignore[no-redef]
    return mesh_mlir(schedule)


def _shard_forms() -> dict[str, Callable[[object], str]]:
    try:  # the old home first, as _plan_mesh
        import apportion.shard_mlir as forms
    except ImportError:  # since the forms take a plan through sharding/forms.py
        import apportion.sharding.forms as forms  # type: ignore[no-redef]
    return {"propagated": forms.propagated_mlir, "partitioned": forms.partitioned_mlir,
            "unrolled": forms.unrolled_mlir, "dynamic": forms.dynamic_mlir}


def compare(a: Path, b: Path) -> int:
    old, new = json.loads(a.read_text()), json.loads(b.read_text())
    keys = sorted(set(old) | set(new))
    differ = [k for k in keys if old.get(k) != new.get(k)]
    ir = sum(1 for k in keys if not str(old.get(k, "")).startswith("error"))
    print(f"{len(keys)} pieces ({ir} IR texts, {len(keys) - ir} refusals); "
          f"{len(differ)} differ")
    for k in differ[:40]:
        print(f"  {k}: {str(old.get(k))[:70]} -> {str(new.get(k))[:70]}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n", type=int, default=100, help="conformance cases (and mesh cases)")
    parser.add_argument("--no-examples", action="store_true")
    parser.add_argument("-o", "--output", type=Path)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    root = Path(__file__).resolve().parent.parent
    out: dict[str, str] = {}
    if not args.no_examples:
        examples(root, out)
    for seed in range(args.seed, args.seed + args.n):
        program_case(seed, out)
        mesh_case(seed, out)
        print(f"\r{seed - args.seed + 1}/{args.n}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    text = json.dumps(out, indent=1, sort_keys=True)
    if args.output:
        args.output.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
