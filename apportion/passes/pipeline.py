"""The planning pipeline: every pass, in order, in one function.

Each pass is one module with one entry point; it takes the program, the target and the values
of earlier stages and returns a frozen value of its own, which no later stage changes. Each
stage runs once: where split-K rewrites ops into partial and combine ops, the ops it adds get
their layouts and contexts, and buffer roles are found after the rewrite (see ``_plan``).
"""

from __future__ import annotations

import gc
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace

from apportion.errors import PlanningError
from apportion.ir.program import Program
from apportion.passes.auto_tile import auto_tile as auto_tile_counts
from apportion.passes.buffers import buffers
from apportion.passes.coarse_tile import Tiling, coarse_tile
from apportion.passes.geometry import OpContext, PlanCache, contexts, group_time, slice_sizes
from apportion.passes.group_distribution import group_distribution
from apportion.passes.layouts import Layouts, layouts, op_layout
from apportion.passes.relayout import relayout
from apportion.passes.scratchpad import follow_pins, scratchpad
from apportion.passes.span_reduction import span_reduction
from apportion.passes.span_tiling import REASON, span_tiling
from apportion.passes.split_k import SplitKDecisions, partials, with_split_k
from apportion.passes.split_k import split_k as split_k_pass
from apportion.passes.strategy import Strategy, parse_strategy
from apportion.passes.work_distribution import work_distribution
from apportion.plans.plan import LoopInfo, Plan, ReuseCounts, SplitK
from apportion.target.layout import device_layout
from apportion.target.split_k import Resolver
from apportion.target.target import Target

#: ``debug(stage name, the stage's value)``
Stage = Callable[[str, object], None]


def plan(program: Program, target: Target, strategy: Strategy | str = "balanced",
         debug: Stage | None = None, auto_tile: bool = False, reuse: bool = True,
         split_k: Resolver | None = None) -> Plan:
    """Plan ``program`` for ``target`` under ``strategy`` (a ``passes/strategy.py`` object or
    its name; the plan records the name).

    ``debug``, when given, is called with each stage's name and its own value, and the plan is
    verified after the last pass. ``auto_tile`` replaces the integer loop counts of every tiling
    group by the ones with the lowest predicted time of the group among those whose
    per-iteration working set fits the scratchpad (see ``passes/auto_tile.py``).

    Identical ops (equal ``OpContext.signature``: kind, sizes, accesses up to tensor names,
    pins, loop context) are planned once and the others take that plan, renamed (``reuse``;
    ``reuse=False`` plans every op afresh, to the same plan). ``Plan.reuse`` counts both.
    ``split_k`` is a user split-K resolver, asked before the target's (``passes/split_k.py``).

    >>> from apportion.frontend.json_format import load
    >>> from apportion.target import spyre
    >>> p = plan(load("examples/mlp.json"), spyre(cores=32))
    >>> p.op("gate").split_map   # balanced: the lowest predicted time
    {'m': 8, 'n': 4, 'k': 1}
    >>> from apportion.passes.strategy import Greedy
    >>> g = plan(load("examples/mlp.json"), spyre(cores=32), Greedy())
    >>> g.strategy, g.op("gate").split_map
    ('greedy', {'m': 32, 'n': 1, 'k': 1})
    >>> plan(load("examples/fused.json"), spyre(cores=32)).op("add").sizes
    {'m': 512, 'n': 1024}
    """
    chosen = parse_strategy(strategy)
    with _FEWER_COLLECTIONS:
        return _plan(program, target, chosen, debug, auto_tile, reuse, split_k)


class _CollectorThresholds:
    """Raises the cyclic garbage collector's thresholds while any thread plans, and puts back
    the caller's when the last one is done.

    Planning allocates many small values that live until the plan is built and form no cycles
    worth collecting early; at the default thresholds the collector rescans them over and over,
    which cost a 20,000-op program a third of its planning time and grew faster than the
    program (``bench scale``). Reference counting still frees everything as usual.
    """

    THRESHOLDS = (50_000, 20, 20)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved: tuple[int, int, int] | None = None

    def __enter__(self) -> None:
        with self._lock:
            if self._users == 0:
                self._saved = gc.get_threshold()
                if self._saved[0] != 0:  # 0: the caller turned collection off; leave it off
                    gc.set_threshold(*map(max, self._saved, self.THRESHOLDS))
            self._users += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._saved is not None:
                gc.set_threshold(*self._saved)
                self._saved = None


_FEWER_COLLECTIONS = _CollectorThresholds()


def _plan(program: Program, target: Target, strategy: Strategy, debug: Stage | None,
          auto_tile: bool, reuse: bool, split_k: Resolver | None) -> Plan:
    dump = debug or _quiet
    cache = PlanCache(reuse)
    # sizes known only at run time are planned at their planning sizes (the bound, if any);
    # split-K still sees which reductions are symbolic and may decide by a select chain
    planned_at = tuple(program.planning_sizes().items())
    # 0. relayout: an explicit re-layout op before each op that reads a tensor transposed
    #    (another stick dim); the planned program is then the rewritten one. It runs before
    #    binding so that a copy of a run-time axis is symbolic too; binding sizes
    #    (schedule/bind.py) sizes the same copies from the axes they read
    program, copies = relayout(program, target)
    if copies:
        dump("relayout", copies)
    symbols = {op: {d: program.symbol_map[sym] for d, sym in dims.items()}
               for op, dims in program.dim_symbols.items()}
    dim_symbols = program.dim_symbols  # tile sizes of run-time dims stay expressions in them
    sized = program if planned_at else None
    program = program.bind()
    # 1. layouts: device layout of every tensor; stick dims and planning units of every op
    #    (split-K's rewrite below adds those of the ops and tensors it makes)
    lay = layouts(program, target)
    dump("layouts", lay)
    # 2. auto_tile (when asked): each tiling group's integer loop counts, those with the lowest
    #    predicted time of the group whose per-iteration working set fits the scratchpad
    if auto_tile:
        program = auto_tile_counts(program, target, lay, strategy, cache, split_k)
        dump("auto_tile", program.tiling)
    # 2b. span_tiling: a loop of last resort around each op that no split of the strategy keeps
    #     within the span limit (a new one-op tiling group; the plan's group says ``added``)
    spanned = span_tiling(program, target, lay, strategy, cache, symbolic=sized)
    if spanned.added:
        dump("span_tiling", spanned)
        program = spanned.program
    # 3. coarse_tile: loop nests of the tiling groups and every op's per-iteration sizes
    tiling = coarse_tile(program, lay.ops, target.max_loop_count, dim_symbols=dim_symbols)
    dump("coarse_tile", tiling)
    loops = {op.name: _loop(tiling, op.name) for op in program.ops}
    ctxs = contexts(program, target, lay, {op.name: tiling.sizes(op) for op in program.ops},
                    loops)
    # 4. split_k: each op's reduction split as the program pins it or the target's resolver
    #    decides (None: left to work distribution's search by predicted time)
    decisions = split_k_pass(ctxs, program.split_k_pins, split_k, symbols)
    dump("split_k", decisions)
    #    an op whose reduction is split this way becomes a partial op and a combine op. Only
    #    ops outside loop groups are rewritten, so the tiling stands as it is; the new ops get
    #    their layouts and contexts, and every other op keeps its own (no stage runs again)
    grouped = frozenset(n for g in tiling.groups for n in g.ops)
    source, asked = program, decisions
    program, fixed = partials(program, ctxs, decisions, grouped)
    if fixed:
        dump("partials", program)
        lay, ctxs = with_rewritten(program, target, lay, ctxs)
        decisions = SplitKDecisions({n: fixed.get(n, decisions.by_op.get(n)) for n in ctxs})
    ctxs = with_split_k(ctxs, decisions)
    # 5. buffers: which buffers each tensor needs (tile, full, accumulator) and the loop steps;
    #    after split-K, whose partial ops may be the readers of a group's tensor
    bufs = buffers(program, tiling)
    dump("buffers", bufs)
    # 6. span_reduction: minimum splits that keep every per-core span within the limit
    spans = span_reduction(ctxs, strategy)
    dump("span_reduction", spans)
    # 7. work_distribution: splits of every dim under the strategy (pins from the program win);
    #    a split reduction dim is split-K, chosen here with the rest
    splits = work_distribution(ctxs, spans, strategy, cache)
    dump("work_distribution", splits)
    # 8. group_distribution (balanced: its greedy baseline): splits agreeing across a loop
    #    group where that keeps tiles on chip and lowers the group's predicted time
    baseline = strategy.group_baseline
    if baseline is not None:
        splits = group_distribution(ctxs, tiling, bufs, spans, splits, cache, baseline)
        dump("group_distribution", splits)
    # 8b. follow_pins: ops next to pinned ones cut like them where that keeps the tensors
    #     between on chip (a softmax pinned by the user with the matmuls around it)
    followed = follow_pins(ctxs, tiling, splits)
    if followed is not splits:
        splits = followed
        dump("follow_pins", splits)
    op_plans = {n: replace(cache.op_plan(ctx, spans.of(n), splits[n], loops.get(n)),
                           split_k=_reported(n, decisions, asked)) for n, ctx in ctxs.items()}
    # 9. scratchpad: the scratchpad plan of every loop group, every tensor's buffers
    memory = scratchpad(program, target, tiling, bufs, op_plans, untiled=not planned_at)
    dump("scratchpad", memory)
    added = set(spanned.groups)
    # iteration time: the tiles kept on chip move no device memory (as group distribution
    # weighs them; an accumulator's place in the scratchpad is not priced)
    groups = tuple(replace(g, iteration_time_us=round(group_time(
        g.ops, ctxs, splits.by_op, frozenset(g.lx_tensors) - {f.tensor for f in g.finishes}),
        4),
        added=REASON if g.path[0] in added else "") for g in memory.groups)
    planned = len({ctx.signature for ctx in ctxs.values()}) if reuse else len(ctxs)
    result = Plan(program.name, target.name, target.cores, strategy.name,
                  tuple(op_plans[o.name] for o in program.ops), groups=groups,
                  buffers=memory.buffers, reuse=ReuseCounts(planned, len(ctxs) - planned),
                  rewritten=None if program is source and not copies else program,
                  symbols=planned_at)
    if debug:
        verify(program, target, result)
    return result


def with_rewritten(program: Program, target: Target, lay: Layouts,
                   ctxs: Mapping[str, OpContext]) -> tuple[Layouts, dict[str, OpContext]]:
    """The layouts and op contexts of ``program``, split-K's rewrite of the program that
    ``lay`` and ``ctxs`` describe: equal to ``layouts(program, target)`` and ``contexts`` over
    it, at the cost of the ops and tensors the rewrite added.

    The rewrite keeps every other op as it was (the same object) and adds tensors, so their
    layouts stand; their contexts are bound to the rewritten program (planning reads its pins
    and tensors through it). A new op is outside every loop group: its sizes are its own.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.split_k import split_k
    >>> from apportion.target import spyre
    >>> p, t = load("examples/mlp.json"), spyre(cores=32)
    >>> lay = layouts(p, t)
    >>> ctxs = contexts(p, t, lay, {o.name: dict(o.sizes) for o in p.ops})
    >>> rewritten, _ = partials(p, ctxs, split_k(ctxs, {"down": 4}), frozenset())
    >>> new_lay, new_ctxs = with_rewritten(rewritten, t, lay, ctxs)
    >>> new_lay == layouts(rewritten, t), list(new_ctxs)[-2:]
    (True, ['down.partial', 'down.combine'])
    """
    tensors = dict(lay.tensors)
    for t in program.tensors:
        if t.name not in tensors:
            tensors[t.name] = device_layout(t.shape, t.dtype, target)
    kept = {op.name for op in program.ops if op.name in ctxs and ctxs[op.name].op is op}
    new_lay = Layouts({op.name: lay.ops[op.name] if op.name in kept else
                       op_layout(op, program, target) for op in program.ops}, tensors)
    out = {op.name: replace(ctxs[op.name], program=program, tlayouts=new_lay.tensors)
           if op.name in kept else
           OpContext(op, program, target, new_lay.ops[op.name], new_lay.tensors, dict(op.sizes))
           for op in program.ops}
    return new_lay, out


def _reported(name: str, decisions: SplitKDecisions, asked: SplitKDecisions
              ) -> SplitK | None:
    """An op's split-K as the plan reports it: a partial op names the reduction dim of the op
    it was cut from (``asked``: the decisions on the program as given)."""
    d = decisions.by_op.get(name)
    base = name.removesuffix(".partial")
    if d is None or base == name or base not in asked.by_op:
        return d
    return asked.by_op[base]


def _quiet(name: str, value: object) -> None:
    pass


def _loop(tiling: Tiling, name: str) -> LoopInfo | None:
    tile = tiling.tile(name)
    return None if tile is None else tile.loop


def verify(program: Program, target: Target, result: Plan) -> None:
    """Check the invariants every plan must hold; raise PlanningError naming the op otherwise."""
    for op_plan in result.ops:
        if op_plan.cores > target.cores:
            raise PlanningError(f"op {op_plan.name!r}: uses {op_plan.cores} cores > "
                                f"{target.cores}")
        over = {t: s for t, s in op_plan.span_bytes if s > target.span_limit}
        if over:
            raise PlanningError(f"op {op_plan.name!r}: spans {over} exceed {target.span_limit}")
        red = [d for d in op_plan.reduction_dims if op_plan.split_map[d] > 1]
        if len(red) > 1:
            raise PlanningError(f"op {op_plan.name!r}: splits reduction dims {red}")
        largest = slice_sizes(op_plan.sizes, dict(op_plan.unit_elems), op_plan.split_map)
        if math.prod(largest.values()) * op_plan.cores < math.prod(op_plan.sizes.values()):
            raise PlanningError(f"op {op_plan.name!r}: slices do not cover the iteration space")
    for b in result.buffers:
        if b.offset % target.alignment:
            raise PlanningError(f"tensor {b.tensor!r}: {b.space} offset {b.offset} is not a "
                                f"multiple of {target.alignment}")
        if b.space == "lx" and b.end > target.scratchpad_capacity:
            raise PlanningError(f"tensor {b.tensor!r}: scratchpad bytes {b.offset}..{b.end} "
                                f"exceed the capacity {target.scratchpad_capacity}")
