"""Split reductions in the parallel IR (``mlir.forall``): a reduction dim split over
cores makes the forall write one partial per slice into a ``[slices, ...output dims]``
tensor that a ``linalg.reduce`` then combines with the reducer's combine."""

from __future__ import annotations

import math

from apportion.ir.op import Op
from apportion.mlir.bodies import combine_of
from apportion.mlir.builder import INDENT, _Block
from apportion.mlir.forall.compute import _apply, _Bodies
from apportion.mlir.forall.tensors import Box, TensorVal, Work, _Carried, _Env
from apportion.mlir.index import Ix
from apportion.mlir.text import symbol_name


class _SplitReductions(_Bodies):
    """Ops whose launch splits a reduction dim over cores."""

    def split_reduction(self, blk: _Block, op: Op, work: Work, tile: Box, dest: TensorVal,
                        env: _Env, carried: _Carried | None, split_dims: list[str],
                        red_split: list[str]) -> TensorVal:
        """One partial per slice of the split reduction dims, written by a forall into a
        ``[slices, ...output dims]`` tensor, then combined by ``linalg.reduce``."""
        splits = work.splits
        per = work.per
        ty = self.compute_type(op)
        integer = ty == "i64"
        reducer = op.kind.reducer
        assert reducer is not None
        combine = combine_of(reducer, op.name, op.kind)
        count = math.prod(splits[d] for d in red_split)
        tile_shape = self.out_shape(op, tile)
        stem = symbol_name(op.out.tensor)
        # a forall's shared tensor has a static shape (IREE cannot resolve the sizes of a
        # dynamic one carried through the loop it becomes): the whole dim bounds a run-time tile
        # (a run-time size of the whole op is no tile: its partials take that size)
        whole = self.sizes.of(op)
        bound = [s if s.is_const or s == whole[d] else Ix(op.sizes[d])
                 for s, d in zip(tile_shape, self.out_dims(op), strict=True)]
        parts = [self.empty(blk, f"{stem}_parts", [Ix(count), *bound], elt)
                 for elt, _ in self.accumulators(op, ty)]
        inner = blk.child()
        ivs, grid = self.thread_ids(blk, inner, op, split_dims, splits,
                                    not all(s.is_const for p in parts for s in p.shape))
        shared = [p.renamed(blk.fresh(f"{stem}_part")) for p in parts]
        new = blk.fresh(f"{stem}_parts")
        box = {d: self.thread_slice(inner, tile[d], per[d], splits[d], ivs.get(d))
               for d in op.dim_names}
        dims = list(op.dim_names)
        split = self.slice_dims(op)
        ins = [self.read(inner, env.vals[a.tensor], a, box, dims, split) for a in op.ins]
        out_results = [f"d{dims.index(d)}" for d in self.out_dims(op)]
        pieces = self.reduce_into(inner, op, box, ins, out_results, ty, None)
        slot = Ix(0)
        for d in red_split:
            slot = slot * splits[d] + Ix.atom(ivs[d])
        heads = [s.ssa for s in shared]
        types = ", ".join(p.type for p in parts)
        shared_text = ", ".join(f"{s} = {p.ssa}" for s, p in zip(heads, parts, strict=True))
        head = f"{new}:{len(parts)}" if len(parts) > 1 else new
        blk.emit(f"{head} = scf.forall {grid} shared_outs({shared_text}) -> ({types}) {{")
        ins_blk = inner.child()
        region = [(slot, Ix(1), True)] + [
            (box[d][0] - tile[d][0], box[d][1], False) for d in self.out_dims(op)]
        for piece, sh in zip(pieces, shared, strict=True):
            self.parallel_insert(ins_blk, piece, sh, region)
        blk.extend(inner)
        blk.emit(f"{INDENT}scf.forall.in_parallel {{")
        blk.extend(ins_blk)
        blk.emit(f"{INDENT}}}")
        blk.emit("}" + self.mapping(grid))
        results = [p.renamed(f"{new}#{i}" if len(parts) > 1 else new)
                   for i, p in enumerate(parts)]
        if bound != tile_shape:  # the run-time tile of the bounding partials
            whole = [(Ix(0), Ix(count), False)] + [(Ix(0), s, False) for s in tile_shape]
            results = [self.extract_out(blk, r, whole, f"{stem}_parts") for r in results]
        # combine in slice order into fresh identities or the accumulator's tile
        accumulate = carried is not None and carried.accumulates
        out_region = self.out_region(op, tile)
        inits = [self.filled(blk, f"{stem}_comb", tile_shape, elt, ident)
                 for elt, ident in self.accumulators(op, ty)]
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
        yields = _apply(inner, combine, integer, ty, names, res_names)
        args = ", ".join(f"{a}: {r.elt}" for a, r in zip(a_args, results, strict=True))
        args += ", " + ", ".join(f"{b}: {i.elt}" for b, i in zip(b_args, inits, strict=True))
        blk.emit(f"{head} = linalg.reduce ins({', '.join(r.ssa for r in results)} : {in_types}) "
                 f"outs({', '.join(i.ssa for i in inits)} : {init_types}) dimensions = [0]")
        blk.emit(f"{INDENT}({args}) {{")
        blk.extend(inner)
        blk.emit(f"{INDENT}{INDENT}linalg.yield {', '.join(yields)} : "
                 f"{', '.join(i.elt for i in inits)}")
        blk.emit(f"{INDENT}}}")
        combined = [i.renamed(red if len(inits) == 1 else f"{red}#{k}")
                    for k, i in enumerate(inits)]
        if accumulate:
            whole = self.combine_into(blk, op, self.extract_out(
                blk, dest, out_region, op.out.tensor), combined[0], ty)
            return self.insert(blk, whole, dest, out_region, parallel=False)
        piece = self.finish(blk, op, combined, lambda: self.extract_out(
            blk, dest, out_region, op.out.tensor))
        return self.insert(blk, piece, dest, out_region, parallel=False)
