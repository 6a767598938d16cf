"""Pass `relayout`: explicit re-layout ops where an op needs another device layout.

On a target with a stick layout (Spyre), a tensor's innermost axis is its stick dim: its elements
lie in 128-byte sticks along that axis. A pointwise op works stick by stick, so each input's
innermost axis must be indexed by the dim that indexes its output's innermost axis (the op's
stick dim). An input read transposed, its innermost axis indexed by another dim while the op's
stick dim indexes another of its axes (``z[m, n] = x[m, n] + y[n, m]``), needs another device
layout: this pass inserts a ``relayout`` op writing a copy of the input with that axis innermost
(``y.relayout0[m, n] = relayout(y[n, m])``), and the op reads the copy through the permuted index
(``y.relayout0[m, n]``). One copy per tensor and new innermost axis serves every op that needs
it; it is inserted just before the first of them.

The copy's cost is the relayout op's own: planned, divided over cores and priced like any layout
op (every element read and written; cutting the source's innermost dim is the cost model's
strided gather), and reported with the other ops. Inputs with a literal or a sum in their
indices, ops and tensors in loop groups (a group keeps reading its tensors as they are) and
targets with a row-major layout get none. The rewritten program is the planned one
(``Plan.rewritten``), as for split-K's partial and combine ops; ``relayout`` on the given program
rewrites it the same way when a plan is read back or bound to run-time sizes (the same copies
at any size: which axis is innermost does not depend on sizes; a copy of a tensor with a
symbolic axis is symbolic on that axis too).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from apportion.ir.affine import AffineExpr
from apportion.ir.kinds import Category
from apportion.ir.op import Access, Op
from apportion.ir.program import Program, TensorType
from apportion.target.target import Target


@dataclass(frozen=True)
class Relayout:
    """One inserted copy: the source tensor, the axis moved innermost, the copy, its readers."""

    tensor: str
    axis: int
    copy: str
    readers: tuple[str, ...]


def needed_axis(op: Op, acc: Access) -> int | None:
    """The axis of input ``acc`` that must be innermost for pointwise ``op`` (None: none).

    >>> op = Op.build("z", "add", Access.parse("z[m,n]"),
    ...               (Access.parse("x[m,n]"), Access.parse("y[n,m]")), {"m": 4, "n": 64})
    >>> needed_axis(op, op.ins[0]), needed_axis(op, op.ins[1])
    (None, 0)
    """
    if op.category is not Category.POINTWISE or not op.out.index or not acc.index:
        return None
    stick = op.out.index[-1].single_dim
    singles = [e.single_dim for e in acc.index]
    if stick is None or None in singles or singles[-1] == stick:
        return None
    return singles.index(stick) if stick in singles else None


def relayout(program: Program, target: Target) -> tuple[Program, tuple[Relayout, ...]]:
    """``program`` with a relayout op before each op reading a tensor transposed, and the copies
    made (see the module docstring).

    >>> from apportion.frontend.json_format import loads
    >>> from apportion.target import spyre
    >>> p = loads('{"name": "t", "tensors": {"x": {"shape": [4, 64], "dtype": "float16"}, '
    ...   '"y": {"shape": [64, 4], "dtype": "float16"}}, "inputs": ["x", "y"], "outputs": ["z"], '
    ...   '"ops": [{"name": "a", "op": "add", "out": "z[m,n]", "ins": ["x[m,n]", "y[n,m]"]}]}')
    >>> q, made = relayout(p, spyre())
    >>> for o in q.ops: print(o)
    y.relayout0: y.relayout0[r1, r0] = relayout(y[r0, r1])
    a: z[m, n] = add(x[m, n], y.relayout0[m, n])
    """
    if target.layout == "row_major":
        return program, ()
    grouped = {n for g in program.tiling for n in g.ops}
    made_in_group = {program.op(n).out.tensor for n in grouped}
    copies: dict[tuple[str, int], str] = {}
    readers: dict[str, list[str]] = {}
    tensors = list(program.tensors)
    names = {t.name for t in tensors} | {o.name for o in program.ops}
    ops: list[Op] = []
    for op in program.ops:
        if op.name in grouped:
            ops.append(op)
            continue
        ins = list(op.ins)
        for i, acc in enumerate(op.ins):
            axis = needed_axis(op, acc)
            if axis is None or acc.tensor in made_in_group:
                continue
            key = (acc.tensor, axis)
            if key not in copies:
                src = program.tensor(acc.tensor)
                copy = _fresh(f"{acc.tensor}.relayout{axis}", names)
                copies[key] = copy
                order = [*(a for a in range(src.rank) if a != axis), axis]
                letters = [f"r{a}" for a in range(src.rank)]
                sizes = dict(zip(letters, src.shape, strict=True))
                ops.append(Op.build(copy, "relayout",
                                    Access(copy, tuple(AffineExpr.dim(letters[a])
                                                       for a in order)),
                                    (Access(src.name, tuple(AffineExpr.dim(x)
                                                            for x in letters)),), sizes))
                # a run-time size moves with its axis, so the copy binds as its source does
                moved = {a: src.symbols[b] for a, b in enumerate(order) if b in src.symbols}
                tensors.append(TensorType(copy, tuple(src.shape[a] for a in order),
                                          src.dtype, dynamic=tuple(moved.items())))
            copy = copies[key]
            readers.setdefault(copy, []).append(op.name)
            order = [*(a for a in range(len(acc.index)) if a != axis), axis]
            ins[i] = Access(copy, tuple(acc.index[a] for a in order))
        ops.append(replace(op, ins=tuple(ins)) if ins != list(op.ins) else op)
    if not copies:
        return program, ()
    made = tuple(Relayout(t, axis, copy, tuple(readers[copy]))
                 for (t, axis), copy in copies.items())
    return replace(program, tensors=tuple(tensors), ops=tuple(ops)), made


def _fresh(name: str, taken: set[str]) -> str:
    out, i = name, 1
    while out in taken:
        i += 1
        out = f"{name}_{i}"
    taken.add(out)
    return out
