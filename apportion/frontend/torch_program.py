"""What a PyTorch model lowers to: ``TorchProgram``, the program with the values of its weights
and where each op comes from, and the report of every ATen node (``NodeLowering``; those
apportion cannot lower: ``Unsupported``, ``UnsupportedNodes``, ``unsupported_table``).

``from_torch`` (``torch_export``) makes one; ``TorchProgram.inputs`` binds a model's inputs to
the program's and ``torch_outputs`` gives a run's results back in the model's shapes. This
module imports torch only inside the functions that need it.

>>> import numpy as np
>>> leaves = tensor_leaves(((np.zeros(2), 3), {"mask": np.ones(2)}))
>>> [a.tolist() for a in leaves]
[[0.0, 0.0], [1.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apportion.errors import ProgramError
from apportion.frontend.torch_lower import Origin
from apportion.ir.program import Program

__all__ = ["STATUSES", "NodeLowering", "TorchProgram", "Unsupported", "UnsupportedNodes",
           "tensor_leaves", "to_numpy", "unsupported_table"]

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
        leaves = tensor_leaves((tuple(example_inputs), dict(kwargs)))
        if len(leaves) != len(self.user_inputs):
            raise ProgramError(f"program {self.program.name!r} takes {len(self.user_inputs)} "
                               f"tensor inputs ({', '.join(self.user_inputs)}), got "
                               f"{len(leaves)}")
        meta = [n for n, x in zip(self.user_inputs, leaves, strict=True)
                if getattr(x, "is_meta", False)]
        if meta:
            raise ProgramError(f"input {meta[0]!r} is a tensor on torch's meta device (a shape, "
                               "no values): running the program needs its values")
        out = {name: to_numpy(x) for name, x in zip(self.user_inputs, leaves, strict=True)}
        out.update(self.constants)
        return out

    def torch_outputs(self, results: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The model's outputs from a run's tensors, in the model's order and torch shapes."""
        dynamic = self.output_dynamic or ((),) * len(self.outputs)
        return tuple(_torch_shaped(np.asarray(results[n]), s, d)
                     for n, s, d in zip(self.outputs, self.output_shapes, dynamic, strict=True))


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


def tensor_leaves(tree: Any) -> list[Any]:
    """The tensors (and numpy arrays) of model inputs given as ``(args, kwargs)``, in the order
    ``torch.export`` flattens them."""
    try:
        import torch
        from torch.utils._pytree import tree_leaves
    except ImportError:  # numpy inputs without torch: a flat tuple of arrays
        args, kwargs = tree
        return [x for x in (*args, *kwargs.values()) if isinstance(x, np.ndarray)]
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor | np.ndarray)]


def to_numpy(x: Any) -> np.ndarray:
    """A numpy copy of a tensor (bfloat16 as float32, which holds it exactly)."""
    if isinstance(x, np.ndarray):
        return x
    t = x.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        t = t.float()
    return t.numpy().copy()
