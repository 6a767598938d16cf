"""Binding run-time sizes: a plan made at a program's planning sizes, made concrete for a run.

A program with symbolic sizes (``"shape": [4096, "K"]``) is planned once, at each symbol's
planning size (its bound when it has one), into the planned program (the given one with its
relayout copies and split-K partial and combine ops, at those sizes) and its plan. A run binds
each symbol to a size by substitution in the planned program, no planning pass run again: an
op of the given program takes its bound sizes; a relayout copy the sizes of the axes it reads
(which axis is innermost does not depend on sizes, so the copies are the same at any size);
a split-K partial op the slices its select chain picks for the bound reduction size
(``SplitK.factor_at``) and their length, its reads of the cut dim ``step * s + k`` at that
step, and its combine op those slices. Every op keeps its planned number of slices per dim,
cut from the bound size as work division cuts any dim (whole units, larger slices first; a
dim left with fewer units than slices gets one slice per unit).

A static split of a run-time reduction size (no select chain) holds only where the bound size
is that many slices of whole planning units (the unit of the partial op's offset dim; a target
that pads a split stick needs whole slices only): binding any other size is refused, as the
planner would not cut it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from apportion.errors import ExecutionError
from apportion.ir.affine import AffineExpr
from apportion.ir.op import Access, Op
from apportion.ir.program import Program, TensorType
from apportion.plans.plan import OpPlan, Plan, SplitK

__all__ = ["bind_plan", "infer_sizes"]


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


def bind_plan(program: Program, plan: Plan, given: Program, sizes: Mapping[str, int],
              padded: bool = False) -> tuple[Program, Plan]:
    """``program`` (``given`` as planned, at its planning sizes) and its ``plan`` at run-time
    ``sizes`` of ``given``'s symbols (the others at their planning sizes): the concrete
    program as the plan divides it and the plan of each of its ops at those sizes. ``padded``:
    the target pads a split stick (``Target.split_padded_reduction``). Raises ProgramError for
    a size outside its symbol's bounds, ExecutionError for a static split-K the bound size
    cannot cut into whole planning units.

    >>> import apportion as ap
    >>> planned = ap.plan(ap.load("examples/dynamic_k.json"), ap.targets.gpu(cores=8))
    >>> bound, bound_plan = bind_plan(planned.program, planned.plan, planned.given, {"K": 4096})
    >>> bound.op("mm.partial").sizes, bound_plan.op("mm.partial").split_k.factor
    ({'k_slice': 128, 'm': 32, 'n': 32, 'k_in': 32}, 128)
    """
    concrete = given.bind(sizes)
    cuts = _cuts(program, plan, concrete, padded, sizes)
    ops: list[Op] = []
    for op in program.ops:
        if op.name in concrete.op_map:
            at = concrete.op(op.name).sizes
            ops.append(replace(op, dims=tuple((d, at[d]) for d, _ in op.dims)))
        elif op.name in cuts.ops:
            ops.append(cuts.bound(op))
        else:  # a relayout copy: each dim the size of the axis it reads alone
            ops.append(replace(op, dims=tuple(_read_alone(op, concrete).items())))
    made = {op.out.tensor: op for op in ops}
    tensors = tuple(concrete.tensor(t.name) if t.name in concrete.tensor_map
                    else _made(t, made[t.name]) for t in program.tensors)
    bound = replace(program, tensors=tensors, ops=tuple(ops))
    bound_ops = tuple(_bound_op(o, bound.op(o.name).sizes, cuts.split.get(o.name))
                      for o in plan.ops)
    return bound, replace(plan, ops=bound_ops, symbols=(), rewritten=None)


class _Cuts:
    """The split-K partial and combine ops of a planned program at bound sizes: each cut
    dim's slices (``factor``) and their length (``step``), by the partial op's slice and
    offset dims."""

    def __init__(self) -> None:
        self.ops: set[str] = set()
        #: partial op -> its split at the bound sizes
        self.split: dict[str, SplitK] = {}
        #: partial or combine op -> slice dim -> (offset dim, slices, step)
        self.dims: dict[str, dict[str, tuple[str, int, int]]] = {}
        #: partial or combine op -> the base op at bound sizes
        self.base: dict[str, Op] = {}

    def bound(self, op: Op) -> Op:
        base, cut = self.base[op.name].sizes, self.dims[op.name]
        at = dict(base)
        for s, (k, f, step) in cut.items():
            at.update({s: f, k: step})
        if op.name.endswith(".combine"):
            return replace(op, dims=tuple((d, at[d]) for d, _ in op.dims))
        # a read of the cut dim is ``step * s + k``: the slice dim's coefficient moves with step
        ins = tuple(Access(a.tensor, tuple(_restep(e, cut) for e in a.index)) for a in op.ins)
        return replace(op, ins=ins, dims=tuple((d, at[d]) for d, _ in op.dims))


def _restep(e: AffineExpr, cut: Mapping[str, tuple[str, int, int]]) -> AffineExpr:
    if not any(e.coeff(s) for s in cut):
        return e
    return AffineExpr(tuple((x, e.coeff(cut[x][0]) * cut[x][2] if x in cut else c)
                            for x, c in e.terms), e.const)


def _cuts(program: Program, plan: Plan, concrete: Program, padded: bool,
          sizes: Mapping[str, int]) -> _Cuts:
    out = _Cuts()
    for o in plan.ops:
        if o.split_k is None or not o.name.endswith(".partial"):
            continue
        stem = o.name.removesuffix(".partial")
        base = concrete.op(stem)
        dim = base.reduction_dims[0] if len(base.reduction_dims) == 1 else None
        split = replace(o.split_k, factor=o.split_k.factor_at(base.sizes[dim] if dim else 0))
        partial = program.op(o.name)
        per = dict(o.unit_elems)
        slice_dims = tuple(e.single_dim for e in partial.out.index[:len(split.dims)])
        cut: dict[str, tuple[str, int, int]] = {}
        for (d, f), s in zip(split.per_dim.items(), slice_dims, strict=True):
            assert s is not None
            k = _offset_dim(partial, s, base)
            size = base.sizes[d]
            if split.select is None and (f <= 1 or size % f or (
                    not padded and (size // f) % per[k])):
                why = f" into {split.factor} slices ({split.by})"
                raise ExecutionError(
                    f"op {stem!r}: at sizes {dict(sizes)} its reduction cannot be cut{why} "
                    "into whole planning units as planned; give a size that is a multiple of "
                    "the slices")
            cut[s] = (k, f, size // f)
        out.split[o.name] = split
        for name in (o.name, f"{stem}.combine"):
            out.ops.add(name)
            out.dims[name] = cut
            out.base[name] = base
    return out


def _offset_dim(partial: Op, s: str, base: Op) -> str:
    """The offset dim ``k`` the partial op reads beside its slice dim ``s`` (``step * s +
    k``): the other dim of that read its base op lacks."""
    for a in partial.ins:
        for e in a.index:
            made = [x for x in e.dims if x != s and x not in base.sizes]
            if e.coeff(s) and len(made) == 1:
                return made[0]
    raise ExecutionError(f"op {partial.name!r} reads no slice of its cut dim as {s!r} and an "
                         "offset in it")


def _read_alone(op: Op, concrete: Program) -> dict[str, int]:
    found: dict[str, int] = {}
    for acc in op.ins:
        if acc.tensor not in concrete.tensor_map:
            continue
        for e, n in zip(acc.index, concrete.tensor(acc.tensor).shape, strict=True):
            if e.single_dim is not None:
                found.setdefault(e.single_dim, n)
    missing = [d for d in op.dim_names if d not in found]
    if missing:
        raise ExecutionError(f"op {op.name!r} is neither an op of the given program, a split-K "
                             f"partial or combine op, nor reads its dim {missing[0]!r} alone "
                             "from a tensor of the given program")
    return {d: found[d] for d, _ in op.dims}


def _made(t: TensorType, producer: Op) -> TensorType:
    """A tensor the rewrite made (a relayout copy, a partials tensor) as its producer writes
    it at bound sizes: an axis indexed by one dim has that dim's size."""
    at = producer.sizes
    return replace(t, shape=tuple(at[e.single_dim] if e.single_dim else n
                                  for e, n in zip(producer.out.index, t.shape, strict=True)))


def _bound_op(o: OpPlan, sizes: Mapping[str, int], split: SplitK | None) -> OpPlan:
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
