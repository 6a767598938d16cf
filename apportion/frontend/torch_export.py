"""PyTorch models in: ``from_torch`` exports a model with ``torch.export``, decomposes it to core
ATen ops and lowers every node to apportion ops, and ``TorchProgram`` holds the program with the
values of its weights and where each op comes from.

The lowering of each ATen op is in ``torch_aten`` (the table) and ``torch_lower`` (values as
tensors read through index maps, and the ops that compute them). Parameters, buffers and lifted
constants become program inputs whose values are ``TorchProgram.constants``; views fold into the
index maps of the next op; nodes with no iteration-space model (gathers, ``cumsum``, constants,
random numbers) become fallback ops; no-op asserts are dropped. A node apportion cannot lower is
a ``ProgramError`` naming the node, its target, its source line and the reason.

torch is imported when ``from_torch`` (or ``TorchProgram.inputs`` with torch tensors) runs, not
when this module is: ``import apportion`` works without torch.

>>> import apportion as ap, torch                                  # doctest: +SKIP
>>> tp = ap.from_torch(torch.nn.Linear(64, 32), (torch.randn(8, 64),))  # doctest: +SKIP
>>> planned = ap.plan(tp.program, ap.targets.spyre(cores=8))         # doctest: +SKIP
>>> y, = tp.torch_outputs(planned.run(tp.inputs(torch.randn(8, 64))))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NoReturn

import numpy as np

from apportion.errors import ApportionError, ProgramError
from apportion.frontend import torch_lower
from apportion.frontend.torch_aten import DROPPED, LOWERINGS, Ctx, static_shape, torch_dtype
from apportion.frontend.torch_lower import Lowering, Origin, Value, is_fallback, unsqueeze
from apportion.frontend.torch_moe import static_experts
from apportion.ir.dtypes import DTYPE_BYTES
from apportion.ir.program import Program, Symbol, with_symbols

__all__ = ["NodeLowering", "Origin", "SavedProgram", "TorchProgram", "Unsupported",
           "UnsupportedNodes", "from_exported", "from_torch", "load_exported", "unsupported_table"]

#: what became of an ATen node: ops that are not fallbacks (or index maps only), at least one
#: fallback op, nothing (a no-op assert), or nothing because apportion cannot lower it (left
#: out of a ``partial`` program)
STATUSES = ("lowered", "fallback", "dropped", "unsupported")


@dataclass(frozen=True)
class NodeLowering:
    """One ATen node of the exported graph and the apportion ops it became (``getitem``
    nodes, which pick one result of a multi-result op, are not listed)."""

    node: str
    target: str
    status: str
    ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unsupported:
    """An ATen node apportion cannot lower: where it is (its ``Origin``), why (``reason``,
    ``short`` for a table), the program inputs that stand in for its results in a ``partial``
    program and the program outputs holding the operands it would read."""

    origin: Origin
    reason: str
    short: str
    inputs: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()


class UnsupportedNodes(ProgramError):
    """Every ATen node of a model that apportion cannot lower, at once: the message's first
    line names the first of them, the lines after it are ``unsupported_table``."""

    def __init__(self, name: str, unsupported: Sequence[Unsupported], total: int) -> None:
        self.unsupported = tuple(unsupported)
        self.total = total
        first = self.unsupported[0]
        count = len(self.unsupported)
        self.summary = (f"{count} ATen node{'s' if count != 1 else ''} of {name!r} cannot be "
                        f"lowered ({count} of {total}); the first: {first.origin}: "
                        f"{first.reason}")
        super().__init__(f"{self.summary}\n{unsupported_table(self.unsupported, total)}\n"
                         "a partial lowering (--partial, from_torch(..., partial=True)) plans "
                         "the rest, these nodes' results its inputs")


def unsupported_table(unsupported: Sequence[Unsupported], total: int) -> str:
    """One row per ATen op apportion cannot lower: how many nodes, the first one's source line
    and module path, and why; then their share of the ``total`` ATen nodes.

    >>> u = [Unsupported(Origin("conv", "aten.convolution.default", "m.py:3", "conv"),
    ...                  "apportion has no lowering", "no lowering")] * 2
    >>> print(unsupported_table(u, 8))
    ATen op                   count  first source line  module path  why
    aten.convolution.default      2  m.py:3             conv         no lowering
    2 of 8 ATen nodes (25.0%) cannot be lowered
    """
    rows: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for u in unsupported:
        o = u.origin
        counts[o.target] = counts.get(o.target, 0) + 1
        rows.setdefault(o.target, [o.target, "", o.source or "-", o.module or "-", u.short])
    for target, row in rows.items():
        row[1] = str(counts[target])
    table = [["ATen op", "count", "first source line", "module path", "why"], *rows.values()]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    lines = ["  ".join([r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].ljust(widths[2]),
                        r[3].ljust(widths[3]), r[4]]) for r in table]
    lines[0] = lines[0].replace("count".rjust(widths[1]), "count".ljust(widths[1]), 1)
    share = len(unsupported) / total if total else 1.0
    lines.append(f"{len(unsupported)} of {total} ATen nodes ({share:.1%}) cannot be lowered")
    return "\n".join(lines)


@dataclass(frozen=True)
class TorchProgram:
    """A PyTorch model as an apportion program.

    ``user_inputs`` are the program inputs of the model's example inputs (its tensors, in the
    order ``torch.export`` flattens them); ``constants`` hold the values of the other inputs
    (weights, buffers, lifted constants, scalars). ``outputs`` are the tensors of the model's
    outputs, whose torch shapes are ``output_shapes`` (a tensor stores its output in torch's
    row-major order; a dim merged from several, like heads times head width, may be held as
    several axes: ``torch_outputs`` reshapes). ``origins`` maps each op to the torch node it
    lowers, and ``nodes`` lists what became of every node.

    A model on torch's meta device gives ``shapes_only``: its weights (and buffers) that are
    program inputs of a shape and dtype with no value; the program plans and emits, but does not
    run. A ``partial`` lowering lists in ``unsupported`` the nodes it left out: program inputs
    stand in for their results, and the program also outputs what they read.
    """

    program: Program
    constants: Mapping[str, np.ndarray]
    user_inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    origins: Mapping[str, Origin]
    nodes: tuple[NodeLowering, ...]
    #: per output, its torch axes whose size is a run-time size (``dynamic_shapes``)
    output_dynamic: tuple[tuple[int, ...], ...] = ()
    #: weights, buffers and constants with a shape and dtype but no value (the meta device)
    shapes_only: tuple[str, ...] = ()
    #: the nodes a partial lowering left out
    unsupported: tuple[Unsupported, ...] = ()

    @property
    def node_counts(self) -> dict[str, int]:
        """ATen nodes lowered to non-fallback ops (or index maps), to fallbacks, dropped."""
        counts = dict.fromkeys(STATUSES, 0)
        for n in self.nodes:
            counts[n.status] += 1
        return counts

    @property
    def lowered_share(self) -> float:
        """The share of the nodes that compute something lowered to non-fallback ops."""
        c = self.node_counts
        total = c["lowered"] + c["fallback"] + c["unsupported"]
        return c["lowered"] / total if total else 1.0

    def require_values(self) -> None:
        """Refuse, in one line, to run a program whose inputs are not all known: weights with
        shapes only (a meta-device model) or the results of nodes a partial lowering left out.

        >>> import apportion as ap, torch                                # doctest: +SKIP
        >>> from apportion.frontend.torch_models import llama3_tiny      # doctest: +SKIP
        >>> ap.from_torch(*llama3_tiny()).require_values()               # doctest: +SKIP
        Traceback (most recent call last):
        ProgramError: program 'LlamaForCausalLM' has 21 weights with shapes only ...
        """
        if self.shapes_only:
            shown = ", ".join(repr(n) for n in self.shapes_only[:2])
            raise ProgramError(
                f"program {self.program.name!r} has {len(self.shapes_only)} weights with shapes "
                f"only ({shown}{', ...' if len(self.shapes_only) > 2 else ''}: the model is on "
                "torch's meta device); running it needs weights: build the model on the cpu "
                "(plan, emit and shard work from shapes alone)")
        if self.unsupported:
            stand = [n for u in self.unsupported for n in u.inputs]
            raise ProgramError(
                f"program {self.program.name!r} is the lowered part of a model: "
                f"{len(self.unsupported)} ATen nodes apportion cannot lower were left out "
                f"(first: {self.unsupported[0].origin.target}) and their results "
                f"({', '.join(repr(n) for n in stand[:2]) or 'none'}"
                f"{', ...' if len(stand) > 2 else ''}) are its inputs; running it would run "
                "them eagerly between planned parts, which run does not support (plan and emit "
                "work on the lowered part)")

    def inputs(self, *example_inputs: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        """Every program input for these model inputs (given as to ``from_torch``): the user
        inputs as numpy arrays, then the constants; ready for ``PlannedProgram.run``."""
        self.require_values()
        leaves = _tensor_leaves((tuple(example_inputs), dict(kwargs)))
        if len(leaves) != len(self.user_inputs):
            raise ProgramError(f"program {self.program.name!r} takes {len(self.user_inputs)} "
                               f"tensor inputs ({', '.join(self.user_inputs)}), got "
                               f"{len(leaves)}")
        meta = [n for n, x in zip(self.user_inputs, leaves, strict=True)
                if getattr(x, "is_meta", False)]
        if meta:
            raise ProgramError(f"input {meta[0]!r} is a tensor on torch's meta device (a shape, "
                               "no values): running the program needs its values")
        out = {name: _numpy(x) for name, x in zip(self.user_inputs, leaves, strict=True)}
        out.update(self.constants)
        return out

    def torch_outputs(self, results: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The model's outputs from a run's tensors, in the model's order and torch shapes."""
        dynamic = self.output_dynamic or ((),) * len(self.outputs)
        return tuple(_torch_shaped(np.asarray(results[n]), s, d)
                     for n, s, d in zip(self.outputs, self.output_shapes, dynamic, strict=True))


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
    leaves = _tensor_leaves(given)
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


def lower_exported(ep: Any, name: str, partial: bool = False) -> TorchProgram:
    """Lower an ``ExportedProgram`` whose graph holds core ATen ops.

    Every node apportion cannot lower is collected (program inputs stand in for its results, so
    that the nodes after it lower too) and refused at once in one ``UnsupportedNodes`` error;
    with ``partial`` the program is the rest, listing them in ``unsupported``."""
    import torch

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    sig = ep.graph_signature
    specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    lw = Lowering(name)
    env: dict[Any, Any] = {}
    user_inputs: list[str] = []
    shapes_only: list[str] = []
    nodes: list[NodeLowering] = []
    unsupported: list[Unsupported] = []
    outputs: list[str] = []
    shapes: list[tuple[int, ...]] = []
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            _placeholder(ep, lw, node, specs.get(node.name), env, user_inputs, shapes_only)
        elif node.op == "call_function":
            origin = _origin(node, torch_dir)
            lw.at(origin)
            mark = lw.mark()
            status = "dropped" if str(node.target) in DROPPED else "lowered"
            made: list[Any] = []
            try:
                env[node] = None if status == "dropped" else _lower_node(lw, node, origin, env)
                made = lw.ops[mark[0]:]
            except _CannotLower as e:
                lw.rollback(mark)  # what its lowering made before it refused
                status = "unsupported"
                env[node], inputs, reads = _stand_in(lw, node, env)
                unsupported.append(Unsupported(origin, e.reason, e.short, tuple(inputs),
                                               tuple(reads)))
            if any(is_fallback(o) for o in made):
                status = "fallback"
            if node.target is not operator.getitem:  # picks a result: not an ATen node
                nodes.append(NodeLowering(node.name, str(node.target), status,
                                          tuple(o.name for o in made)))
        elif node.op == "output":
            lw.at(Origin("output", "output"))
            try:
                _outputs(lw, sig, node, env, outputs, shapes)
            except ProgramError:
                if unsupported:  # an output an unsupported node makes: the table says why
                    raise UnsupportedNodes(name, unsupported, len(nodes)) from None
                raise
        else:
            raise ProgramError(f"graph node {node.name!r} ({node.op} {node.target}) is not "
                               "supported; core ATen graphs hold placeholders, call_function "
                               "nodes and the output")
    left = any(n.status in ("lowered", "fallback") for n in nodes)  # for partial to plan
    if unsupported and not (partial and left):
        raise UnsupportedNodes(name, unsupported, len(nodes))
    # the operands of the nodes left out are outputs of the lowered part: they would be read
    extra = tuple(dict.fromkeys(t for u in unsupported for t in u.reads if t not in outputs))
    try:
        program = Program(name, tuple(lw.types.values()), tuple(lw.inputs),
                          (*outputs, *extra), tuple(lw.ops))
    except ProgramError as e:  # a lowering bug, not the model's: say so
        raise ProgramError(f"lowering {name!r} gave an invalid program: {e}") from None
    return TorchProgram(program, MappingProxyType(dict(lw.constants)), tuple(user_inputs),
                        tuple(outputs), tuple(shapes), MappingProxyType(dict(lw.origins)),
                        tuple(nodes), shapes_only=tuple(shapes_only),
                        unsupported=tuple(unsupported))


def _placeholder(ep: Any, lw: Lowering, node: Any, spec: Any, env: dict[Any, Any],
                 user_inputs: list[str], shapes_only: list[str]) -> None:
    val = node.meta.get("val")
    kind = spec.kind.name if spec is not None else "USER_INPUT"
    if not hasattr(val, "shape"):  # a non-tensor input export kept: its example value
        env[node] = val
        return
    where = f"input {node.name!r}"
    if kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR") and not node.users:
        return  # unused (a buffer the forward pass never reads): its shape and dtype do not matter
    try:
        shape = static_shape(val.shape)
    except ProgramError as e:
        raise ProgramError(f"{where}: {e}") from None
    if any(n == 0 for n in shape):
        what = (f"the example input {node.name!r}" if kind == "USER_INPUT" else
                f"{kind.lower().replace('_', ' ')} {getattr(spec, 'target', node.name)!r}")
        fix = ("give example inputs with every dim >= 1: the plan is made for the examples' "
               "shapes" if kind == "USER_INPUT" else "apportion plans tensors with every dim >= 1")
        raise ProgramError(f"{what} has shape {list(shape)}, an empty tensor: {fix}")
    dtype = torch_dtype(val.dtype, f"{where}: dtype")
    if kind == "USER_INPUT":
        env[node] = lw.input(node.name, dtype, shape)
        user_inputs.append(node.name)
    elif kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
        target = spec.target
        value = ep.state_dict[target] if target in ep.state_dict else ep.constants[target]
        meta = getattr(value, "is_meta", False)  # a meta-device weight: shape and dtype only
        rows = _block_rows(node, shape, dtype)
        if rows is not None:  # an embedding table too large for one core: row blocks
            array = None if meta else _numpy(value)
            env[node] = _row_blocks(lw, node.name, dtype, shape, rows, array)
            if meta:
                shapes_only.extend(v.tensor for v in env[node].blocks)
        elif meta:
            env[node] = lw.input(node.name, dtype, shape)
            shapes_only.append(node.name)
        else:
            env[node] = lw.input(node.name, dtype, shape, _numpy(value))
    else:
        raise ProgramError(f"{where} is a {kind.lower()} input; apportion lowers tensors only "
                           "(parameters, buffers, constants, user inputs)")


@dataclass(frozen=True)
class RowBlocks:
    """A weight read only by embeddings, held as program inputs of consecutive rows: block
    ``k`` holds rows ``offsets[k]`` onwards."""

    blocks: tuple[Value, ...]
    offsets: tuple[int, ...]


def _block_rows(node: Any, shape: tuple[int, ...], dtype: str) -> int | None:
    """Rows per block of a weight over ``torch_lower.BLOCK_BYTES`` (the most a gather, which
    runs whole on one core, may address) that only embeddings read (as their table); None to
    keep it whole. Llama-3-8B's table is 1 GiB in bfloat16: 8 blocks."""
    limit = torch_lower.BLOCK_BYTES
    if len(shape) != 2 or math.prod(shape) * DTYPE_BYTES[dtype] <= limit:
        return None
    if not all(u.op == "call_function" and str(u.target) == "aten.embedding.default"
               and u.args[0] is node and node not in u.args[1:] for u in node.users):
        return None
    per_row = shape[1] * DTYPE_BYTES[dtype]
    count = -(-shape[0] // max(1, limit // per_row))
    return -(-shape[0] // count)  # blocks of even size: identical ops plan once


def _row_blocks(lw: Lowering, name: str, dtype: str, shape: tuple[int, ...], rows: int,
                array: np.ndarray | None) -> RowBlocks:
    """The program inputs holding ``rows`` rows each of a ``shape`` weight (its value sliced
    from ``array``, none for a meta-device weight)."""
    blocks, offsets = [], []
    for k, lo in enumerate(range(0, shape[0], rows)):
        n = min(rows, shape[0] - lo)
        value = None if array is None else array[lo:lo + n]
        blocks.append(lw.input(f"{name}.rows{k}", dtype, (n, shape[1]), value))
        offsets.append(lo)
    return RowBlocks(tuple(blocks), tuple(offsets))


def _embedding_blocks(lw: Lowering, table: RowBlocks, ids: Value) -> Value:
    """An embedding from a table held as row blocks: each block gathers at the ids inside it
    (the others read its row 0) and a ``where`` keeps, per id, the block holding it: exactly
    the rows one gather of the whole table would pick."""
    out: Value | None = None
    for k, (block, lo) in enumerate(zip(table.blocks, table.offsets, strict=True)):
        part = f"rows{k}"
        hi = lw.scalar(lo + block.shape[0], ids.dtype)
        inside = lw.elementwise("lt", [ids, hi], part=f"{part}.below")
        local = ids
        if lo:
            above = lw.elementwise("ge", [ids, lw.scalar(lo, ids.dtype)], part=f"{part}.above")
            inside = lw.elementwise("logical_and", [above, inside], part=f"{part}.inside")
            local = lw.elementwise("sub", [ids, lw.scalar(lo, ids.dtype)], part=f"{part}.local")
        safe = lw.elementwise("where", [inside, local, lw.scalar(0, ids.dtype)],
                              part=f"{part}.ids")
        rows = lw.whole("gather", [block, safe], ids.shape + block.shape[1:], part=part)
        out = rows if out is None else lw.elementwise(
            "where", [unsqueeze(inside, ids.rank), rows, out], part=f"{part}.pick")
    assert out is not None, "a table has at least one block"
    return out


class _CannotLower(Exception):  # noqa: N818 -- internal: a node to list, not an error
    """A node apportion cannot lower (no lowering, or its lowering refuses the arguments):
    collected into the unsupported-node table rather than raised one at a time."""

    def __init__(self, reason: str, short: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.short = short


#: the value of an unsupported node's result that no program input can stand in for (not a
#: tensor, or a tensor of a shape or dtype apportion has no type for)
_MISSING = object()


def _lower_node(lw: Lowering, node: Any, origin: Origin, env: dict[Any, Any]) -> Any:
    import torch

    target = str(node.target)
    if node.target is operator.getitem:
        parent = env[node.args[0]]
        return _MISSING if parent is _MISSING else parent[node.args[1]]
    missing = [n.name for n in node.all_input_nodes if env.get(n) is _MISSING]
    if missing:
        raise _CannotLower(f"it reads {missing[0]!r}, the result of an unsupported node that "
                           "no program input can stand in for",
                           f"reads unsupported {missing[0]!r}")
    if isinstance(env.get(node.args[0]), RowBlocks):  # the one reader _block_rows allows
        ids = env[node.args[1]]
        if not isinstance(ids, Value):
            raise _CannotLower("its ids are not a tensor", "ids not a tensor")
        return _embedding_blocks(lw, env[node.args[0]], ids)
    fn = LOWERINGS.get(target)
    if fn is None:
        raise _CannotLower(f"apportion has no lowering for {target}", "no lowering")
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    try:
        value = fn(Ctx(lw, node), *args, **kwargs)
    except ApportionError as e:
        raise _CannotLower(str(e), str(e)) from None
    except (TypeError, ValueError, KeyError, IndexError, AssertionError) as e:
        why = f"cannot lower these arguments ({type(e).__name__}: {e})"
        raise _CannotLower(why, why) from e
    try:  # a mismatch is a bug of apportion's lowering, not the model's: raised at once
        _check(node, value)
    except ProgramError as e:
        raise ProgramError(f"{origin}: {e}") from None
    return value


def _stand_in(lw: Lowering, node: Any, env: dict[Any, Any]) -> tuple[Any, list[str], list[str]]:
    """What the nodes after an unsupported ``node`` read in place of its result: a program
    input per tensor result, of torch's shape and dtype (``_MISSING`` where there is no such
    input). Also the program's tensors its tensor operands are in (copied to a tensor of their
    own where a view reads them), which the lowered part outputs: the unsupported node would
    read them from there."""
    operands: list[Value] = []
    for n in node.all_input_nodes:
        v = env.get(n)
        for x in (v if isinstance(v, tuple | list) else (v,)):
            if isinstance(x, Value) and x not in operands:
                operands.append(x)
    reads = [lw.contiguous(v).tensor for v in operands if v.tensor not in lw.inputs]
    made: list[str] = []

    def one(meta: Any, name: str) -> Any:
        if not hasattr(meta, "shape"):
            return _MISSING
        try:
            shape, dtype = static_shape(meta.shape), torch_dtype(meta.dtype)
        except ProgramError:  # a symbolic size or a dtype apportion has no type for
            return _MISSING
        if any(n == 0 for n in shape):
            return _MISSING
        made.append(name)
        return lw.input(name, dtype, shape)

    val = node.meta.get("val")
    if isinstance(val, list | tuple):
        value: Any = tuple(one(m, f"{node.name}.{i}") for i, m in enumerate(val))
    else:
        value = one(val, node.name)
    return value, made, reads


def _check(node: Any, value: Any) -> None:
    """The lowered value has the shape and dtype torch says the node has."""
    meta = node.meta.get("val")
    pairs = list(zip(meta, value, strict=False)) if isinstance(meta, list | tuple) else \
        [(meta, value)]
    for m, v in pairs:
        if not hasattr(m, "shape"):
            continue
        want = (static_shape(m.shape), torch_dtype(m.dtype))
        got = (v.shape, v.dtype) if isinstance(v, Value) else None
        if got != want:
            raise ProgramError(f"lowered to {got}, but torch's result is {want} (shape, "
                               "dtype)")


def _outputs(lw: Lowering, sig: Any, node: Any, env: dict[Any, Any], outputs: list[str],
             shapes: list[tuple[int, ...]]) -> None:
    args = node.args[0] if isinstance(node.args[0], list | tuple) else (node.args[0],)
    for spec, arg in zip(sig.output_specs, args, strict=True):
        kind = spec.kind.name
        if kind != "USER_OUTPUT":
            raise ProgramError(f"the model updates {spec.target or spec.arg} in place (output "
                               f"kind {kind.lower()}); in-place updates are not supported")
        v = env.get(arg) if hasattr(arg, "op") else arg
        if not isinstance(v, Value):
            raise ProgramError(f"model output {getattr(arg, 'name', arg)!r} is {v!r}, not a "
                               "tensor; apportion programs output tensors")
        c = lw.contiguous(v)
        if c.tensor in outputs or c.tensor in lw.inputs:  # an output of its own
            axes = list(range(v.rank))
            c = lw.op("copy", v.shape, axes, [(v, axes)], part="copy")
        outputs.append(c.tensor)
        shapes.append(v.shape)


def _origin(node: Any, torch_dir: str) -> Origin:
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
    user = [f for f in frames if not f[0].startswith(torch_dir)] or frames
    source = f"{_short_path(user[-1][0])}:{user[-1][1]}" if user else None
    stack = node.meta.get("nn_module_stack") or {}
    module = next(reversed(stack.values()))[0] if stack else None
    return Origin(node.name, str(node.target), source, module or None)


def _short_path(path: str) -> str:
    """A source file as a reader finds it: an installed package's path from its package
    (``transformers/models/llama/modeling_llama.py``), a file under the current directory
    relative to it, any other path as it is."""
    marker = "site-packages" + os.sep
    if marker in path:
        return path.rsplit(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if rel.startswith("..") else rel


def _torch_shaped(a: np.ndarray, shape: tuple[int, ...], dynamic: tuple[int, ...]
                  ) -> np.ndarray:
    """A result in its torch shape; a run-time size axis takes what the run's elements leave
    (one such axis; with several, each must be stored as its own axis)."""
    if not dynamic:
        return a.reshape(shape)
    if len(dynamic) == 1:
        return a.reshape(tuple(-1 if i == dynamic[0] else n for i, n in enumerate(shape)))
    if a.ndim == len(shape):
        return a
    raise ProgramError(f"an output with run-time sizes on axes {list(dynamic)} is stored as "
                       f"{a.ndim} axes, not torch's {len(shape)}: cannot reshape it")


def _tensor_leaves(tree: Any) -> list[Any]:
    try:
        import torch
        from torch.utils._pytree import tree_leaves
    except ImportError:  # numpy inputs without torch: a flat tuple of arrays
        args, kwargs = tree
        return [x for x in (*args, *kwargs.values()) if isinstance(x, np.ndarray)]
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor | np.ndarray)]


def _numpy(x: Any) -> np.ndarray:
    """A numpy copy of a tensor (bfloat16 as float32, which holds it exactly)."""
    if isinstance(x, np.ndarray):
        return x
    t = x.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        t = t.float()
    return t.numpy().copy()


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
    if len(_tensor_leaves((tuple(args), kwargs))) != len(args) + len(kwargs):
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
