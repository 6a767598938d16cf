"""PyTorch models in: ``from_torch`` exports a model with ``torch.export``, decomposes it to core
ATen ops and lowers every node to apportion ops, and ``TorchProgram`` holds the program with the
values of its weights and where each op comes from.

The walk of the exported graph is ``torch_graph.lower_exported``; the lowering of each ATen op
is in ``torch_aten`` (the table) and ``torch_lower`` (values as tensors read through index
maps, and the ops that compute them); what a model lowers to is ``torch_program``. Parameters,
buffers and lifted constants become program inputs whose values are
``TorchProgram.constants``; views fold into the index maps of the next op; nodes with no
iteration-space model (gathers, ``cumsum``, constants, random numbers) become fallback ops;
no-op asserts are dropped. A node apportion cannot lower is a ``ProgramError`` naming the node,
its target, its source line and the reason. This module is the entry: ``from_torch`` (with
``dynamic_shapes``, symbolic sizes) and ``.pt2`` files (``load_exported``, ``from_exported``).

torch is imported when ``from_torch`` (or ``TorchProgram.inputs`` with torch tensors) runs, not
when this module is: ``import apportion`` works without torch.

>>> import apportion as ap, torch                                  # doctest: +SKIP
>>> tp = ap.from_torch(torch.nn.Linear(64, 32), (torch.randn(8, 64),))  # doctest: +SKIP
>>> planned = ap.plan(tp.program, ap.targets.spyre(cores=8))         # doctest: +SKIP
>>> y, = tp.torch_outputs(planned.run(tp.inputs(torch.randn(8, 64))))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NoReturn

import numpy as np

from apportion.errors import ApportionError, ProgramError
from apportion.frontend.torch_graph import lower_exported
from apportion.frontend.torch_moe import static_experts
from apportion.frontend.torch_program import (
    TorchProgram,
    tensor_leaves,
)
from apportion.ir.program import Symbol, with_symbols


def from_torch(model: Any, example_inputs: Sequence[Any], dynamic_shapes: Any = None, *,
               kwargs: Mapping[str, Any] | None = None, name: str | None = None,
               partial: bool = False) -> TorchProgram:
    """Export ``model`` (an ``nn.Module``, or an ``ExportedProgram``) on ``example_inputs``
    (and keyword inputs ``kwargs``), decompose it to core ATen ops and lower it.

    Shapes are the example inputs', or, with ``dynamic_shapes`` (as ``torch.export`` takes
    them, ``torch.export.Dim("batch", max=64)``), symbols named after the ``Dim``s with their
    bounds: the program is lowered at each symbol's planning size (its max, else its min), and
    once more per symbol at another size; every tensor axis whose size moved with the symbol
    gets it (also the outputs of an ``arange`` over it, a gather of that many ids, a mask built
    from it). A graph whose ops change with the size, or an axis that moves otherwise (``seq +
    1``, a merge with another dim) is refused naming the torch node. Hugging Face models want
    ``use_cache=False`` in their config.

    A model on torch's meta device (``with torch.device("meta"):``) lowers from shapes alone:
    its weights are inputs with no value (``TorchProgram.shapes_only``), so it plans, emits and
    shards, and refuses to run. Every node apportion cannot lower is named at once, in one
    ``UnsupportedNodes`` error (a table: ATen op, count, first source line, module path);
    ``partial=True`` lowers the rest instead, with inputs standing in for those nodes' results.
    """
    import torch

    if dynamic_shapes is not None:
        if not isinstance(model, torch.nn.Module):
            raise ProgramError("from_torch: dynamic_shapes needs the nn.Module, not an "
                               "ExportedProgram")
        return _from_torch_dynamic(model, example_inputs, dynamic_shapes, kwargs, name,
                                   partial)

    if isinstance(model, torch.export.ExportedProgram):
        ep = model
    elif isinstance(model, torch.nn.Module):
        try:
            with static_experts(model):  # experts modules in the dense, static form
                ep = torch.export.export(model, tuple(example_inputs), kwargs=dict(kwargs or {}))
        except Exception as e:  # whatever export refuses is the model's, named here
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ProgramError(f"from_torch: torch.export.export of "
                               f"{type(model).__name__} failed: {type(e).__name__}: "
                               f"{first}") from e
    else:
        raise ProgramError(f"from_torch needs a torch.nn.Module or an ExportedProgram, got "
                           f"{type(model).__name__}")
    ep = ep.run_decompositions()
    label = name or type(model).__name__
    return lower_exported(ep, re.sub(r"[^A-Za-z0-9_.\-]", "_", label) or "model", partial)


def _from_torch_dynamic(model: Any, example_inputs: Sequence[Any], dynamic_shapes: Any,
                        kwargs: Mapping[str, Any] | None, name: str | None,
                        partial: bool = False) -> TorchProgram:
    """Export with ``dynamic_shapes`` to learn which input axes are symbolic and their bounds;
    lower a static export at the planning sizes; give the program its symbols."""
    import torch

    try:
        with static_experts(model):
            ep = torch.export.export(model, tuple(example_inputs), kwargs=dict(kwargs or {}),
                                     dynamic_shapes=dynamic_shapes)
    except Exception as e:  # torch's verdict on the dynamic shapes, named here
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ProgramError(f"from_torch: torch.export.export with dynamic_shapes failed: "
                           f"{type(e).__name__}: {first}") from e
    names = _dim_names(model, dynamic_shapes, len(example_inputs), list(kwargs or {}))
    user = [sp.arg.name for sp in ep.graph_signature.input_specs
            if sp.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    shapes = {n.name: n.meta["val"].shape for n in ep.graph.nodes if n.op == "placeholder"}
    symbols: dict[str, Symbol] = {}
    axes: list[dict[int, str]] = []
    for k, arg in enumerate(user):
        found = {}
        for i, size in enumerate(shapes[arg]):
            if isinstance(size, torch.SymInt):
                expr = size.node.expr
                sym = _symbol_name(names.get((k, i), str(expr)))
                if sym not in symbols:
                    symbols[sym] = _bounded(sym, ep.range_constraints.get(expr))
                found[i] = sym
        axes.append(found)
    if not symbols:
        raise ProgramError("from_torch: dynamic_shapes made no input size symbolic")
    given = (tuple(example_inputs), dict(kwargs or {}))  # torch.export's order: args, kwargs
    leaves = tensor_leaves(given)
    if len(leaves) != len(user):
        raise ProgramError(f"from_torch: {len(user)} tensor inputs, {len(leaves)} given")

    def lowered(at: Mapping[str, int]) -> TorchProgram:
        """A static export with each symbol at its size in ``at`` (zeros: shapes are all a
        static export reads of the inputs)."""
        static = iter([torch.zeros([at[found[i]] if i in found else n
                                    for i, n in enumerate(x.shape)], dtype=x.dtype)
                       for x, found in zip(leaves, axes, strict=True)])
        args, kw = torch.utils._pytree.tree_map(
            lambda v: next(static) if isinstance(v, torch.Tensor | np.ndarray) else v, given)
        return from_torch(model, args, kwargs=kw, name=name, partial=partial)

    # the static export at the planning sizes is the program; one more per symbol, at another
    # size of it, tells which axes and dims that symbol sizes (those whose size moved with it)
    planning = {n: sym.planning_size for n, sym in symbols.items()}
    tp = lowered(planning)
    moved: dict[str, dict[int, str]] = {}
    for sym in symbols.values():
        other = sym.planning_size - 1 if sym.planning_size - 1 >= max(sym.min, 2) else \
            sym.planning_size + 1
        if sym.max is not None and other > sym.max or other < 2:
            continue  # a symbol of one usable size (min == max): nothing moves
        variant = lowered({**planning, sym.name: other})
        _moved_axes(tp, variant, sym, other, moved)
    try:
        program = with_symbols(tp.program, moved, tuple(symbols.values()))
    except ProgramError as e:
        raise ProgramError(f"from_torch: the graph computes with a dynamic size, which apportion "
                           f"plans only as a plain size of a tensor axis: {e}") from None
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    flat = torch.utils._pytree.tree_leaves(out_node.args[0])
    kinds = [sp.kind for sp in ep.graph_signature.output_specs]
    dynamic = tuple(tuple(i for i, n in enumerate(v.meta["val"].shape)
                          if isinstance(n, torch.SymInt))
                    for v, kind in zip(flat, kinds, strict=False)
                    if isinstance(v, torch.fx.Node)
                    and kind == torch.export.graph_signature.OutputKind.USER_OUTPUT)
    if len(dynamic) != len(tp.outputs):
        dynamic = ()
    return dataclasses.replace(tp, program=program, output_dynamic=dynamic)


def _moved_axes(tp: TorchProgram, variant: TorchProgram, sym: Symbol, other: int,
                moved: dict[str, dict[int, str]]) -> None:
    """Record in ``moved`` (tensor -> axis -> symbol) the axes of ``tp``'s tensors whose size is
    ``sym``'s planning size there and ``other`` in ``variant``, the same model lowered with
    ``sym`` at ``other``; refuse a graph whose ops differ between the two, or an axis that
    moved by another amount (a size like ``seq + 1``, ``2 * seq``)."""
    a, b = tp.program, variant.program
    if [(o.name, o.fn, o.out, o.ins, o.attrs) for o in a.ops] != \
            [(o.name, o.fn, o.out, o.ins, o.attrs) for o in b.ops]:
        raise ProgramError(f"from_torch: the graph's ops change with the dynamic size "
                           f"{sym.name!r} ({sym.planning_size} against {other}); apportion "
                           "plans one graph for every size")
    for t in a.tensors:
        for axis, (n, m) in enumerate(zip(t.shape, b.tensor(t.name).shape, strict=True)):
            if n == m:
                continue
            if (n, m) != (sym.planning_size, other) or axis in moved.get(t.name, {}):
                op = a.producer(t.name)
                where = tp.origins[op.name] if op is not None else f"input {t.name!r}"
                raise ProgramError(
                    f"from_torch: {where} makes tensor {t.name!r} whose dim {axis} is {n} "
                    f"when {sym.name} is {sym.planning_size} and {m} when it is {other}; "
                    f"apportion plans a dynamic size only as the whole size of an axis "
                    f"({sym.name}, not {sym.name} + 1 or a product)")
            moved.setdefault(t.name, {})[axis] = sym.name


def _dim_names(model: Any, dynamic_shapes: Any, count: int,
               keywords: Sequence[str] = ()) -> dict[tuple[int, int], str]:
    """(input, axis) -> the name of the ``Dim`` the user gave there, inputs numbered as
    torch.export flattens them (the ``count`` positional ones, then the ``keywords``), for specs
    given per input (a tuple or list) or by ``forward``'s parameter names (a dict)."""
    import inspect

    if isinstance(dynamic_shapes, dict):
        try:
            params = list(inspect.signature(model.forward).parameters)
        except (TypeError, ValueError):
            return {}
        per_input = [dynamic_shapes.get(p) for p in (*params[:count], *keywords)]
    elif isinstance(dynamic_shapes, tuple | list):
        per_input = list(dynamic_shapes)[:count + len(keywords)]
    else:
        return {}
    out = {}
    for i, spec in enumerate(per_input):
        items = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        for axis, dim in items:
            name = getattr(dim, "__name__", None)
            if isinstance(axis, int) and isinstance(name, str):
                out[(i, axis)] = name
    return out


def _symbol_name(text: str) -> str:
    clean = re.sub(r"\W", "_", text)
    return clean if clean.isidentifier() else f"s_{clean}"


def _bounded(name: str, ranges: Any) -> Symbol:
    """A symbol with torch's range constraints (an unbounded max is None)."""
    if ranges is None:
        return Symbol(name)
    lo = int(ranges.lower) if str(ranges.lower).lstrip("-").isdigit() else 1
    hi = int(ranges.upper) if str(ranges.upper).isdigit() else None
    return Symbol(name, hi, max(lo, 1))


@dataclass(frozen=True)
class SavedProgram:
    """A program saved by ``torch.export.save`` (a ``.pt2`` file), read back: the
    ``ExportedProgram`` and the example inputs torch stored with it (``args`` is None when the
    file holds none: the program plans from its shapes and does not run)."""

    exported: Any
    args: tuple[Any, ...] | None
    kwargs: Mapping[str, Any]

    @property
    def dynamic(self) -> bool:
        """Whether an input has a size torch exported as a symbol (``torch.export.Dim``)."""
        return any(_sym_axes(v) for v in _user_values(self.exported))


#: the command-line option that reads a ``.pt2`` whatever it holds (``trust=True``)
TRUST_FLAG = "--trust-pt2"


def load_exported(path: str, trust: bool = False) -> SavedProgram:
    """Read a ``.pt2`` file with ``torch.export.load``, with the example inputs torch keeps
    in its metadata (``ExportedProgram.example_inputs``) where it kept them.

    A ``.pt2`` can hold code that runs as it is read (pickles, native code, Python in its
    symbolic sizes and guards: ``pt2_trust``). Unless ``trust``, an archive holding such a part
    is refused before torch reads it, naming the part; ``torch.export.save`` of an ordinary
    model writes none.

    >>> saved = load_exported("mlp.pt2")                                # doctest: +SKIP
    >>> saved.args[0].shape, saved.dynamic                              # doctest: +SKIP
    (torch.Size([64, 256]), False)
    """
    import torch

    from apportion.frontend.pt2_trust import unsafe_part, unsafe_value

    if not os.path.isfile(path):
        raise ProgramError(f"{path!r}: no such .pt2 file")

    def refuse(part: str) -> NoReturn:
        raise ProgramError(f"{path!r}: refused: {part}; a .pt2 can hold code that runs as it "
                           f"is read: {TRUST_FLAG} (Python: trust=True) reads it, if you trust "
                           "where it came from")

    try:
        if trust:
            ep = torch.export.load(path)
        else:
            # one open file for the check and the load: the one checked is the one read
            with open(path, "rb") as f:
                try:
                    part = unsafe_part(f)
                except ValueError as e:
                    raise ProgramError(f"{path!r}: torch.export.load cannot read it: {e}"
                                       ) from None
                if part:
                    refuse(part)
                f.seek(0)
                ep = torch.export.load(f)
            part = unsafe_value(ep)
            if part:
                refuse(part)
    except ApportionError:
        raise
    except Exception as e:  # torch's reason, one line: not a .pt2, another torch's format
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ProgramError(f"{path!r}: torch.export.load cannot read it: "
                           f"{type(e).__name__}: {first}") from None
    stored = getattr(ep, "example_inputs", None)
    if not stored:
        return SavedProgram(ep, None, MappingProxyType({}))
    args, kwargs = stored
    return SavedProgram(ep, tuple(args), MappingProxyType(dict(kwargs or {})))


def from_exported(saved: SavedProgram, name: str, partial: bool = False) -> TorchProgram:
    """Lower a program read by ``load_exported``. A static one lowers as exported; one saved
    with dynamic shapes keeps its symbols (named as torch stored them, ``s77``, with their
    bounds): its module is exported again per size, as ``from_torch`` does with
    ``dynamic_shapes``, on the stored example inputs or, without them, on zeros of the
    planning sizes (shapes are all an export reads).

    >>> tp = from_exported(load_exported("mlp_dynamic.pt2"), "mlp")  # doctest: +SKIP
    >>> [(s.name, s.min, s.max) for s in tp.program.symbols]          # doctest: +SKIP
    [('s77', 2, 128)]
    """
    import torch

    ep = saved.exported
    if not saved.dynamic:
        return from_torch(ep, saved.args or (), name=name, partial=partial)
    values = _user_values(ep)
    dims: dict[str, Any] = {}
    specs: list[dict[int, Any] | None] = []
    for v in values:
        found = {}
        for axis, expr in _sym_axes(v).items():
            if str(expr) not in dims:
                r = ep.range_constraints.get(expr)
                lo = int(r.lower) if r is not None and str(r.lower).isdigit() else None
                hi = int(r.upper) if r is not None and str(r.upper).isdigit() else None
                dims[str(expr)] = torch.export.Dim(_symbol_name(str(expr)), min=lo, max=hi)
            found[axis] = dims[str(expr)]
        specs.append(found or None)
    if saved.args is not None:
        args, kwargs = saved.args, dict(saved.kwargs)
    else:  # zeros at the planning sizes: a static export reads only their shapes
        sizes = {k: _bounded(d.__name__, ep.range_constraints.get(_expr(ep, k))).planning_size
                 for k, d in dims.items()}
        zeros = [torch.zeros([sizes[str(n.node.expr)] if isinstance(n, torch.SymInt) else n
                              for n in v.shape], dtype=v.dtype)
                 if isinstance(v, torch.Tensor) else v for v in values]
        args, kwargs = torch.utils._pytree.tree_unflatten(zeros, ep.call_spec.in_spec)
        args, kwargs = tuple(args), dict(kwargs)
    # one spec per top-level input (args, then kwargs): each input here is one tensor leaf
    if len(tensor_leaves((tuple(args), kwargs))) != len(args) + len(kwargs):
        raise ProgramError(f"program {name!r}: a .pt2 program with dynamic shapes is read when "
                           "each input is one tensor (no nested inputs)")
    return _from_torch_dynamic(ep.module(), tuple(args), tuple(specs), kwargs, name, partial)


def _user_values(ep: Any) -> list[Any]:
    """The example values (fake tensors) of an exported program's user inputs, in order."""
    import torch

    user = {sp.arg.name for sp in ep.graph_signature.input_specs
            if sp.kind == torch.export.graph_signature.InputKind.USER_INPUT}
    return [n.meta.get("val") for n in ep.graph.nodes
            if n.op == "placeholder" and n.name in user]


def _sym_axes(value: Any) -> dict[int, Any]:
    """Axis -> sympy expression of each symbolic size of a fake tensor."""
    import torch

    shape = getattr(value, "shape", ())
    return {i: n.node.expr for i, n in enumerate(shape) if isinstance(n, torch.SymInt)}


def _expr(ep: Any, text: str) -> Any:
    return next((e for e in ep.range_constraints if str(e) == text), None)
