"""``--torch module:factory``: PyTorch models on the command line (plan and run).

A factory is a Python callable, imported from the current directory or ``PYTHONPATH``, that
returns one of:

- ``(model, args)``: positional example inputs (a tuple, or one tensor);
- ``(model, args, kwargs)``: and keyword inputs (a dict, such as ``{"attention_mask": mask}``);
- ``(model, {"args": ..., "kwargs": ..., "dynamic_shapes": ...})``: any of the three keys, the
  ``dynamic_shapes`` as ``torch.export.export`` takes them.

``--dynamic INPUT:DIM=SYMBOL:MIN..MAX`` makes dim DIM of input INPUT (a parameter name of the
model's ``forward``) a run-time size, as ``torch.export.Dim(SYMBOL, min=MIN, max=MAX)`` does;
another input sized by the same symbol names it again, bounds left out. ``--torch FILE.pt2``
reads a program saved by ``torch.export.save`` instead, with the example inputs torch stored.

``plan --torch`` prints the model report (op families, the least utilized ops with their PyTorch
names, the share of ATen nodes lowered to non-fallback ops, the run-time sizes); ``run --torch
--check`` runs the plan and compares it with the model run eagerly (``--param seq=40``: at that
size, the example inputs cut or repeated to it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from apportion.errors import ApportionError
from apportion.report.model import origins_doc

if TYPE_CHECKING:

    from apportion.frontend.torch_program import TorchProgram
    from apportion.planned import PlannedProgram
    from apportion.runtime.reference import OutputCheck


class FactoryError(ApportionError):
    """A ``--torch module:factory`` that cannot be found, called or used."""


@dataclasses.dataclass(frozen=True)
class TorchModel:
    """A model, its example inputs (positional and keyword), and the program lowered from it.
    ``example_inputs`` is None for a ``.pt2`` file that stored none (it plans, not runs)."""

    spec: str
    model: Any
    example_inputs: tuple[Any, ...] | None
    lowered: TorchProgram
    example_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ModelInputs:
    """What a factory gives besides its model: example ``args``, keyword ``kwargs``, and
    ``dynamic_shapes`` for ``torch.export`` (None: every size static)."""

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dynamic_shapes: Any = None


@dataclasses.dataclass(frozen=True)
class DynamicDim:
    """One ``--dynamic INPUT:DIM=SYMBOL:MIN..MAX`` (bounds None where left out)."""

    text: str
    input: str
    dim: int
    symbol: str
    min: int | None
    max: int | None


_ASCII_DIGITS = re.compile(r"[0-9]+")
#: the largest MAX of a ``--dynamic`` range: torch holds a dim's size in an int64
MAX_DYNAMIC = 2 ** 63 - 1
_DYNAMIC = re.compile(r"(?P<input>[^:=]*):(?P<dim>[^=]*)=(?P<symbol>[^:]*)(?::(?P<bounds>.*))?")


def parse_dynamic(texts: Sequence[str]) -> tuple[DynamicDim, ...]:
    """``--dynamic`` values, checked for form: ``INPUT:DIM=SYMBOL:MIN..MAX``, the bounds given
    with the first use of a symbol (a later use may leave them out, or repeat them).

    >>> parse_dynamic(["input_ids:1=seq:2..64", "attention_mask:1=seq"])[1].max
    64
    """
    out: list[DynamicDim] = []
    bounds: dict[str, tuple[int, int]] = {}
    for text in texts:
        m = _DYNAMIC.fullmatch(text)
        if m is None:
            raise FactoryError(f"--dynamic {text!r}: expected INPUT:DIM=SYMBOL:MIN..MAX, such "
                               "as --dynamic input_ids:1=seq:2..64")
        name, dim, symbol = m["input"], m["dim"], m["symbol"]
        where = f"--dynamic {text!r}: input {name!r} dim {dim}"
        if not name.isidentifier():
            raise FactoryError(f"--dynamic {text!r}: input {name!r} is not a parameter name "
                               "of the model's forward")
        if not _ASCII_DIGITS.fullmatch(dim):  # str.isdigit takes '⁰' (int fails) and '٠'
            raise FactoryError(f"{where}: the dim must be a non-negative integer in digits 0-9")
        if not symbol.isidentifier():
            raise FactoryError(f"{where}: symbol {symbol!r} is not a name (letters, digits, _)")
        lo = hi = None
        if m["bounds"] is not None:
            low, dots, high = m["bounds"].partition("..")
            if not dots or not _ASCII_DIGITS.fullmatch(low) or not _ASCII_DIGITS.fullmatch(high):
                raise FactoryError(f"{where}: bounds {m['bounds']!r} are not MIN..MAX (two "
                                   "integers in digits 0-9, such as 2..64)")
            lo, hi = int(low), int(high)
            if not 2 <= lo < hi:  # torch.export.Dim refuses MIN = MAX: one size is static
                why = ("torch specializes sizes 0 and 1" if lo < 2 else "MIN is above MAX"
                       if lo > hi else f"one size is a static size: leave this --dynamic out "
                       f"for size {lo}")
                raise FactoryError(f"{where}: bounds {lo}..{hi} need 2 <= MIN < MAX ({why})")
            if hi > MAX_DYNAMIC:
                raise FactoryError(f"{where}: MAX {hi} is beyond {MAX_DYNAMIC}, the largest "
                                   "size of a torch dim (int64)")
            if bounds.get(symbol, (lo, hi)) != (lo, hi):
                was = bounds[symbol]
                raise FactoryError(f"{where}: symbol {symbol!r} was given bounds "
                                   f"{was[0]}..{was[1]} before, {lo}..{hi} here")
            bounds[symbol] = (lo, hi)
        elif symbol not in bounds:
            raise FactoryError(f"{where}: symbol {symbol!r} needs bounds where it is first "
                               f"named ({text}:MIN..MAX)")
        if any(d.input == name and d.dim == int(dim) for d in out):
            raise FactoryError(f"{where}: given twice")
        out.append(DynamicDim(text, name, int(dim), symbol, *bounds[symbol]))
    return tuple(out)


def dynamic_shapes(spec: str, model: Any, inputs: ModelInputs,
                   dims: Sequence[DynamicDim]) -> dict[str, Any]:
    """The ``dynamic_shapes`` of ``--dynamic`` dims for ``torch.export``: a dict keyed by the
    model's ``forward`` parameter names, each example input checked to have the dim, its size
    within the bounds.

    >>> import torch                                                    # doctest: +SKIP
    >>> dynamic_shapes("m:f", torch.nn.Linear(4, 4), ModelInputs((torch.ones(8, 4),)),
    ...                parse_dynamic(["input:0=rows:2..16"]))         # doctest: +SKIP
    {'input': {0: Dim('rows', min=2, max=16)}}
    """
    import inspect

    import torch

    try:
        params = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        params = []
    given = dict(zip(params, inputs.args, strict=False)) | dict(inputs.kwargs)
    symbols = {d.symbol: torch.export.Dim(d.symbol, min=d.min, max=d.max) for d in dims}
    out: dict[str, Any] = {name: None for name in given}
    for d in dims:
        where = f"--dynamic {d.text!r}: input {d.input!r} dim {d.dim}"
        if d.input not in given:
            raise FactoryError(f"{where}: {spec} gives no input {d.input!r} (its inputs: "
                               f"{', '.join(given) or 'none'})")
        x = given[d.input]
        if not isinstance(x, torch.Tensor):
            raise FactoryError(f"{where}: the input is a {type(x).__name__}, not a tensor")
        if d.dim >= x.dim():
            raise FactoryError(f"{where}: the input has {x.dim()} dims (shape "
                               f"{tuple(x.shape)})")
        size = int(x.shape[d.dim])
        assert d.min is not None and d.max is not None  # parse_dynamic gives every dim bounds
        if not d.min <= size <= d.max:
            raise FactoryError(f"{where}: the example input's size {size} is outside "
                               f"{d.symbol}'s bounds {d.min}..{d.max}")
        out[d.input] = {**(out[d.input] or {}), d.dim: symbols[d.symbol]}
    return out


def load_factory(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """``load_inputs``, for callers that take positional example inputs only: a factory that
    gives keyword inputs or dynamic shapes is refused, naming them."""
    model, inputs = load_inputs(spec)
    if inputs.kwargs or inputs.dynamic_shapes is not None:
        raise FactoryError(f"--torch {spec!r}: gives keyword inputs or dynamic shapes, which "
                           "this command does not take (positional example inputs only)")
    return model, inputs.args


def load_inputs(spec: str) -> tuple[Any, ModelInputs]:
    """Import ``module:factory`` (the current directory first on the path) and call it; its
    result, in any of the forms the module docstring lists, as the model and its inputs.

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
    return _model_inputs(f"--torch {spec!r}: {attr}()", made)


_KEYS = ("args", "kwargs", "dynamic_shapes")


def _model_inputs(who: str, made: Any) -> tuple[Any, ModelInputs]:
    """A factory's result as (model, ModelInputs); a malformed one named in one line."""
    forms = ("(model, example_inputs): (model, args), (model, args, kwargs) or (model, "
             "{'args': ..., 'kwargs': ..., 'dynamic_shapes': ...})")
    if not (isinstance(made, tuple | list) and len(made) in (2, 3)):
        got = f"a {len(made)}-tuple" if isinstance(made, tuple | list) else type(made).__name__
        raise FactoryError(f"{who} must return {forms}, got {got}")
    model, given, *rest = made
    if isinstance(given, dict) and not rest:  # the keyed form
        unknown = sorted(set(given) - set(_KEYS), key=str)
        if unknown:
            raise FactoryError(f"{who} returned inputs with key {unknown[0]!r}; the keys are "
                               f"{', '.join(_KEYS)}")
        args, kwargs = given.get("args", ()), given.get("kwargs") or {}
        shapes = given.get("dynamic_shapes")
    else:
        args, kwargs, shapes = given, (rest[0] if rest else {}), None
    if not isinstance(args, tuple | list):
        args = (args,)
    if not (isinstance(kwargs, Mapping) and all(isinstance(k, str) for k in kwargs)):
        raise FactoryError(f"{who}: keyword inputs must be a dict of names to inputs, got "
                           f"{type(kwargs).__name__}")
    return model, ModelInputs(tuple(args), dict(kwargs), shapes)


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
               err: TextIO | None = None, dynamic: Sequence[str] = (),
               trust_pt2: bool = False) -> TorchModel:
    """The factory's model lowered with ``from_torch``.

    Nodes apportion cannot lower are refused all at once: their table (ATen op, count, first
    source line, module path) on ``err`` (stderr) and one error line. With ``partial`` the rest
    is lowered and the table of what was left out is printed on ``err`` instead. For a ``run``
    (which needs every value), ``partial`` and a model on the meta device are refused, before
    any planning. ``dynamic`` holds ``--dynamic`` specs (``parse_dynamic``); a ``spec``
    ending in ``.pt2`` is a file ``torch.export.save`` wrote (``load_exported``: one holding
    parts that run code as they are read is refused unless ``trust_pt2``).

    >>> tm = load_model("apportion.frontend.torch_models:llama3_tiny")
    >>> len(tm.lowered.shapes_only), tm.lowered.program.tensor("input_ids").shape
    (22, (1, 16))
    """
    from apportion.frontend.torch_export import from_torch

    err = err or sys.stderr
    if run and partial:
        raise FactoryError(f"--torch {spec!r}: run --partial would run the nodes apportion "
                           "cannot lower eagerly between planned parts, which run does not "
                           "support; --partial goes with plan, emit, schedule and shard")
    dims = parse_dynamic(dynamic)
    if spec.endswith(".pt2"):
        return _load_pt2(spec, partial, run, err, dims, trust_pt2)
    model, inputs = load_inputs(spec)
    name = spec.partition(":")[2]
    shapes = inputs.dynamic_shapes
    if dims:
        if shapes is not None:
            raise FactoryError(f"--torch {spec!r}: the factory gives dynamic_shapes and "
                               "--dynamic is given too; give the dynamic sizes one way")
        shapes = dynamic_shapes(spec, model, inputs, dims)
    # what torch raises while it decomposes the graph (from_torch names export's own refusals)
    # is the model's, one line
    lowered = _lowered(spec, "exporting and lowering the model", partial, run, err,
                       lambda: from_torch(model, inputs.args, shapes, kwargs=inputs.kwargs,
                                          name=name, partial=partial))
    return TorchModel(spec, model, inputs.args, lowered, inputs.kwargs)


def _lowered(spec: str, doing: str, partial: bool, run: bool, err: TextIO,
             lower: Callable[[], Any]) -> Any:
    """``lower()`` (a ``TorchProgram``) with torch's own notices held back, a failure while
    ``doing`` it one line, every node apportion cannot lower refused at once (their table on
    ``err``, then one error line), what ``partial`` left out shown on ``err``, and, for a
    ``run``, a model without weights refused."""
    from apportion.frontend.torch_program import UnsupportedNodes, unsupported_table

    try:
        # torch.export's own deprecation notices are not the user's
        with warnings.catch_warnings(), _quiet_torch(), _failing(spec, doing):
            warnings.simplefilter("ignore", FutureWarning)
            lowered = lower()
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
    return lowered


def _load_pt2(spec: str, partial: bool, run: bool, err: TextIO,
              dims: Sequence[DynamicDim], trust: bool = False) -> TorchModel:
    """``--torch FILE.pt2``: the saved program, lowered; its module runs eagerly for --check."""
    from apportion.frontend.torch_export import from_exported, load_exported

    if dims:
        raise FactoryError(f"--dynamic {dims[0].text!r}: --torch {spec!r} is a saved program, "
                           "whose dynamic sizes are the ones it was exported with")
    with warnings.catch_warnings(), _quiet_torch(), _failing(spec, "reading the .pt2 file"):
        warnings.simplefilter("ignore", FutureWarning)
        try:
            saved = load_exported(spec, trust=trust)
        except ApportionError as e:
            raise FactoryError(f"--torch {e}") from None
    if run and saved.args is None:
        raise FactoryError(f"--torch {spec!r}: the file stores no example inputs to run on "
                           "(torch.export.save keeps the ones a program was exported on; this "
                           "program had none); plan, emit and shard work from its shapes")
    name = Path(spec).stem
    lowered = _lowered(spec, "lowering the exported program", partial, run, err,
                       lambda: from_exported(saved, name, partial=partial))
    return TorchModel(spec, saved.exported.module(), saved.args, lowered, dict(saved.kwargs))


def at_sizes(tm: TorchModel, sizes: Mapping[str, int]) -> TorchModel:
    """``tm`` with its example inputs at run-time sizes ``sizes`` (symbol -> size): each
    dynamic axis cut to the size, or its values repeated up to it (token ids and masks stay
    valid), for ``run --param seq=40``.

    >>> tm = load_model("apportion.frontend.torch_demo:mlp", dynamic=["x:0=rows:2..128"])
    >>> at_sizes(tm, {"rows": 100}).example_inputs[0].shape[0]
    100
    """
    import torch
    import torch.utils._pytree as pytree

    program = tm.lowered.program
    axes = [program.tensor(n).symbols for n in tm.lowered.user_inputs]
    found = iter(axes)

    def resized(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        for axis, sym in next(found).items():
            n, have = sizes.get(sym), x.shape[axis]
            if n is not None:
                reps = [1] * x.dim()
                reps[axis] = -(-n // have)
                x = x.repeat(*reps).narrow(axis, 0, n)
        return x

    args, kwargs = pytree.tree_map(resized, (tm.example_inputs or (), dict(tm.example_kwargs)))
    return dataclasses.replace(tm, example_inputs=tuple(args), example_kwargs=kwargs)


def unsupported_text(lowered: TorchProgram) -> str:
    """What ``--partial`` left out: the unsupported-node table and its share of the nodes."""
    from apportion.frontend.torch_program import unsupported_table

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


def eager_outputs(tm: TorchModel) -> tuple[np.ndarray, ...]:
    """The model's outputs run eagerly on its example inputs, as numpy arrays."""
    import torch

    from apportion.backends.torch.tensors import from_torch_storage

    with torch.no_grad():
        out = tm.model(*(tm.example_inputs or ()), **tm.example_kwargs)
    leaves = [x for x in _leaves(out) if isinstance(x, torch.Tensor)]
    # as a run stores them: bfloat16 in float32 (numpy has none; torch's .numpy() refuses it)
    return tuple(from_torch_storage(x) for x in leaves)


def _leaves(tree: Any) -> list[Any]:
    import torch.utils._pytree as pytree

    return list(pytree.tree_leaves(tree))


def model_inputs(tm: TorchModel) -> dict[str, np.ndarray]:
    """Every program input for the model's example inputs (positional and keyword)."""
    return tm.lowered.inputs(*(tm.example_inputs or ()), **tm.example_kwargs)


def check_model(tm: TorchModel, planned: PlannedProgram, backend: str = "reference",
                threads: int | None = None, params: Mapping[str, int] | None = None
                ) -> list[OutputCheck]:
    """Run the plan on the example inputs (at run-time sizes ``params``, given already in
    them: ``at_sizes``) and compare each output with the eager model's."""
    with failures(tm, "the planned run"):
        run = planned.run(model_inputs(tm), threads=threads, backend=backend,
                          params=dict(params or {}))
    return compare_eager(tm, run)


def compare_eager(tm: TorchModel, run: Mapping[str, Any]) -> list[OutputCheck]:
    """Each output of a run of the lowered program (``run``: its tensors by name, such as a
    planned, sharded or distributed run gives them) compared with the model's own output,
    run eagerly in PyTorch on the example inputs, within a tolerance that follows the least
    precise float dtype the output is computed through (``reference.eager_tolerance``).

    >>> tm = load_model("apportion.frontend.torch_demo:mlp")
    >>> from apportion.runtime.reference import run_unplanned
    >>> run = run_unplanned(tm.lowered.program, model_inputs(tm))
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
