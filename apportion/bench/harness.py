"""One harness for every ``apportion bench`` suite: the options a suite takes, the timing of its
cases, its ``--json`` document and its goals, each done once here.

A suite is a ``Suite``: its name, the bench options it takes, and a function from the parsed
arguments to an ``Outcome`` (the JSON document, the goals it states, and whether a result was
wrong). ``run_suite`` refuses the options the suite does not take (one line naming the suite
and the ones it does), checks the ``--json`` path before any work, writes the document once,
and turns the goals into the exit status (``goals.status``: 1 under ``--check`` when one is
missed, else 3 when one is too noisy to judge; a wrong result is 1 with or without it).

Timing goes through ``cost.timing``: ``interleaved`` (a fixed number of rounds) or
``until_stable`` (rounds until the suite's goals are settled, ``cost/noise.py``): rounds that
call every case once, so a burst of load elsewhere slows one round of each case rather than
every round of one; the fastest and the median of each case's times are reported (a stall only
lengthens a run, so the fastest is the steadiest figure), and ``until_stable`` also gives the
measurement's noise: its intervals, the verdict of each goal and the load average before and
after.

>>> import argparse
>>> core_counts(argparse.Namespace(cores=None), [32, 24])
[32, 24]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rich.console import Console

from apportion.bench import goals as bench_goals
from apportion.errors import UsageError
from apportion.report.files import output_path, write_json
from apportion.target.presets import spyre

R = TypeVar("R")
T = TypeVar("T")

#: bench options a suite may take, as the parser stores them, with their flags
OPTIONS: dict[str, str] = {
    "cores": "--cores",
    "models": "--models",
    "threads": "--threads",
    "repeat": "--repeat",
    "measurements": "--measurements",
    "target": "--target",
    "n": "--n",
    "dtensor": "--dtensor",
    "seed": "--seed",
}


@dataclass(frozen=True)
class Outcome:
    """What one suite's run gives the harness: its ``--json`` document (JSON-able), the goals
    it states (met or missed), and ``failed`` when a result was wrong (exit status 1 whatever
    the goals say)."""

    doc: Any
    goals: list[bench_goals.Goal]
    failed: bool = False


@dataclass(frozen=True)
class Suite:
    """One ``apportion bench`` suite: its name, the options of ``OPTIONS`` it takes, a line of
    help, and the function that runs it."""

    name: str
    options: frozenset[str]
    about: str
    run: Callable[[argparse.Namespace, Console], Outcome]


def core_counts(args: argparse.Namespace, default: Sequence[int]) -> list[int]:
    """``--cores`` (else ``default``) without repeats, each checked as a spyre core count
    before the first case runs (a bad one is one line, not a failure halfway through).

    >>> core_counts(argparse.Namespace(cores=[8, 8, 32]), [32])
    [8, 32]
    """
    cores = list(dict.fromkeys(args.cores or default))
    for n in cores:
        spyre(cores=n)
    return cores


def check_options(suite: Suite, args: argparse.Namespace) -> None:
    """Refuse, in one line, a given option the suite does not take."""
    for option, flag in OPTIONS.items():
        if getattr(args, option, None) is not None and option not in suite.options:
            takes = ", ".join(OPTIONS[o] for o in OPTIONS if o in suite.options) or "none"
            raise UsageError(f"{flag} is not an option of the {suite.name} suite (its options: "
                             f"{takes}, --limit, --json, --check)")


def run_suite(suite: Suite, args: argparse.Namespace, console: Console) -> int:
    """Run ``suite`` as ``apportion bench`` does: options checked, the ``--json`` path checked
    before any work and written once after, the exit status from the goals."""
    check_options(suite, args)
    out = output_path("--json", args.json) if getattr(args, "json", None) is not None else None
    outcome = suite.run(args, console)
    if out is not None:
        write_json(out, json.dumps(outcome.doc, indent=1))
    if outcome.failed:
        return 1
    return bench_goals.status(suite.name, outcome.goals, bool(getattr(args, "check", False)))


def from_models(path: str | None, build: Callable[[], T]) -> T:
    """``build()``, with a malformed ``--models`` file (JSON, keys, types) refused in one line."""
    if path is None:  # the packaged file: a failure here is a bug, not bad input
        return build()
    try:
        return build()
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        why = f"no key {e.args[0]!r}" if isinstance(e, KeyError) and e.args else str(e)
        raise UsageError(f"--models {path!r} is not a models file like the packaged "
                         f"models.json: {why or type(e).__name__}") from None
