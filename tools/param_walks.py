"""How a parameter walks through the modules: which modules take it, in call order, and how many
times the walk returns to a module it had already left.

A module "takes" a parameter when one of its functions is called with an argument of one of its
names: ``strategy``; ``cores`` (``cores``, ``core``, ``splits``); ``mesh`` (``mesh``,
``device``, ``devices``). The walk is the set of calls between modules that pass it.

    .venv/bin/python tools/param_walks.py            # strategy, cores and mesh
    .venv/bin/python tools/param_walks.py --show     # and the walks themselves

A call counts as coming back when the callee, through further calls that pass the
parameter on, calls back into the caller's module: the modules hand the parameter back and forth
instead of passing it down the layers once.

The workloads are fixed: a tiled program planned and run by the reference executor and
emitted as parallel IR and as a loop bundle (``strategy``, ``cores``), and a program sharded
over ``tp=2`` by the search and unrolled to per-device programs that are planned and run
(``mesh``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def trace_edges(names: frozenset[str], work: Callable[[], Any]) -> set[tuple[str, str]]:
    """The calls between apportion modules, caller module to callee module, in which the
    callee takes an argument named one of ``names``, while ``work`` runs."""
    edges: set[tuple[str, str]] = set()

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return None
        code = frame.f_code
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "")
        if callee == caller or not callee.startswith("apportion"):
            return None
        if not caller.startswith("apportion"):
            caller = "(user)"
        args = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if not names.isdisjoint(args):
            edges.add((caller, callee))
        return None

    sys.setprofile(tracer)
    try:
        work()
    finally:
        sys.setprofile(None)
    return edges


def returns(edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The edges by which the parameter comes back to a module it had left: a call from ``a``
    to ``b`` where ``b``, through further calls that pass it on, calls back into ``a``."""
    out: dict[str, set[str]] = {}
    for a, b in edges:
        out.setdefault(a, set()).add(b)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in out.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    return sorted((a, b) for a, b in edges if reaches(b, a))


def _core_work() -> None:
    import apportion as ap

    planned = ap.plan(ap.load(str(ROOT / "examples" / "fused.json")),
                      ap.targets.spyre(cores=8), strategy="balanced")
    planned.check()
    planned.forall_mlir()
    planned.bundle_mlir()


def _mesh_work() -> None:
    import apportion as ap
    from apportion.backends import get
    from apportion.runtime.reference import random_inputs
    from apportion.sharding import lower_plan, parse_mesh, search

    program = ap.load(str(ROOT / "examples" / "mlp.json"))
    schedule = lower_plan(search(program, parse_mesh("tp=2")))
    get("reference").run_mesh(schedule, random_inputs(program))


WALKS: dict[str, tuple[frozenset[str], Callable[[], None]]] = {
    "strategy": (frozenset({"strategy"}), _core_work),
    "cores": (frozenset({"cores", "core", "splits"}), _core_work),
    "mesh": (frozenset({"mesh", "device", "devices"}), _mesh_work),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print each walk's modules and "
                        "the calls that come back")
    args = parser.parse_args(argv)
    for param, (names, work) in WALKS.items():
        work()  # warm: first calls import modules and fill caches
        edges = trace_edges(names, work)
        modules = {m for e in edges for m in e} - {"(user)"}
        back = returns(edges)
        print(f"{param}: {len(modules)} modules, {len(edges)} calls between them, "
              f"{len(back)} come back to a module the parameter had left")
        if args.show:
            print("  modules: " + ", ".join(sorted(m.removeprefix("apportion.")
                                                    for m in modules)))
            for a, b in back:
                print(f"  back: {a.removeprefix('apportion.')} -> {b.removeprefix('apportion.')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
