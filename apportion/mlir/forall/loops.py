"""Loop groups of the parallel IR (``mlir.forall``): ``scf.for`` loops as the schedule's
``Loop`` steps nest them, each op over its tile at those loops' ids, results carried whole in
``iter_args`` where they are read outside the loop that writes them, and accumulators reset
before and finished after the loop that tiles their reduction (the module docstring of
``mlir.forall`` says how)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from apportion.errors import EmitError
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.limits import cite
from apportion.mlir.builder import INDENT, Block, symbol_name
from apportion.mlir.forall.compute import Compute
from apportion.mlir.forall.context import Context, Work
from apportion.mlir.forall.merge import merge_view, merged_tile, split_view, written
from apportion.mlir.forall.ops import OpRenderer
from apportion.mlir.forall.tensors import (
    Env,
    IxBox,
    IxRegion,
    TensorVal,
    empty,
    extract_out,
    filled,
    insert,
    region,
)
from apportion.mlir.index import Ix
from apportion.mlir.types import mlir_type
from apportion.schedule.values import Finish, Host, Init, Launch, Loop, Schedule, Step


class LoopGroups:
    """Loop groups, each op in them rendered by ``ops`` over its tile."""

    def __init__(self, ctx: Context, compute: Compute, ops: OpRenderer) -> None:
        self.ctx, self.compute, self.ops = ctx, compute, ops

    def group(self, blk: Block, loop: Loop, env: Env) -> None:
        """A loop group, the schedule's outermost ``loop``: an op runs in the loop that
        encloses it there, ops at a lesser depth next to the inner loop of their neighbours, an
        op with a loop of its own (two dims of one level) in that loop."""
        p = self.ctx.program
        nest = _Nest.of(p, self.ctx.schedule, loop, self.ctx.works)
        for name in nest.levels:
            op = p.op(name)
            if op.kind.reducer is None or op.kind.reducer.pairs:
                raise EmitError(f"op {op.name!r}: {op.kind.name} cannot accumulate across "
                                f"loop iterations {cite('iree-accumulate-kind')}")
        state = _Scope(dict(env), {})
        for t in nest.whole:  # carried whole through the loops that write them
            tt = p.tensor(t)
            # filled, not empty: IREE 3.13 merges equal tensor.empty inits of two loop-carried
            # values and its runtime then fails (OUT_OF_RANGE in hal.command_buffer.copy_buffer)
            state.vals[t] = filled(blk, t, self.ctx.sizes.shape(t), mlir_type(tt.dtype), 0)
        for name in nest.levels:
            op = p.op(name)
            assert op.kind.reducer is not None
            state.accs[name] = filled(blk, f"{op.out.tensor}_acc",
                                      self.ctx.sizes.shape(op.out.tensor),
                                      self.compute.compute_type(op), op.kind.reducer.identity)
        self.items(blk, nest, [loop], [], state)
        for t in nest.whole:
            env[t] = state.vals[t]

    def op_tile(self, blk: Block, op: Op, ivs: Sequence[Ix]) -> IxBox:
        """The box of ``op`` at the indices ``ivs`` of its outermost loops (deeper levels
        whole): each level cuts the dims it tiles (its launch's nonzero steps there) into its
        count of equal parts, as ``schedule.lower`` steps the tile."""
        work = self.ctx.work(op)
        box = {d: (Ix(0), n) for d, n in self.ctx.sizes.of(op).items()}
        for level, iv in enumerate(ivs):
            count = self.ctx.count(work.loops[level])
            for d in work.tiled(level):
                lo, n = box[d]
                step = blk.div(n, count)
                box[d] = (lo + blk.mul(iv, step), step)
        return box

    def items(self, blk: Block, nest: _Nest, items: Sequence[Step], ivs: list[Ix],
              state: _Scope) -> None:
        """One loop body (or the group's top, ``ivs`` empty): its ops over their tiles and its
        inner loops, in program order; ``state`` holds the values as the body runs. The
        ``Init``, ``Finish`` and ``Copy`` steps need nothing here: an accumulator resets and
        finishes around the loop at its level (``nest_loop``), and a tile is written into
        the tensor carried whole as its op runs."""
        for item in items:
            if isinstance(item, Launch | Host):
                self.nest_op(blk, nest, self.ctx.program.op(item.op), ivs, state)
            elif isinstance(item, Loop):
                self.nest_loop(blk, nest, item, ivs, state)

    def nest_loop(self, blk: Block, nest: _Nest, lp: Loop, ivs: list[Ix], state: _Scope
                  ) -> None:
        """Loop ``lp``: the resets of the accumulators whose reduction it tiles, an ``scf.for``
        carrying what its body writes that is read outside it, then those accumulators
        finished."""
        p = self.ctx.program
        depth = len(ivs)
        names = _ops_in(lp)
        key = lp.path
        mine = [n for n in names if n in nest.levels]
        for name in mine:  # reset before the loop that tiles the reduction
            if nest.levels[name] == depth and depth > 0:
                self.reset(blk, nest, p.op(name), ivs, state)
        keys: list[tuple[str, str]] = [("acc", n) for n in mine]
        keys += [("val", t) for t in nest.whole if nest.writes[t][:len(key)] == key]
        inits = [state.get(k) for k in keys]
        iv = blk.fresh(f"i{depth}")
        res = blk.fresh(f"loop{depth}")
        args = [v.renamed(blk.fresh(f"{symbol_name(k[1])}_{'acc' if k[0] == 'acc' else 'it'}"))
                for k, v in zip(keys, inits, strict=True)]
        types = ", ".join(a.type for a in args)
        bound = blk.value(self.ctx.count(lp))
        head = f"{res}:{len(args)}" if len(args) > 1 else res
        loop_text = f"scf.for {iv} = {blk.value(0)} to {bound} step {blk.value(1)}"
        if args:
            iter_text = ", ".join(f"{a.ssa} = {v.ssa}" for a, v in zip(args, inits, strict=True))
            blk.emit(f"{head} = {loop_text} iter_args({iter_text}) -> ({types}) {{")
        else:
            blk.emit(f"{loop_text} {{")
        inner = blk.child()
        local = state.copy()
        for k, a in zip(keys, args, strict=True):
            local.set(k, a)
        self.items(inner, nest, lp.body, [*ivs, Ix.atom(iv)], local)
        blk.extend(inner)
        if args:
            blk.emit(f"{INDENT}scf.yield {', '.join(local.get(k).ssa for k in keys)} : {types}")
        blk.emit("}")
        outs = [res] if len(args) == 1 else [f"{res}#{i}" for i in range(len(args))]
        for k, v, o in zip(keys, inits, outs, strict=True):
            state.set(k, v.renamed(o))
        for name in mine:  # after the loop that tiles the reduction: finished
            if nest.levels[name] == depth:
                self.finish_acc(blk, nest, p.op(name), ivs, state)

    def reset(self, blk: Block, nest: _Nest, op: Op, ivs: list[Ix], state: _Scope) -> None:
        """The region of ``op``'s accumulator the loops outside its reduction's select, set to
        the reducer's identity."""
        acc = state.accs[op.name]
        box = self.op_tile(blk, op, ivs)
        view = split_view(blk, op, acc)  # a merged write resets its split view
        place = region(written(op).out, box)
        shape = [ext for _, ext, lit in place if not lit]
        assert op.kind.reducer is not None
        f = filled(blk, f"{op.out.tensor}_reset", shape, acc.elt, op.kind.reducer.identity)
        view = insert(blk, f, view, place, parallel=False)
        state.accs[op.name] = merge_view(blk, op, view, acc)

    def finish_acc(self, blk: Block, nest: _Nest, op: Op, ivs: list[Ix], state: _Scope
                   ) -> None:
        """``op``'s accumulator over the region the loops outside its reduction select,
        finished (cast, a mean divided) into its output."""
        acc = state.accs[op.name]
        box = self.op_tile(blk, op, ivs)
        place = region(written(op).out, box)
        part = extract_out(blk, split_view(blk, op, acc), place, f"{op.out.tensor}_acc")
        dest, view = self.destination(blk, nest, op, place, state)
        piece = self.compute.finish(blk, op, [part], lambda: extract_out(blk, view, place,
                                                                         op.out.tensor))
        self.store(blk, nest, op, dest, insert(blk, piece, view, place, parallel=False), state)

    def destination(self, blk: Block, nest: _Nest, op: Op, place: IxRegion, state: _Scope
                    ) -> tuple[TensorVal | None, TensorVal]:
        """Where ``op`` writes over ``place`` (of its split view): the tensor carried whole
        (and its split view), or (None and) a fresh tile of this iteration in the split
        shape, static (a run-time tile size is bounded by the whole dim: IREE cannot size a
        dynamic tensor carried through a loop)."""
        t = op.out.tensor
        if t in nest.whole:
            whole = state.vals[t]
            return whole, split_view(blk, op, whole)
        out_t = self.ctx.program.tensor(t)
        shape = [ext if ext.is_const else Ix(n)
                 for (_, ext, _), n in zip(place, op.split_shape(out_t.shape), strict=True)]
        tile = empty(blk, f"{symbol_name(t)}_tile", shape, mlir_type(out_t.dtype),
                     [lo for lo, _, _ in place])
        return None, tile

    def store(self, blk: Block, nest: _Nest, op: Op, whole: TensorVal | None, view: TensorVal,
              state: _Scope) -> None:
        """``view`` (as ``destination`` gave it, written) as the tensor's value from here on."""
        t = op.out.tensor
        if whole is not None:
            state.vals[t] = merge_view(blk, op, view, whole)
        else:
            state.vals[t] = merged_tile(blk, op, view)

    def nest_op(self, blk: Block, nest: _Nest, op: Op, ivs: list[Ix], state: _Scope) -> None:
        """``op`` over its tile at ``ivs``: combined into its accumulator, written into the
        tensor carried whole, or into a fresh tile read in this iteration only."""
        work = self.ctx.work(op)
        tile = self.op_tile(blk, op, ivs)
        env = state.vals
        if op.name in nest.levels:
            state.accs[op.name] = self.ops.render(blk, op, work, tile, state.accs[op.name], env,
                                                  True)
            return
        t = op.out.tensor
        if t in nest.whole:
            state.vals[t] = self.ops.render(blk, op, work, tile, state.vals[t], env, False)
            return
        split = written(op)  # a merged write makes its tile split (forall.merge)
        _, dest = self.destination(blk, nest, op, region(split.out, tile), state)
        piece = self.ops.render(blk, split, work, tile, dest, env, False)
        self.store(blk, nest, op, None, piece, state)


@dataclasses.dataclass
class _Scope:
    """The values as a loop body (or the group's top) runs: tensor name -> its value (whole
    tensors and this iteration's tiles), accumulating op -> its accumulator."""

    vals: dict[str, TensorVal]
    accs: dict[str, TensorVal]

    def copy(self) -> _Scope:
        return _Scope(dict(self.vals), dict(self.accs))

    def get(self, key: tuple[str, str]) -> TensorVal:
        return (self.accs if key[0] == "acc" else self.vals)[key[1]]

    def set(self, key: tuple[str, str], val: TensorVal) -> None:
        (self.accs if key[0] == "acc" else self.vals)[key[1]] = val


@dataclasses.dataclass(frozen=True)
class _Nest:
    """What the emitter needs to know of a group before emitting it: the loop depth at which
    each accumulating op resets and finishes (``levels``: where its ``Init``, else its
    ``Finish``, stands; 0 where it has neither), where each tensor the group makes gets its
    value (``writes``: the path of its op's innermost loop, or of the loop its accumulator
    finishes after), and the tensors carried whole through the loops that write them
    (``whole``: read after the group, or by an op outside the loop that writes it); the
    others are one iteration's tile, a fresh tensor in the body that writes them."""

    levels: Mapping[str, int]
    writes: Mapping[str, tuple[int, ...]]
    whole: tuple[str, ...]

    @staticmethod
    def of(program: Program, schedule: Schedule, loop: Loop, works: Mapping[str, Work]
           ) -> _Nest:
        names = _ops_in(loop)
        inits: dict[str, int] = {}
        finishes: dict[str, int] = {}
        for s, loops in schedule.walk():
            if isinstance(s, Init):
                inits.setdefault(s.op, len(loops))
            elif isinstance(s, Finish):
                finishes.setdefault(s.op, len(loops))
        accumulating = [n for n in names if n in inits or n in finishes or (
            isinstance(works[n].step, Launch) and works[n].step.mode == "accumulate")]
        levels = {n: inits.get(n, finishes.get(n, 0)) for n in accumulating}
        writes: dict[str, tuple[int, ...]] = {}
        for n in names:
            path = works[n].path
            writes[program.op(n).out.tensor] = path[:levels[n]] if n in levels else path
        inside = set(names)
        after = {a.tensor for o in program.ops if o.name not in inside for a in o.ins} | set(
            program.outputs)
        reads: dict[str, list[tuple[int, ...]]] = {}
        for n in names:
            for a in program.op(n).ins:
                reads.setdefault(a.tensor, []).append(works[n].path)
        whole = tuple(t for t, w in writes.items() if t in after or any(
            r[:len(w)] != w for r in reads.get(t, [])))
        return _Nest(levels, writes, whole)


def _ops_in(loop: Loop) -> list[str]:
    """The ops ``loop`` runs at any depth, in order."""
    out: list[str] = []
    for s in loop.body:
        if isinstance(s, Launch | Host):
            out.append(s.op)
        elif isinstance(s, Loop):
            out += _ops_in(s)
    return out
