"""The options the commands share and what they load: the program or ``--torch`` model and
target of every command that plans (``common``: ``program_options``, ``torch_options``,
``--auto-tile``), the program file read, planned at the ``--param`` values checked first, and
the ``--torch`` model lowered."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apportion.cli.params import check_params, int_in, parse_params
from apportion.errors import UsageError
from apportion.passes.strategy import STRATEGIES
from apportion.report.files import make_folder
from apportion.target.presets import PRESETS, resolve

if TYPE_CHECKING:
    from apportion.ir.program import Program
    from apportion.planned import PlannedProgram
    from apportion.target.target import Target
    from apportion.workflows.torch_model import TorchModel

#: the program argument that names the built-in MLP block
DEFAULT = "default"


class Given(argparse.Action):
    """``store``, and a note that the option was given (``args.<dest>_given``): an explicit
    ``--target`` wins over a mesh's device target, the default does not."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def common(p: argparse.ArgumentParser) -> None:
    """The options of every command that plans a program: the program, its target and
    strategy, a PyTorch model instead, auto-tiling."""
    program_options(p)
    torch_options(p)
    p.add_argument("--auto-tile", action="store_true",
                   help="choose each tiling group's loop counts: the lowest predicted time of "
                        "the group, weighing re-read weights against scratchpad savings")


def program_options(p: argparse.ArgumentParser) -> None:
    """The program file, its target, the cores and the planning strategy."""
    p.add_argument("program", nargs="?", default=DEFAULT,
                   help="program file (format v1), or 'default' for the built-in MLP block")
    p.add_argument("--target", default="spyre", action=Given,
                   help=f"a preset ({', '.join(PRESETS)}) or a target .toml file (default "
                        "spyre; with --mesh: the devices' target, over the mesh's own)")
    p.add_argument("--cores", type=int_in(1), default=None,
                   help="cores to use (spyre: 1..32; default SENCORES or 32)")
    p.add_argument("--strategy", choices=STRATEGIES, default="balanced",
                   help="balanced (default): the exact search, uneven splits included; greedy: "
                        "the reference design's rule; greedy-multiples: its older variant "
                        "(a span-forced split grows only to multiples of itself)")


def torch_options(p: argparse.ArgumentParser) -> None:
    """A PyTorch model instead of a program file: ``--torch``, its run-time sizes
    (``--dynamic``), a ``.pt2`` file trusted, the part apportion can lower (``--partial``)."""
    p.add_argument("--torch", metavar="MODULE:FACTORY|FILE.pt2", default=None,
                   help="a PyTorch model instead of a program file: a callable returning "
                        "(model, args), (model, args, kwargs) or (model, {'args': ..., "
                        "'kwargs': ..., 'dynamic_shapes': ...}), imported from the current "
                        "directory or PYTHONPATH (e.g. apportion.frontend.torch_demo:"
                        "tiny_llama); or a file torch.export.save wrote")
    p.add_argument("--dynamic", action="append", metavar="INPUT:DIM=SYMBOL:MIN..MAX",
                   help="with --torch: dim DIM of input INPUT (a parameter of forward) is a "
                        "run-time size SYMBOL in MIN..MAX, as torch.export.Dim; another input "
                        "of that size names the symbol again, bounds left out (e.g. --dynamic "
                        "input_ids:1=seq:2..64 --dynamic attention_mask:1=seq); run binds it "
                        "with --param seq=40")
    p.add_argument("--trust-pt2", action="store_true",
                   help="with a .pt2 file: read it even where it holds parts that run code as "
                        "they are read (pickles, native code, Python in its sizes or guards), "
                        "which are refused otherwise; only for a file whose source you trust")
    p.add_argument("--partial", action="store_true",
                   help="with --torch: plan the part of the model apportion can lower, the "
                        "results of the nodes it cannot are inputs (their table on stderr); "
                        "run refuses it")


def load_program(spec: str) -> Program:
    """The program file ``spec`` (format v1), or the built-in MLP block for ``default``."""
    from apportion.frontend.json_format import load
    from apportion.frontend.models import default_program

    return default_program() if spec == DEFAULT else load(spec)


def plan_program(program: Program, target: Target, args: argparse.Namespace) -> PlannedProgram:
    """``program`` planned for ``target`` with ``--strategy`` and ``--auto-tile``."""
    from apportion.planned import plan

    return plan(program, target, args.strategy, auto_tile=args.auto_tile)


def planned_program(args: argparse.Namespace, params: dict[str, int] | None = None
                    ) -> PlannedProgram:
    """The program file's plan; ``params`` (``--param`` values) are checked before planning."""
    program = load_program(args.program)
    target = resolve(args.target, args.cores)
    if params:
        check_params(program, target, params, ())
    return plan_program(program, target, args)


def param_values(pairs: list[str] | None) -> dict[str, int]:
    """``--param T=4`` values (symbolic loop counts, run-time sizes) as a dict."""
    return parse_params(pairs, UsageError)


def torch_model(args: argparse.Namespace) -> TorchModel:
    """The ``--torch module:factory`` model, lowered; refuses a program file given as well."""
    from apportion.workflows.torch_model import load_model

    if args.program != DEFAULT:
        raise UsageError(f"give a program file or --torch, not both ({args.program!r} and "
                         f"--torch {args.torch!r})")
    # run and cuda build run the model: every value needed, nothing left out
    return load_model(args.torch, partial=args.partial, run=args.command in ("run", "cuda"),
                      dynamic=args.dynamic or (), trust_pt2=args.trust_pt2)


def plot_folder(text: str) -> Path:
    """``--plot DIR``: the folder, made with its missing parents, and writable."""
    if not text:
        raise UsageError("--plot: the path is empty")
    folder = Path(text)
    make_folder("--plot", text, folder)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--plot {text!r}: not writable")
    return folder
