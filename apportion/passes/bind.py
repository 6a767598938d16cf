"""Binding run-time sizes: a plan made at a program's planning sizes, made concrete for a run.

A program with symbolic sizes (``"shape": [4096, "K"]``) is planned once, at each symbol's
planning size (its bound when it has one). A run binds each symbol to a size: the program gets
those sizes, every split-K select chain picks its slices for the bound reduction size (the
partial and combine ops are cut again with them), and every op keeps its planned number of
slices per dim, cut from the bound size as work division cuts any dim (whole units, larger
slices first; a dim left with fewer units than slices gets one slice per unit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from apportion.errors import ExecutionError
from apportion.ir.program import Program
from apportion.passes.split_k import rewrite_as_planned
from apportion.plans.plan import OpPlan, Plan
from apportion.target.target import Target


def infer_sizes(program: Program, inputs: Mapping[str, np.ndarray],
                given: Mapping[str, int] | None = None) -> dict[str, int]:
    """The symbol sizes the input arrays have (with ``given`` ones); an ExecutionError names a
    symbol two inputs (or an input and ``given``) disagree on.

    >>> from apportion.frontend.json_format import loads
    >>> p = loads('{"name": "t", "tensors": {"x": {"shape": [4, "K"], "dtype": "float32"}},'
    ...   '"inputs": ["x"], "outputs": ["y"], "ops": [{"name": "s", "op": "sum", '
    ...   '"out": "y[m]", "ins": ["x[m,k]"]}]}')
    >>> infer_sizes(p, {"x": np.zeros((4, 9))})
    {'K': 9}
    """
    sizes = dict(given or {})
    seen: dict[str, str] = {name: "the sizes given" for name in sizes}
    for name in program.inputs:
        arr = inputs.get(name)
        shape = getattr(arr, "shape", None)
        t = program.tensor(name)
        if shape is None or len(shape) != t.rank:
            continue  # binding the inputs reports a missing or misshapen array
        for i, sym in t.symbols.items():
            n = int(shape[i])
            if sym in sizes and sizes[sym] != n:
                raise ExecutionError(f"symbol {sym!r}: input {name!r} dim {i} has size {n}, "
                                     f"but {seen[sym]} make it {sizes[sym]}")
            sizes.setdefault(sym, n)
            seen.setdefault(sym, f"input {name!r}")
    return sizes


def bind_plan(source: Program, plan: Plan, target: Target, sizes: Mapping[str, int]
              ) -> tuple[Program, Plan]:
    """``source`` (the program as given, with symbols) and its ``plan`` at run-time ``sizes``:
    the concrete program as the plan divides it (split-K ops cut with their chains' choices)
    and the plan of each of its ops at those sizes."""
    concrete = source.bind(sizes)
    split = {}
    for o in plan.ops:
        if o.split_k is None or not o.name.endswith(".partial"):
            continue
        base = concrete.op(o.name.removesuffix(".partial"))
        dim = base.reduction_dims[0] if len(base.reduction_dims) == 1 else None
        size = base.sizes[dim] if dim is not None else 0
        split[o.name] = replace(o.split_k, factor=o.split_k.factor_at(size))
    rewritten = rewrite_as_planned(concrete, target, split)
    names = [o.name for o in rewritten.ops]
    if names != [o.name for o in plan.ops]:
        missing = sorted({o.name for o in plan.ops} - set(names))
        cut = [n for n in missing if n.endswith((".partial", ".combine"))]
        if not cut:
            # not a reduction the bound size cannot cut: the plan is not this program's
            extra = sorted(set(names) - {o.name for o in plan.ops})
            raise ExecutionError(
                f"program {source.name!r} at sizes {dict(sizes)} has ops "
                f"{', '.join(extra) or 'none'} the plan lacks, and the plan has ops "
                f"{', '.join(missing) or 'none'} the program lacks: the plan was made for "
                "another program")
        base = cut[0].removesuffix(".partial").removesuffix(".combine")
        s = split.get(f"{base}.partial")
        why = "" if s is None else f" into {s.factor} slices ({s.by})"
        raise ExecutionError(
            f"op {base!r}: at sizes {dict(sizes)} its reduction cannot be cut{why} into whole "
            f"planning units as planned; give a size that is a multiple of the slices")
    ops = tuple(_bound_op(o, rewritten.op(o.name).sizes, split.get(o.name)) for o in plan.ops)
    return rewritten, replace(plan, ops=ops, symbols=(), rewritten=None)


def _bound_op(o: OpPlan, sizes: Mapping[str, int], split: object) -> OpPlan:
    # in a loop, a tiled dim's tile is cut from the bound size at run time (lowering); a dim
    # no level tiles is whole in every tile, so it takes the bound size as an untiled op's does
    tiled = {d for dims in o.loop.tiled_dims for d in dims} if o.loop is not None else set()
    space = tuple((d, n if d in tiled else sizes[d]) for d, n in o.iteration_space)
    if space == o.iteration_space:
        return o if split is None else replace(o, split_k=split)
    per = dict(o.unit_elems)
    splits = tuple((d, n if d in tiled else min(n, -(-sizes[d] // per[d])))
                   for d, n in o.splits)
    return replace(o, iteration_space=space, splits=splits,
                   split_k=o.split_k if split is None else split)
