"""Thread-first parallel IR on tensors: a plan's schedule as MLIR ``scf.forall`` loops.

``forall_mlir`` reads one ``schedule.values.Schedule`` (the plan lowered by ``schedule.lower``;
nothing of the plan itself) and prints one ``func.func`` named after its program: it takes the
program inputs as tensors (then one ``index`` argument per symbolic loop count, named after it)
and returns the outputs. Every launch is one ``scf.forall`` over its worker grid
(``Launch.axes``), one induction variable per dim a worker axis splits (a launch of one worker
has no forall). A thread's box of the iteration space is its slice in whole planning units
(``Launch.units``; ``plans.views.dim_slices`` arithmetic: larger slices first): its start
an ``affine.apply`` of the thread id, its size static where the slices are equal and an
``affine.min`` where they are not. Each operand is read as the ``tensor.extract_slice`` of its
bounding box over the thread's box (``plans.tiles.region``; literal indices drop their axis) and
the op runs on the slices as a ``linalg.generic`` whose indexing maps are the accesses relative
to the slice (``x[t, 128*h+d]`` reads a wider slice through ``d1, d0 * 128 + d3``; a dim that no
access names alone gets a shape-only ``tensor.empty`` operand so that the generic knows its
range). A read through a sum that IREE 3.13 crashes on (three dims or more, ``64*a+32*c+d``:
``forall.tensors.iree_safe_map``) is a gather instead, a ``tensor.extract`` at the sum into a
tensor of one axis per dim that the generic reads through a projection. The body is the
backend's (``mlir.bodies``): value inputs convert to the compute type (``f32`` for
float16, bfloat16 and bool operands, as the reference executor computes; ``f32`` for float32
too, where the reference uses float64, but ``f64`` for a float32 sum, mean or product, whose
float32 error a later op can multiply by a row's length; ``i64`` for integers; ``f64`` where
integers meet floats or a kind has no integer body; IREE keeps ``f64``, its default demotion to
``f32`` off: ``runtime.FLAGS``), the result converts once to the output type. Each thread
writes its piece with ``tensor.parallel_insert_slice``.

Reductions and matmul accumulate into a ``linalg.fill`` of the reducer's identity (``f32`` for
float16/bfloat16, ``i64`` for integers, ``i1`` for ``any``); a reduction dim split over cores
makes the forall write one partial per slice into a ``[slices, ...output dims]`` tensor that a
``linalg.reduce`` then combines with the reducer's combine (``argmax`` carries value-index
pairs: the greater value wins, equal values the lower flat index, so any order gives numpy's
first maximum); ``mean`` divides by its count after. Fallbacks (sort, cumsum, flip) run whole
along the last axis of their input, with upstream linalg only: cumsum a running combine over
``j <= i`` (float32 summed in ``f64``, as the reference sums it: a long row's error grows), flip a
gather (``tensor.extract`` at ``n-1-i``: IREE tiles a reversed indexing map wrongly), sort by
rank (``O(n^2)`` per row: each element's rank counts the smaller ones, ties by position, NaN
last, then each rank picks its element).

A coarse-tiling loop group is ``scf.for`` loops as the schedule's ``Loop`` steps nest them (as
the reference executor runs them): an op runs in the loop that encloses it, over its tile at
those loops' ids (each level cuts the dims its launch steps along, ``Launch.steps``, into its
count of parts; a symbolic count, ``Loop.symbol``, is its function argument), so an op at a
lesser depth (``"depths"``) runs next to the inner loop of its
neighbours, a shallower op between deeper ones makes sibling inner loops, and an op over two dims
of one level runs its own inner loop. A tensor read outside the loop that writes it (after the
group, or by a shallower op) is carried whole in ``iter_args`` by every loop around its writer,
from a fill (IREE 3.13 fails at run time on loop-carried values that start from
``tensor.empty``: ``runtime.FLAGS``); a tensor read only inside that loop is one iteration's
tile, a fresh tensor every iteration. A reduction tiled by a loop accumulates into a whole
accumulator carried by every loop around it (``Launch.mode`` ``accumulate``): reset to its
identity before the loop that tiles the reduction (where its ``Init`` stands; its tile of the
loops outside), each tile's partial computed from its identity and
combined into it elementwise, as the reference executor does, and finished (cast, a mean
divided) after that loop (its ``Finish``), where shallower ops read it. A fallback in a loop
(``Host``) runs on its tile's region of its input, whole along the axis it works on. Static
tile geometry is affine maps of the loop and thread ids; a symbolic count divides with
``arith.divui``, slices of a run-time tile size use ``arith`` on ``index``, and a forall's
shared tensor keeps a static shape (the whole dim bounds a run-time tile: IREE cannot size a
dynamic tensor carried through a loop).

A forall carries a ``mapping`` where the schedule's target gives one
(``forall.tensors.forall_mapping``): the ``gpu`` target's worker grids as ``#gpu.block<x>``
(``y``, ``z``, or ``linear_dim_i`` beyond three ids); ``cpu`` and ``spyre`` give none.

A schedule of a program with run-time sizes (``Schedule.given``, the program as given) is one
function for every size (``forall.sizes``): ``?`` for symbolic dims, their sizes read with
``tensor.dim``, each split-K op's slices an ``arith.select`` chain on its run-time reduction
size (the partial launch's ``Launch.split_k``), every op's
slices cut from the run-time sizes as ``dim_slices`` cuts them (a thread past the last unit
gets an empty slice), and a forall whose shared output has a run-time size one linear thread id
(IREE cannot size a dynamic tensor that nested loops carry).

An op writing its output through a merge of dims (``y[t, 64*h+d]``) writes the split view of
its destination: a ``tensor.expand_shape`` into ``Op.split_shape`` (the row-major reshape), the op
then as one writing ``y[t, h, d]``, and a ``tensor.collapse_shape`` back
(``mlir.forall.merge``); its split reductions, accumulators and loop tiles are those of the
split view.

A kind the backend's table (``mlir.bodies``) lacks raises ``EmitError`` naming the op,
the kind and the backend; whole-tensor kinds (gathers, reshapes, constants, ...) read their
inputs by computed index (``mlir.forall.fallback``).

>>> import apportion as ap
>>> from apportion.schedule.lower import lower
>>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
>>> text = forall_mlir(lower(planned.program, planned.plan, planned.target))
>>> text.splitlines()[0]
'func.func @mlp(%x: tensor<256x1024xf16>, %wg: tensor<1024x2816xf16>, \
%wu: tensor<1024x2816xf16>, %wd: tensor<2816x1024xf16>) -> tensor<256x1024xf16> {'
>>> verify_mlir(text)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from apportion.errors import EmitError
from apportion.ir.kinds import Category, OpKind
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.limits import cite
from apportion.mlir import bodies
from apportion.mlir.bodies import body_of, combine_of
from apportion.mlir.builder import INDENT as INDENT
from apportion.mlir.builder import _Block, _Emitter
from apportion.mlir.builder import slice_of as slice_of
from apportion.mlir.forall.fallback import _Fallbacks
from apportion.mlir.forall.merge import _MergedWrites, merges, written
from apportion.mlir.forall.sizes import Sizes
from apportion.mlir.forall.split import _SplitReductions
from apportion.mlir.forall.tensors import Box as Box
from apportion.mlir.forall.tensors import TensorVal as TensorVal
from apportion.mlir.forall.tensors import Work, _Carried, _Env
from apportion.mlir.index import Ix as Ix
from apportion.mlir.index import IxLike as IxLike
from apportion.mlir.index import Key as Key
from apportion.mlir.text import check_index
from apportion.mlir.text import symbol_name as symbol_name
from apportion.mlir.text import verify_mlir as verify_mlir
from apportion.mlir.types import INDEX_MAX as INDEX_MAX
from apportion.mlir.types import MLIR_TYPES as MLIR_TYPES
from apportion.mlir.types import mlir_type as mlir_type
from apportion.schedule.values import Finish, Host, Init, Launch, Loop, Schedule, Step


def forall_mlir(schedule: Schedule) -> str:
    """The schedule (``schedule.lower``: the plan lowered, its symbolic loop counts at the
    values they were planned at, ``planned_counts``) as thread-first parallel IR on tensors
    (MLIR text, not verified; ``verify_mlir`` checks it). Every decision comes from the
    schedule: each op's worker grid and planning units (``Launch.axes``, ``Launch.units``),
    its loops (``Loop`` steps; a symbolic count stays the function argument named after it)
    and the dims each level tiles (the launch's nonzero steps), where accumulators reset and
    finish (``Init``/``Finish`` steps) and the fallbacks (``Host``). A schedule of a program
    with run-time sizes (``Schedule.given``) is one function for every size
    (``mlir.forall.sizes``).
    """
    program, symbolic = schedule.program, schedule.given
    if symbolic is not None:
        if not symbolic.symbols:
            symbolic = None
        elif symbolic.name != program.name or symbolic.inputs != program.inputs or \
                symbolic.outputs != program.outputs:
            raise EmitError(f"program {program.name!r} is not program {symbolic.name!r} "
                            "planned: their names, inputs or outputs differ")
    for t in program.tensors:
        for i, n in enumerate(t.shape):
            check_index(n, f"tensor {t.name!r} dim {i} (size)")
    for op in program.ops:
        for d, n in op.sizes.items():
            check_index(n, f"op {op.name!r} dim {d!r} (size)")
    return _Function(schedule, symbolic).text()


def size_symbols(program: Program) -> tuple[str, ...]:
    """The run-time sizes the emitted function of ``program`` (a program as given, with
    symbols) takes as trailing ``index`` arguments, after the symbolic loop counts: those no
    input has (the others it reads with ``tensor.dim``)."""
    on_inputs = {s for n in program.inputs for _, s in program.tensor(n).dynamic}
    return tuple(s.name for s in program.symbols if s.name not in on_inputs)


def symbols(schedule: Schedule) -> tuple[str, ...]:
    """The symbolic loop counts, in the order the emitted function takes them (after the
    inputs): as their loops first appear in the schedule.

    >>> import apportion as ap
    >>> from apportion.schedule.lower import lower, planned_counts
    >>> planned = ap.plan(ap.load("examples/softmax_symbolic.json"), ap.targets.spyre(cores=8))
    >>> symbols(lower(planned.program, planned.plan, planned.target,
    ...               params=planned_counts(planned.plan)))
    ('T',)
    """
    return tuple(dict.fromkeys(s.symbol for s, _ in schedule.walk()
                               if isinstance(s, Loop) and s.symbol))


def thread_slices(n: int, per: int, split: int, dynamic: bool = False) -> list[tuple[int, int]]:
    """(start, size) of every thread's slice as the emitted index arithmetic computes them,
    with the size ``n`` a constant or (``dynamic``) a run-time value; equals
    ``plans.views.dim_slices`` as (start, stop - start).

    >>> thread_slices(10, 1, 4), thread_slices(10, 1, 4, dynamic=True)
    ([(0, 3), (3, 3), (6, 2), (8, 2)], [(0, 3), (3, 3), (6, 2), (8, 2)])
    """
    em = _Emitter()
    blk = _Block(em, 1)
    size = Ix.atom("%n") if dynamic else Ix(n)
    start, length = slice_of(blk, size, per, split, Ix.atom("%s"))
    return [(em.evaluate(start, {"%n": n, "%s": s}), em.evaluate(length, {"%n": n, "%s": s}))
            for s in range(split)]


class _Function(_SplitReductions, _Fallbacks, _MergedWrites):
    """The whole function: ops outside loops, each op over a tile (one forall over its
    split dims), and loop groups."""

    # -- the whole function ---------------------------------------------------------------

    def __init__(self, schedule: Schedule, symbolic: Program | None = None) -> None:
        super().__init__(schedule)
        self.symbolic = symbolic

    def text(self) -> str:
        p = self.program
        top = _Block(self, 1)
        env = _Env()
        ssas = {name: self.names.fresh(name) for name in p.inputs}
        self.symbols: dict[str, str] = {}
        for c in symbols(self.schedule):
            self.symbols[c] = self.names.fresh(c)
        if self.symbolic is not None:
            self.sizes = Sizes.symbolic(p, self.symbolic, self.names)
        args = []
        for name in p.inputs:
            t = p.tensor(name)
            env.vals[name] = TensorVal(ssas[name], self.sizes.shape(name), mlir_type(t.dtype))
            args.append(f"{ssas[name]}: {env.vals[name].type}")
        args += [f"{self.symbols[c]}: index" for c in self.symbols]
        if self.symbolic is not None:
            self.sizes.read(top, env.vals)
            self.sizes.cut(top, {s.op: s.split_k for s, _ in self.schedule.walk()
                                 if isinstance(s, Launch) and s.split_k is not None})
            args += [f"{self.sizes.symbols[s]}: index" for s in self.sizes.arguments]
        for step in self.schedule.steps:
            if isinstance(step, Launch | Host):
                self.whole_op(top, p.op(step.op), env)
            elif isinstance(step, Loop):
                self.group(top, step, env)
            # an Init or Finish outside loops is its loop group's: its accumulator starts
            # filled with the identity (group) and is finished after the loop (nest_loop)
        outs = [env.vals[n] for n in p.outputs]
        types = ", ".join(v.type for v in outs)
        result = types if len(outs) == 1 else f"({types})"
        lines = [f"func.func @{symbol_name(p.name)}({', '.join(args)}) -> {result} {{",
                 *self.const_lines, *top.lines,
                 f"{INDENT}return {', '.join(v.ssa for v in outs)} : {types}", "}"]
        return "\n".join(lines) + "\n"

    # -- ops outside loops ----------------------------------------------------------------

    def whole_op(self, blk: _Block, op: Op, env: _Env) -> None:
        work = self.work(op)
        t = self.program.tensor(op.out.tensor)
        dest = self.empty(blk, op.out.tensor, self.sizes.shape(op.out.tensor),
                          mlir_type(t.dtype))
        tile = {d: (Ix(0), n) for d, n in self.sizes.of(op).items()}
        viewed, local = self.viewed(blk, op, env)
        env.vals[op.out.tensor] = self.op(blk, viewed, work, tile, dest, local, None)

    def viewed(self, blk: _Block, op: Op, env: _Env) -> tuple[Op, _Env]:
        """``op`` and the tensors it reads, with the inputs of a partial op whose slice length
        is known only at run time read through a ``tensor.expand_shape`` of the reduction axis
        into ``[slices, step]`` (``mlir.forall.sizes``)."""
        views = self.sizes.views(op)
        if not views:
            return op, env
        local = _Env(dict(env.vals))
        ins = list(op.ins)
        axes: dict[str, int] = {}
        for v in views:
            a = op.ins[v.index]
            ins[v.index] = v.access
            if axes.setdefault(a.tensor, v.axis) != v.axis:
                raise EmitError(f"op {op.name!r} reads tensor {a.tensor!r} along its run-time "
                                "split through two different axes "
                                f"{cite('iree-runtime-split-read')}")
            src = env.vals[a.tensor]
            if local.vals[a.tensor] is not src:
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
                     f"[{self.list(blk, shape)}] : {src.type} into {view.type}")
            local.vals[a.tensor] = view
        return dataclasses.replace(op, ins=tuple(ins)), local

    # -- one op over a tile ---------------------------------------------------------------

    def op(self, blk: _Block, op: Op, work: Work, tile: Box, dest: TensorVal, env: _Env,
           carried: _Carried | None) -> TensorVal:
        """Emit ``op`` over ``tile`` writing into ``dest`` (the accumulator when ``carried``
        accumulates); returns the new value of ``dest``."""
        if merges(op):  # the op writing the split view of dest (forall.merge)
            view = self.split_view(blk, op, dest)
            new = self.op(blk, written(op), work, tile, view, env, carried)
            return self.merge_view(blk, op, new, dest)
        kind = op.kind
        if kind.category is Category.FALLBACK:
            return self.fallback(blk, op, dest, env, tile)
        self.check_body(op)
        splits = work.splits
        per = work.per
        split_dims = [d for d in op.dim_names if splits[d] > 1]
        red_split = [d for d in op.reduction_dims if splits[d] > 1]
        if red_split:
            return self.split_reduction(blk, op, work, tile, dest, env, carried, split_dims,
                                        red_split)
        accumulate = carried is not None and carried.accumulates
        if not split_dims:
            piece = self.core(blk, op, tile, dest, env, accumulate)
            return self.insert(blk, piece, dest, self.out_region(op, tile), parallel=False)
        inner = blk.child()
        ivs, grid = self.thread_ids(blk, inner, op, split_dims, splits,
                                    not all(s.is_const for s in dest.shape))
        shared = blk.fresh(f"{symbol_name(op.out.tensor)}_shared")
        new = blk.fresh(op.out.tensor)
        box = {d: self.thread_slice(inner, tile[d], per[d], splits[d], ivs.get(d))
               for d in op.dim_names}
        sh = dest.renamed(shared)
        piece = self.core(inner, op, box, sh, env, accumulate)
        blk.emit(f"{new} = scf.forall {grid} shared_outs({shared} = {dest.ssa}) -> "
                 f"({dest.type}) {{")
        inner2 = inner.child()
        self.parallel_insert(inner2, piece, sh, self.out_region(op, box))
        blk.extend(inner)  # after the insert, which may compute offsets in the thread body
        blk.emit(f"{INDENT}scf.forall.in_parallel {{")
        blk.extend(inner2)
        blk.emit(f"{INDENT}}}")
        blk.emit("}" + self.mapping(grid))
        return dest.renamed(new)

    def check_body(self, op: Op) -> None:
        """Refuse, naming the op, its kind and the backend, a kind the backend's table lacks."""
        kind = op.kind
        if kind.reducer is not None:
            combine_of(kind.reducer, op.name, kind)
        if kind.category is not Category.REDUCTION:
            body_of(kind, op.name)

    # -- loop groups --------------------------------------------------------------------------

    def group(self, blk: _Block, loop: Loop, env: _Env) -> None:
        """A loop group, the schedule's outermost ``loop``: an op runs in the loop that
        encloses it there, ops at a lesser depth next to the inner loop of their neighbours, an
        op with a loop of its own (two dims of one level) in that loop."""
        p = self.program
        nest = _Nest.of(p, self.schedule, loop, self.works)
        for name in nest.levels:
            op = p.op(name)
            if op.kind.reducer is None or op.kind.reducer.pairs:
                raise EmitError(f"op {op.name!r}: {op.kind.name} cannot accumulate across "
                                f"loop iterations {cite('iree-accumulate-kind')}")
        state = _Scope(dict(env.vals), {})
        for t in nest.whole:  # carried whole through the loops that write them
            tt = p.tensor(t)
            # filled, not empty: IREE 3.13 merges equal tensor.empty inits of two loop-carried
            # values and its runtime then fails (OUT_OF_RANGE in hal.command_buffer.copy_buffer)
            state.vals[t] = self.filled(blk, t, self.sizes.shape(t), mlir_type(tt.dtype), 0)
        for name in nest.levels:
            op = p.op(name)
            assert op.kind.reducer is not None
            state.accs[name] = self.filled(blk, f"{op.out.tensor}_acc",
                                           self.sizes.shape(op.out.tensor),
                                           self.compute_type(op), op.kind.reducer.identity)
        self.items(blk, nest, [loop], [], state)
        for t in nest.whole:
            env.vals[t] = state.vals[t]

    def count(self, loop: Loop) -> Ix:
        """A loop's count as an index value: a symbolic one is its function argument."""
        return Ix.atom(self.symbols[loop.symbol]) if loop.symbol else Ix(loop.count)

    def op_tile(self, blk: _Block, op: Op, ivs: Sequence[Ix]) -> Box:
        """The box of ``op`` at the indices ``ivs`` of its outermost loops (deeper levels
        whole): each level cuts the dims it tiles (its launch's nonzero steps there) into its
        count of equal parts, as ``schedule.lower`` steps the tile."""
        work = self.work(op)
        box = {d: (Ix(0), n) for d, n in self.sizes.of(op).items()}
        for level, iv in enumerate(ivs):
            count = self.count(work.loops[level])
            for d in work.tiled(level):
                lo, n = box[d]
                step = blk.div(n, count)
                box[d] = (lo + blk.mul(iv, step), step)
        return box

    def items(self, blk: _Block, nest: _Nest, items: Sequence[Step], ivs: list[Ix],
              state: _Scope) -> None:
        """One loop body (or the group's top, ``ivs`` empty): its ops over their tiles and its
        inner loops, in program order; ``state`` holds the values as the body runs. The
        ``Init``, ``Finish`` and ``Copy`` steps need nothing here: an accumulator resets and
        finishes around the loop at its level (``nest_loop``), and a tile is written into
        the tensor carried whole as its op runs."""
        for item in items:
            if isinstance(item, Launch | Host):
                self.nest_op(blk, nest, self.program.op(item.op), ivs, state)
            elif isinstance(item, Loop):
                self.nest_loop(blk, nest, item, ivs, state)

    def nest_loop(self, blk: _Block, nest: _Nest, lp: Loop, ivs: list[Ix], state: _Scope
                  ) -> None:
        """Loop ``lp``: the resets of the accumulators whose reduction it tiles, an ``scf.for``
        carrying what its body writes that is read outside it, then those accumulators
        finished."""
        p = self.program
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
        bound = blk.value(self.count(lp))
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

    def reset(self, blk: _Block, nest: _Nest, op: Op, ivs: list[Ix], state: _Scope) -> None:
        """The region of ``op``'s accumulator the loops outside its reduction's select, set to
        the reducer's identity."""
        acc = state.accs[op.name]
        box = self.op_tile(blk, op, ivs)
        view = self.split_view(blk, op, acc)  # a merged write resets its split view
        region = self.out_region(written(op), box)
        shape = [ext for _, ext, lit in region if not lit]
        assert op.kind.reducer is not None
        f = self.filled(blk, f"{op.out.tensor}_reset", shape, acc.elt, op.kind.reducer.identity)
        view = self.insert(blk, f, view, region, parallel=False)
        state.accs[op.name] = self.merge_view(blk, op, view, acc)

    def finish_acc(self, blk: _Block, nest: _Nest, op: Op, ivs: list[Ix], state: _Scope
                   ) -> None:
        """``op``'s accumulator over the region the loops outside its reduction select,
        finished (cast, a mean divided) into its output."""
        acc = state.accs[op.name]
        box = self.op_tile(blk, op, ivs)
        split = written(op)
        region = self.out_region(split, box)
        part = self.extract_out(blk, self.split_view(blk, op, acc), region,
                                f"{op.out.tensor}_acc")
        dest, view = self.destination(blk, nest, op, region, state)
        piece = self.finish(blk, op, [part], lambda: self.extract_out(blk, view, region,
                                                                      op.out.tensor))
        self.store(blk, nest, op, dest, self.insert(blk, piece, view, region, parallel=False),
                   state)

    def destination(self, blk: _Block, nest: _Nest, op: Op, region: list[tuple[Ix, Ix, bool]],
                    state: _Scope) -> tuple[TensorVal | None, TensorVal]:
        """Where ``op`` writes over ``region`` (of its split view): the tensor carried whole
        (and its split view), or (None and) a fresh tile of this iteration in the split
        shape, static (a run-time tile size is bounded by the whole dim: IREE cannot size a
        dynamic tensor carried through a loop)."""
        t = op.out.tensor
        if t in nest.whole:
            whole = state.vals[t]
            return whole, self.split_view(blk, op, whole)
        out_t = self.program.tensor(t)
        shape = [ext if ext.is_const else Ix(n)
                 for (_, ext, _), n in zip(region, op.split_shape(out_t.shape), strict=True)]
        tile = self.empty(blk, f"{symbol_name(t)}_tile", shape, mlir_type(out_t.dtype),
                          [lo for lo, _, _ in region])
        return None, tile

    def store(self, blk: _Block, nest: _Nest, op: Op, whole: TensorVal | None, view: TensorVal,
              state: _Scope) -> None:
        """``view`` (as ``destination`` gave it, written) as the tensor's value from here on."""
        t = op.out.tensor
        if whole is not None:
            state.vals[t] = self.merge_view(blk, op, view, whole)
        else:
            state.vals[t] = self.merged_tile(blk, op, view)

    def nest_op(self, blk: _Block, nest: _Nest, op: Op, ivs: list[Ix], state: _Scope) -> None:
        """``op`` over its tile at ``ivs``: combined into its accumulator, written into the
        tensor carried whole, or into a fresh tile read in this iteration only."""
        work = self.work(op)
        tile = self.op_tile(blk, op, ivs)
        env = _Env(state.vals)
        if op.name in nest.levels:
            carried = _Carried(op.out.tensor, op, True, state.accs[op.name],
                               nest.levels[op.name])
            state.accs[op.name] = self.op(blk, op, work, tile, state.accs[op.name], env,
                                          carried)
            return
        t = op.out.tensor
        if t in nest.whole:
            state.vals[t] = self.op(blk, op, work, tile, state.vals[t], env, None)
            return
        split = written(op)  # a merged write makes its tile split (forall.merge)
        _, dest = self.destination(blk, nest, op, self.out_region(split, tile), state)
        piece = self.op(blk, split, work, tile, dest, env, None)
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


def supported(kind: OpKind) -> bool:
    """True when the emitter can emit ops of ``kind`` (``mlir.bodies`` has its code)."""
    return bodies.supported(kind)


