"""``--torch module:factory``: PyTorch models on the command line (plan and run).

A factory is a Python callable returning ``(model, example_inputs)``; it is imported from the
current directory or ``PYTHONPATH``. ``plan --torch`` prints the model report (op families, the
least utilized ops with their PyTorch names, the share of ATen nodes lowered to non-fallback
ops); ``run --torch --check`` runs the plan and compares it with the model run eagerly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from apportion.errors import ApportionError

if TYPE_CHECKING:
    from rich.console import Console

    from apportion.frontend.torch_export import TorchProgram
    from apportion.planned import PlannedProgram
    from apportion.runtime.reference import OutputCheck


class FactoryError(ApportionError):
    """A ``--torch module:factory`` that cannot be found, called or used."""


@dataclasses.dataclass(frozen=True)
class TorchModel:
    """A model, its example inputs, and the program lowered from it."""

    spec: str
    model: Any
    example_inputs: tuple[Any, ...]
    lowered: TorchProgram


def load_factory(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """Import ``module:factory`` (the current directory first on the path) and call it.

    The current directory is on ``sys.path`` only while the factory's module is imported and
    the factory runs (it may import its neighbours lazily), and is taken off again whatever
    happens: left first on the path, a local ``iree/`` or ``matplotlib.py`` would shadow the
    real package the next time apportion imports it.
    """
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise FactoryError(f"--torch {spec!r}: expected MODULE:FACTORY, such as "
                           "--torch mymodels:tiny_llama (a callable returning (model, "
                           "example_inputs))")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise FactoryError(f"--torch {spec!r}: {module_name!r} is not a module name; give a "
                           "dotted Python module name (mymodels, pkg.models) importable from the "
                           "current directory or PYTHONPATH, not a file path")
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        made = _call_factory(spec, module_name, attr)
    finally:
        if added and cwd in sys.path:  # ours only (the first one): not a copy the module added
            sys.path.remove(cwd)
    if not (isinstance(made, tuple | list) and len(made) == 2):
        raise FactoryError(f"--torch {spec!r}: {attr}() must return (model, example_inputs), "
                           f"got {type(made).__name__}")
    model, inputs = made
    if not isinstance(inputs, tuple | list):
        inputs = (inputs,)
    return model, tuple(inputs)


def _call_factory(spec: str, module_name: str, attr: str) -> Any:
    """Import the factory's module and call the factory; errors name the spec."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise FactoryError(f"--torch {spec!r}: cannot import module {module_name!r} from the "
                           f"current directory or PYTHONPATH: {e}") from None
    except SyntaxError as e:  # the module's own text, named by file and line
        raise FactoryError(f"--torch {spec!r}: module {module_name!r} has a syntax error: "
                           f"{e.msg} ({e.filename}, line {e.lineno})") from None
    except (Exception, SystemExit) as e:  # the module's top-level code failed or exited
        raise FactoryError(f"--torch {spec!r}: importing module {module_name!r} raised "
                           f"{_raised(e)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise FactoryError(f"--torch {spec!r}: module {module_name!r} has no callable "
                           f"{attr!r}")
    try:
        return factory()
    except (Exception, SystemExit) as e:  # the user's code: name it, no traceback, no exit
        raise FactoryError(f"--torch {spec!r}: {attr}() raised {_raised(e)}") from None


def _raised(e: BaseException) -> str:
    """``TypeError: first line`` of an exception; ``SystemExit(3)`` for an exit."""
    if isinstance(e, SystemExit):
        return f"SystemExit({e.code!r})"
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def load_model(spec: str, partial: bool = False, run: bool = False,
               err: TextIO | None = None) -> TorchModel:
    """The factory's model lowered with ``from_torch``.

    Nodes apportion cannot lower are refused all at once: their table (ATen op, count, first
    source line, module path) on ``err`` (stderr) and one error line. With ``partial`` the rest
    is lowered and the table of what was left out is printed on ``err`` instead. For a ``run``
    (which needs every value), ``partial`` and a model on the meta device are refused, before
    any planning.

    >>> tm = load_model("apportion.frontend.torch_models:llama3_tiny")
    >>> len(tm.lowered.shapes_only), tm.lowered.program.tensor("input_ids").shape
    (22, (1, 16))
    """
    from apportion.frontend.torch_export import UnsupportedNodes, from_torch, unsupported_table

    err = err or sys.stderr
    if run and partial:
        raise FactoryError(f"--torch {spec!r}: run --partial would run the nodes apportion "
                           "cannot lower eagerly between planned parts, which run does not "
                           "support; --partial goes with plan, emit, schedule and shard")
    model, inputs = load_factory(spec)
    name = spec.partition(":")[2]
    try:
        # torch.export's own deprecation notices are not the user's; what torch raises while it
        # decomposes the graph (from_torch names export's own refusals) is the model's, one line
        with warnings.catch_warnings(), _quiet_torch(), \
                _failing(spec, "exporting and lowering the model"):
            warnings.simplefilter("ignore", FutureWarning)
            lowered = from_torch(model, inputs, name=name, partial=partial)
    except UnsupportedNodes as e:  # the table, then one error line (main prints one line)
        print(unsupported_table(e.unsupported, e.total), file=err)
        raise FactoryError(f"--torch {spec!r}: {e.summary}; all {len(e.unsupported)} in the "
                           "table above; --partial plans the rest") from None
    if partial and lowered.unsupported:
        print(unsupported_text(lowered), file=err)
    if run:
        try:
            lowered.require_values()
        except ApportionError as e:
            raise FactoryError(f"--torch {spec!r}: {e}") from None
    return TorchModel(spec, model, inputs, lowered)


def unsupported_text(lowered: TorchProgram) -> str:
    """What ``--partial`` left out: the unsupported-node table and its share of the nodes."""
    from apportion.frontend.torch_export import unsupported_table

    return (f"left out by --partial (their results are inputs of the planned part):\n"
            f"{unsupported_table(lowered.unsupported, len(lowered.nodes))}")


@contextlib.contextmanager
def failures(tm: TorchModel, what: str) -> Iterator[None]:
    """Any exception but apportion's (and out-of-memory, which ``main`` names) raised while
    ``what`` runs as a FactoryError naming it: ``run --torch`` never ends in a traceback, nor
    in exit status 1, which means only that the numbers differ."""
    with _failing(tm.spec, what):
        yield


@contextlib.contextmanager
def _failing(spec: str, what: str) -> Iterator[None]:
    try:
        yield
    except (ApportionError, MemoryError):
        raise
    except Exception as e:
        raise FactoryError(f"--torch {spec!r}: {what} failed: {_raised(e)}") from None


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """What torch prints to stderr while it exports, held back and written out only if the
    export succeeds (a failed export prints its partial graph there, which the one error line
    replaces); torch's logged warnings, which name the same failures, are left out."""
    import io
    import logging

    held = io.StringIO()
    torch_log = logging.getLogger("torch")
    level = torch_log.level
    torch_log.setLevel(logging.ERROR)  # its handler holds the real stderr: not redirectable
    try:
        with contextlib.redirect_stderr(held):
            yield
    finally:
        torch_log.setLevel(level)
    sys.stderr.write(held.getvalue())  # only reached on success


def _origins(lowered: TorchProgram, ops: Sequence[str]) -> dict[str, Any]:
    """Op name -> its ``Origin`` (split-K's partial and combine ops take their op's)."""
    out = {}
    for name in ops:
        base = name.removesuffix(".partial").removesuffix(".combine")
        origin = lowered.origins.get(name) or lowered.origins.get(base)
        if origin is not None:
            out[name] = origin
    return out


def labels(lowered: TorchProgram, ops: Sequence[str]) -> dict[str, str]:
    """Op name -> where it comes from in the model."""
    return {name: str(o) for name, o in _origins(lowered, ops).items()}


def origins_doc(lowered: TorchProgram, ops: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Op name -> its origin as plan JSON carries it (``"origins"``)."""
    return {name: {k: v for k, v in dataclasses.asdict(o).items() if v is not None}
            for name, o in _origins(lowered, ops).items()}


def lowered_line(lowered: TorchProgram) -> str:
    c = lowered.node_counts
    fallback = sorted({n.target for n in lowered.nodes if n.status == "fallback"})
    left = (f", {c['unsupported']} left out by --partial ("
            f"{', '.join(sorted({u.origin.target for u in lowered.unsupported}))})"
            if c["unsupported"] else "")
    weights = (f"; {len(lowered.shapes_only)} weights with shapes only (meta device)"
               if lowered.shapes_only else "")
    return (f"ATen nodes: {c['lowered']} lowered to non-fallback ops, {c['fallback']} to "
            f"fallbacks ({', '.join(fallback) or 'none'}), {c['dropped']} dropped{left}; "
            f"{lowered.lowered_share:.1%} lowered{weights}")


def with_origins(planned: PlannedProgram, lowered: TorchProgram) -> PlannedProgram:
    """``planned`` whose plan JSON carries each op's PyTorch origin (and, for a ``--partial``
    lowering, the nodes left out: ``"unsupported"``)."""
    doc = origins_doc(lowered, [o.name for o in planned.ops])
    extras: tuple[tuple[str, Any], ...] = (("origins", doc),)
    if lowered.unsupported:
        extras += (("unsupported", [
            {**{k: v for k, v in dataclasses.asdict(u.origin).items() if v is not None},
             "reason": u.reason, "inputs": list(u.inputs), "reads": list(u.reads)}
            for u in lowered.unsupported]),)
    plan = dataclasses.replace(planned.plan, extras=(*planned.plan.extras, *extras))
    return dataclasses.replace(planned, plan=plan)


def plan_model(tm: TorchModel, target: Any, strategy: str) -> PlannedProgram:
    from apportion.planned import plan

    return with_origins(plan(tm.lowered.program, target, strategy), tm.lowered)


def print_plan(tm: TorchModel, planned: PlannedProgram, fmt: str, plot_dir: Path | None,
               console: Console) -> None:
    from apportion.cli.report import moe_lines, print_model_report
    from apportion.frontend.torch_moe import moe_blocks, moe_parts

    if fmt == "json":
        print(planned.to_json())
    else:
        parts = moe_parts(tm.lowered.origins, moe_blocks(tm.model))
        print_model_report(planned.plan, planned.target,
                           labels(tm.lowered, [o.name for o in planned.ops]), console,
                           lowered_line(tm.lowered), planned.program,
                           moe_lines(planned.plan, planned.program, parts))
    if plot_dir is not None:
        from apportion.cli.plot import plot_op, plot_utilization
        from apportion.cli.report import op_work

        util = plot_utilization(planned.plan, plot_dir / "utilization.png")
        drawable = [o for o in planned.ops if planned.program.op(o.name).out.dims]
        largest = max(drawable, key=lambda o: op_work(o, planned.program))
        cores = plot_op(largest, planned.program.op(largest.name).out.dims,
                        plot_dir / "largest_op.png")
        console.print(f"wrote {util} and {cores} (op {largest.name})", highlight=False)


def eager_outputs(tm: TorchModel) -> tuple[np.ndarray, ...]:
    """The model's outputs run eagerly on its example inputs, as numpy arrays."""
    import torch

    from apportion.backends.torch.executor import from_torch_storage

    with torch.no_grad():
        out = tm.model(*tm.example_inputs)
    leaves = [x for x in _leaves(out) if isinstance(x, torch.Tensor)]
    # as a run stores them: bfloat16 in float32 (numpy has none; torch's .numpy() refuses it)
    return tuple(from_torch_storage(x) for x in leaves)


def _leaves(tree: Any) -> list[Any]:
    import torch.utils._pytree as pytree

    return list(pytree.tree_leaves(tree))


def check_model(tm: TorchModel, planned: PlannedProgram, backend: str = "reference",
                threads: int | None = None) -> list[OutputCheck]:
    """Run the plan on the example inputs and compare each output with the eager model's."""
    with failures(tm, "the planned run"):
        run = planned.run(tm.lowered.inputs(*tm.example_inputs), threads=threads,
                          backend=backend)
    return compare_eager(tm, run)


def compare_eager(tm: TorchModel, run: Mapping[str, Any]) -> list[OutputCheck]:
    """Each output of a run of the lowered program (``run``: its tensors by name, such as a
    planned, sharded or distributed run gives them) compared with the model's own output,
    run eagerly in PyTorch on the example inputs, within a tolerance that follows the least
    precise float dtype the output is computed through (``reference.eager_tolerance``).

    >>> tm = load_model("apportion.frontend.torch_demo:mlp")
    >>> from apportion.runtime.reference import run_unplanned
    >>> run = run_unplanned(tm.lowered.program, tm.lowered.inputs(*tm.example_inputs))
    >>> [c.ok for c in compare_eager(tm, run)]
    [True]
    """
    from apportion.runtime.reference import compare, eager_tolerance

    with failures(tm, "reading the run's outputs"):
        got = tm.lowered.torch_outputs(run)
    with failures(tm, "the eager run in PyTorch"):
        eager = eager_outputs(tm)
    if len(eager) != len(got):
        raise FactoryError(f"--torch {tm.spec!r}: the model returned {len(eager)} tensors, the "
                           f"lowered program {len(got)}")
    names = tm.lowered.outputs
    expected = {n: e for n, e in zip(names, eager, strict=True)}
    actual = {n: np.asarray(a).reshape(e.shape) for n, a, e in zip(names, got, eager,
                                                                    strict=True)}
    # eager rounds to the model's dtypes op by op: the tolerance follows the least precise one
    tolerances = {n: eager_tolerance(tm.lowered.program, n, e) for n, e in expected.items()}
    return compare(expected, actual, _shaped(tm.lowered, eager), tolerances)


def _shaped(lowered: TorchProgram, eager: Sequence[np.ndarray]) -> Any:
    """What ``compare`` reads of a program (its outputs and their types), the outputs in the
    model's torch shapes."""
    types = {n: dataclasses.replace(lowered.program.tensor(n), shape=tuple(e.shape), dynamic=())
             for n, e in zip(lowered.outputs, eager, strict=True)}
    return _Outputs(lowered.outputs, types)


@dataclasses.dataclass(frozen=True)
class _Outputs:
    outputs: tuple[str, ...]
    types: dict[str, Any]

    def tensor(self, name: str) -> Any:
        return self.types[name]
