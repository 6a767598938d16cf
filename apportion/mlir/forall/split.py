"""Split reductions in the parallel IR (``mlir.forall``): a reduction dim split over
cores makes the forall write one partial per slice into a ``[slices, ...output dims]``
tensor that a ``linalg.reduce`` then combines with the reducer's combine."""

from __future__ import annotations

import math

from apportion.ir.op import Op
from apportion.mlir.bodies import combine_of
from apportion.mlir.builder import INDENT, Block, symbol_name
from apportion.mlir.forall.compute import Compute, apply
from apportion.mlir.forall.context import Context, Work
from apportion.mlir.forall.tensors import (
    Env,
    IxBox,
    TensorVal,
    empty,
    extract_out,
    filled,
    forall,
    insert,
    out_dims,
    out_results,
    out_shape,
    read,
    region,
    thread_ids,
    thread_slice,
)
from apportion.mlir.index import Ix


class SplitReductions:
    """Ops whose launch splits a reduction dim over cores."""

    def __init__(self, ctx: Context, compute: Compute) -> None:
        self.ctx, self.compute = ctx, compute

    def split_reduction(self, blk: Block, op: Op, work: Work, tile: IxBox, dest: TensorVal,
                        env: Env, accumulate: bool, split_dims: list[str], red_split: list[str]
                        ) -> TensorVal:
        """One partial per slice of the split reduction dims, written by a forall into a
        ``[slices, ...output dims]`` tensor, then combined by ``linalg.reduce`` into fresh
        identities, or (``accumulate``) into the accumulator's tile."""
        ty = self.compute.compute_type(op)
        results = self.partials(blk, op, work, tile, env, ty, split_dims, red_split)
        place = region(op.out, tile)
        combined = self.combined(blk, op, results, out_shape(op, tile), ty)
        if accumulate:
            whole = self.compute.combine_into(blk, op, extract_out(
                blk, dest, place, op.out.tensor), combined[0], ty)
            return insert(blk, whole, dest, place, parallel=False)
        piece = self.compute.finish(blk, op, combined, lambda: extract_out(
            blk, dest, place, op.out.tensor))
        return insert(blk, piece, dest, place, parallel=False)

    def partials(self, blk: Block, op: Op, work: Work, tile: IxBox, env: Env, ty: str,
                 split_dims: list[str], red_split: list[str]) -> list[TensorVal]:
        """The forall that writes one partial per slice of ``red_split`` into
        ``[slices, ...output dims]`` tensors (two for argmax), at the tile's run-time size."""
        splits, per = work.splits, work.per
        count = math.prod(splits[d] for d in red_split)
        tile_shape = out_shape(op, tile)
        stem = symbol_name(op.out.tensor)
        # a forall's shared tensor has a static shape (IREE cannot resolve the sizes of a
        # dynamic one carried through the loop it becomes): the whole dim bounds a run-time tile
        # (a run-time size of the whole op is no tile: its partials take that size)
        whole = self.ctx.sizes.of(op)
        bound = [s if s.is_const or s == whole[d] else Ix(op.sizes[d])
                 for s, d in zip(tile_shape, out_dims(op), strict=True)]
        parts = [empty(blk, f"{stem}_parts", [Ix(count), *bound], elt)
                 for elt, _ in self.compute.accumulators(op, ty)]
        inner = blk.child()
        ivs, grid = thread_ids(blk, inner, op, split_dims, splits,
                               not all(s.is_const for p in parts for s in p.shape))
        shared = [p.renamed(blk.fresh(f"{stem}_part")) for p in parts]
        new = blk.fresh(f"{stem}_parts")
        box = {d: thread_slice(inner, tile[d], per[d], splits[d], ivs.get(d))
               for d in op.dim_names}
        dims = list(op.dim_names)
        split = self.ctx.slice_dims(op)
        ins = [read(inner, env[a.tensor], a, box, dims, split) for a in op.ins]
        pieces = self.compute.reduce_into(inner, op, box, ins, out_results(op, dims), ty, None)
        slot = Ix(0)
        for d in red_split:
            slot = slot * splits[d] + Ix.atom(ivs[d])
        inserts = inner.child()
        place = [(slot, Ix(1), True)] + [
            (box[d][0] - tile[d][0], box[d][1], False) for d in out_dims(op)]
        for piece, sh in zip(pieces, shared, strict=True):
            insert(inserts, piece, sh, place, parallel=True)
        head = f"{new}:{len(parts)}" if len(parts) > 1 else new
        forall(blk, head, grid, [(s.ssa, p) for s, p in zip(shared, parts, strict=True)], inner,
               inserts, self.ctx.mapping(grid))
        results = [p.renamed(f"{new}#{i}" if len(parts) > 1 else new)
                   for i, p in enumerate(parts)]
        if bound != tile_shape:  # the run-time tile of the bounding partials
            at = [(Ix(0), Ix(count), False)] + [(Ix(0), s, False) for s in tile_shape]
            results = [extract_out(blk, r, at, f"{stem}_parts") for r in results]
        return results

    def combined(self, blk: Block, op: Op, results: list[TensorVal], shape: list[Ix], ty: str
                 ) -> list[TensorVal]:
        """The partials ``results`` combined in slice order by a ``linalg.reduce`` into fresh
        identities of ``shape``."""
        reducer = op.kind.reducer
        assert reducer is not None
        combine = combine_of(reducer, op.name, op.kind)
        stem = symbol_name(op.out.tensor)
        inits = [filled(blk, f"{stem}_comb", shape, elt, ident)
                 for elt, ident in self.compute.accumulators(op, ty)]
        red = blk.fresh(f"{stem}_red")
        head = f"{red}:{len(inits)}" if len(inits) > 1 else red
        in_types = ", ".join(r.type for r in results)
        init_types = ", ".join(i.type for i in inits)
        inner = blk.child().child()
        a_args = [inner.fresh("in") for _ in results]
        b_args = [inner.fresh("acc") for _ in inits]
        names = {"a": b_args[0], "b": a_args[0]}
        res_names: tuple[str, ...] = ("r",)
        if reducer.pairs:
            names.update(ai=b_args[1], bi=a_args[1])
            res_names = ("r", "ri")
        yields = apply(inner, combine, ty == "i64", ty, names, res_names)
        args = ", ".join(f"{a}: {r.elt}" for a, r in zip(a_args, results, strict=True))
        args += ", " + ", ".join(f"{b}: {i.elt}" for b, i in zip(b_args, inits, strict=True))
        blk.emit(f"{head} = linalg.reduce ins({', '.join(r.ssa for r in results)} : {in_types}) "
                 f"outs({', '.join(i.ssa for i in inits)} : {init_types}) dimensions = [0]")
        blk.emit(f"{INDENT}({args}) {{")
        blk.extend(inner)
        blk.emit(f"{INDENT}{INDENT}linalg.yield {', '.join(yields)} : "
                 f"{', '.join(i.elt for i in inits)}")
        blk.emit(f"{INDENT}}}")
        return [i.renamed(red if len(inits) == 1 else f"{red}#{k}") for k, i in enumerate(inits)]
