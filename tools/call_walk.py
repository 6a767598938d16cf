"""The walk an ``apportion`` command takes through the package's modules: every call from one
apportion module into another, traced while the command runs in this process, and two
figures of how tangled the walk is:

* **revisits**: the walk is the sequence of distinct calls (caller function -> callee
  function, each counted once, in the order first made); a revisit is a call in it that
  enters a module the walk had already left (the module appeared earlier and the walk went
  elsewhere since);
* **climbs**: distinct calls from a module into one of a *higher* layer (the ``layers`` import
  contract in ``pyproject.toml``): a lower layer reaching back up, through a lazy import or a
  callback. A dunder callee (``__getattr__`` of an array namespace the caller was handed, an
  operator) is data flowing down, not a climb.

A straight walk goes down the layers and never climbs. Usage::

    python tools/call_walk.py -- run examples/mlp.json --mesh tp=2 --backend reference --check
    python tools/call_walk.py --show 40 -- run examples/mlp.json --mesh tp=2

``--show N`` prints the first N climbs (caller -> callee, with the functions).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tomllib
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def layers() -> dict[str, int]:
    """Each top-level subpackage or module of apportion and its layer (0: the top)."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for c in doc["tool"]["importlinter"]["contracts"]:
        if c.get("id") == "layers":
            return {name.strip(): i for i, entry in enumerate(c["layers"])
                    for name in entry.split("|")}
    raise SystemExit("pyproject.toml has no contract with id 'layers'")


def _module(frame: FrameType) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if isinstance(name, str) and name.startswith("apportion.") else None


def trace(argv: list[str]) -> list[tuple[str, str, str, str]]:
    """The calls between apportion modules while ``apportion argv`` runs: (caller module,
    callee module, caller function, callee function)."""
    from apportion.cli.main import main

    calls: list[tuple[str, str, str, str]] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee = _module(frame)
        caller = _module(frame.f_back)
        if callee and caller and callee != caller:
            calls.append((caller, callee, frame.f_back.f_code.co_name, frame.f_code.co_name))

    out, err = io.StringIO(), io.StringIO()
    sys.setprofile(profile)
    try:
        with (contextlib.redirect_stdout(out), contextlib.redirect_stderr(err),
              contextlib.suppress(SystemExit)):
            main(argv)
    finally:
        sys.setprofile(None)
    return calls


def figures(calls: list[tuple[str, str, str, str]], layer: dict[str, int]
            ) -> tuple[int, list[tuple[str, str, str, str]], int]:
    """(revisits, climbs, modules entered) of a walk."""
    calls = list(dict.fromkeys(calls))  # each distinct call once, in first-made order
    seen: set[str] = set()
    revisits, last = 0, None
    for _, callee, _, _ in calls:
        if callee != last and callee in seen:
            revisits += 1
        seen.add(callee)
        last = callee

    def top(module: str) -> int | None:
        return layer.get(module.split(".")[1])

    climbs = [c for c in calls
              if top(c[0]) is not None and top(c[1]) is not None
              and top(c[1]) < top(c[0])  # type: ignore[operator]
              and not c[3].startswith("__")]
    return revisits, climbs, len(seen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", type=int, default=0, help="print the first N climbs")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the apportion command after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    calls = trace(command)
    revisits, climbs, modules = figures(calls, layers())
    print(f"apportion {' '.join(command)}")
    print(f"  {len(set(calls))} distinct calls between modules, {modules} modules entered, "
          f"{revisits} revisits, {len(climbs)} climbs back up a layer")
    pairs = Counter((a.split(".")[1], b.split(".")[1]) for a, b, _, _ in climbs)
    for (a, b), n in pairs.most_common():
        print(f"  climb {a} -> {b}: {n}")
    for a, b, fa, fb in climbs[:args.show]:
        print(f"    {a}.{fa} -> {b}.{fb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
