"""The walk of an exported graph: ``lower_exported`` lowers every node of an
``ExportedProgram`` whose graph holds core ATen ops, in graph order, into a ``TorchProgram``.

Parameters, buffers and lifted constants become program inputs whose values are
``TorchProgram.constants`` (an embedding table over ``torch_lower.BLOCK_BYTES`` is held in row
blocks, ``RowBlocks``); each ``call_function`` node is lowered by its entry in the ATen table
(``torch_aten.LOWERINGS``), its value checked against the shape and dtype torch recorded; no-op
asserts (``torch_table.DROPPED``) are dropped. A node apportion cannot lower is collected, with
program inputs standing in for its results so that the nodes after it lower too, and all of
them are refused at once (``UnsupportedNodes``) unless the lowering is ``partial``. Each op's
origin names the node, its target, its last source line outside torch and its module path.

This module imports torch only inside the functions that need it.

>>> _short_path("/usr/lib/python3/site-packages/transformers/models/llama/modeling_llama.py")
'transformers/models/llama/modeling_llama.py'
"""

from __future__ import annotations

import math
import operator
import os
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from apportion.errors import ApportionError, ProgramError
from apportion.frontend import torch_lower
from apportion.frontend.torch_aten import LOWERINGS
from apportion.frontend.torch_lower import Lowering, Origin, Value, is_fallback, unsqueeze
from apportion.frontend.torch_program import (
    NodeLowering,
    TorchProgram,
    Unsupported,
    UnsupportedNodes,
    to_numpy,
)
from apportion.frontend.torch_table import DROPPED, Ctx, static_shape, torch_dtype
from apportion.ir.dtypes import DTYPE_BYTES
from apportion.ir.program import Program

__all__ = ["RowBlocks", "lower_exported"]


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
            array = None if meta else to_numpy(value)
            env[node] = _row_blocks(lw, node.name, dtype, shape, rows, array)
            if meta:
                shapes_only.extend(v.tensor for v in env[node].blocks)
        elif meta:
            env[node] = lw.input(node.name, dtype, shape)
            shapes_only.append(node.name)
        else:
            env[node] = lw.input(node.name, dtype, shape, to_numpy(value))
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
