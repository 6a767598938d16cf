"""One op of the parallel IR (``mlir.forall``) over a tile: a fallback (``forall.fallback``), a
split reduction (``forall.split``), an op writing through a merge of dims as the op writing
its split view (``forall.merge``), or one ``scf.forall`` over the dims its launch splits, each
thread computing its box (``forall.compute``); a launch of one worker has no forall."""

from __future__ import annotations

import dataclasses

from apportion.errors import EmitError
from apportion.ir.kinds import Category
from apportion.ir.op import Op
from apportion.limits import cite
from apportion.mlir.bodies import body_of, combine_of
from apportion.mlir.builder import Block, symbol_name
from apportion.mlir.forall.compute import Compute
from apportion.mlir.forall.context import Context, Work
from apportion.mlir.forall.fallback import Fallbacks
from apportion.mlir.forall.merge import merge_view, merges, split_view, written
from apportion.mlir.forall.split import SplitReductions
from apportion.mlir.forall.tensors import (
    Env,
    IxBox,
    TensorVal,
    empty,
    forall,
    insert,
    region,
    thread_ids,
    thread_slice,
)
from apportion.mlir.index import Ix
from apportion.mlir.types import mlir_type


class OpRenderer:
    """Ops over tiles, each written into its destination; the parts it calls compute a
    thread's box, the fallbacks and the split reductions."""

    def __init__(self, ctx: Context, compute: Compute, fallbacks: Fallbacks,
                 splits: SplitReductions) -> None:
        self.ctx, self.compute, self.fallbacks, self.splits = ctx, compute, fallbacks, splits

    def whole_op(self, blk: Block, op: Op, env: Env) -> None:
        """``op`` outside loops: over its whole iteration space, into a fresh tensor."""
        work = self.ctx.work(op)
        t = self.ctx.program.tensor(op.out.tensor)
        dest = empty(blk, op.out.tensor, self.ctx.sizes.shape(op.out.tensor), mlir_type(t.dtype))
        tile = {d: (Ix(0), n) for d, n in self.ctx.sizes.of(op).items()}
        viewed, local = self.viewed(blk, op, env)
        env[op.out.tensor] = self.render(blk, viewed, work, tile, dest, local, False)

    def viewed(self, blk: Block, op: Op, env: Env) -> tuple[Op, Env]:
        """``op`` and the tensors it reads, with the inputs of a partial op whose slice length
        is known only at run time read through a ``tensor.expand_shape`` of the reduction axis
        into ``[slices, step]`` (``forall.sizes``)."""
        views = self.ctx.sizes.views(op)
        if not views:
            return op, env
        local = dict(env)
        ins = list(op.ins)
        axes: dict[str, int] = {}
        for v in views:
            a = op.ins[v.index]
            ins[v.index] = v.access
            if axes.setdefault(a.tensor, v.axis) != v.axis:
                raise EmitError(f"op {op.name!r} reads tensor {a.tensor!r} along its run-time "
                                "split through two different axes "
                                f"{cite('iree-runtime-split-read')}")
            src = env[a.tensor]
            if local[a.tensor] is not src:
                continue  # expanded for an earlier access
            j = v.axis
            if src.shape[j] != v.size or any(not o.is_const or o.value for o in src.origin):
                raise EmitError(f"op {op.name!r}: tensor {a.tensor!r} axis {j} is not the "
                                "whole reduction dim it splits at run time "
                                f"{cite('iree-runtime-split-read')}")
            shape = (*src.shape[:j], v.slices, v.step, *src.shape[j + 1:])
            groups = [[i] for i in range(j)] + [[j, j + 1]] + [
                [i + 1] for i in range(j + 1, len(src.shape))]
            view = TensorVal(blk.fresh(f"{a.tensor}_view"), shape, src.elt)
            blk.emit(f"{view.ssa} = tensor.expand_shape {src.ssa} {groups} output_shape "
                     f"[{blk.operands(shape)}] : {src.type} into {view.type}")
            local[a.tensor] = view
        return dataclasses.replace(op, ins=tuple(ins)), local

    def render(self, blk: Block, op: Op, work: Work, tile: IxBox, dest: TensorVal, env: Env,
               accumulate: bool) -> TensorVal:
        """``op`` over ``tile`` writing into ``dest`` (combined into it, the accumulator, when
        ``accumulate``); returns the new value of ``dest``."""
        if merges(op):  # the op writing the split view of dest (forall.merge)
            view = split_view(blk, op, dest)
            new = self.render(blk, written(op), work, tile, view, env, accumulate)
            return merge_view(blk, op, new, dest)
        if op.kind.category is Category.FALLBACK:
            return self.fallbacks.fallback(blk, op, dest, env, tile)
        check_body(op)
        splits, per = work.splits, work.per
        split_dims = [d for d in op.dim_names if splits[d] > 1]
        red_split = [d for d in op.reduction_dims if splits[d] > 1]
        if red_split:
            return self.splits.split_reduction(blk, op, work, tile, dest, env, accumulate,
                                               split_dims, red_split)
        if not split_dims:
            piece = self.compute.core(blk, op, tile, dest, env, accumulate)
            return insert(blk, piece, dest, region(op.out, tile), parallel=False)
        inner = blk.child()
        ivs, grid = thread_ids(blk, inner, op, split_dims, splits,
                               not all(s.is_const for s in dest.shape))
        shared = dest.renamed(blk.fresh(f"{symbol_name(op.out.tensor)}_shared"))
        new = blk.fresh(op.out.tensor)
        box = {d: thread_slice(inner, tile[d], per[d], splits[d], ivs.get(d))
               for d in op.dim_names}
        piece = self.compute.core(inner, op, box, shared, env, accumulate)
        inserts = inner.child()  # may compute offsets in the thread body
        insert(inserts, piece, shared, region(op.out, box), parallel=True)
        forall(blk, new, grid, [(shared.ssa, dest)], inner, inserts, self.ctx.mapping(grid))
        return dest.renamed(new)


def check_body(op: Op) -> None:
    """Refuse, naming the op, its kind and the backend, a kind the backend's table lacks."""
    kind = op.kind
    if kind.reducer is not None:
        combine_of(kind.reducer, op.name, kind)
    if kind.category is not Category.REDUCTION:
        body_of(kind, op.name)
