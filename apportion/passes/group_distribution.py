"""Pass `group_distribution`: splits that agree across a loop group, so tiles stay on chip.

Work distribution picks each op's splits alone. Inside a coarse-tiling group that can undo the
point of tiling: an intermediate goes to the scratchpad only when every core reading it reads
what the same core wrote, which needs producer and readers cut alike. A group of `matmul`,
`silu`, `matmul` planned op by op cuts rows for one and columns for the next, and every
intermediate makes a round trip through device memory.

Under ``balanced`` this pass revisits each group. It tries group-wide assignments seeded by the
best few assignments of each of its ops (by dim name: a seed ``{t: 2, f: 16}`` gives every op
of the group 2 cuts of ``t`` and 16 of ``f`` and none elsewhere); an op for which the seed is
not valid, or is predicted slower than ``greedy`` would be on it alone (the strategy's
``group_baseline``, ``Greedy()``), keeps its own splits,
and so do pinned and fallback ops; then each op that follows goes back to its own splits where
that makes the trial cheaper. Each trial is placed by the scratchpad planner; its cost is
the sum of the ops' predicted times with the scratchpad-resident tensors costing no
device-memory traffic. The cheapest trial wins, the op-by-op splits on a tie, so a group never
gets a plan predicted slower than the one it had, and no op is predicted slower than greedy's.

Dim names only seed trials: whether a tensor really stays on chip is decided on the core boxes
of the planned ops, so two ops reusing a letter for unrelated dims cannot give a wrong plan.

The work grows linearly with a group's length. Seeds are taken in the order of the group's ops
and deduplicated (identical ops give identical seeds: their search runs once, ``PlanCache``);
a group tries at most ``SEEDS_PER_GROUP`` distinct seeds (a cap only groups of many distinct ops
reach; the trials it leaves out could only have lowered the group's time further). A trial is
evaluated incrementally (``_Trial``): sending one op back to its own splits re-measures only the
scratchpad requests of the tensors it touches, re-places from the first changed request until the
scratchpad holds what it held before, and re-prices only the ops whose splits or on-chip operands
changed; op times, scratchpad sizes and core-box checks are kept by op signature across trials
and groups. Every decision is the one evaluating each trial whole would take (where a change is
within rounding of zero the sums are redone in full, in op order), so the plan is the same, only
found faster (``align_group(..., incremental=False)`` is the whole evaluation it is tested
against).

``greedy`` reproduces the reference design, which plans ops alone; this pass leaves it as is
(its ``group_baseline`` is None: the pipeline does not run the pass).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from apportion.errors import PlanningError
from apportion.ir.op import Op
from apportion.passes.buffers import Buffers, TensorRole
from apportion.passes.coarse_tile import GroupTiling, Tiling, common_depth
from apportion.passes.geometry import OpContext, PlanCache, Splits

# Placement's own rules for one tensor, so a trial measures exactly what ``plan_group`` would:
# the bytes a tile takes on chip (or None), in-place candidates, and the placement itself.
from apportion.passes.placement import (
    Request,
    inplace_inputs,
    lifetime,
    lx_bytes,
    same_boxes,
    same_loop,
)
from apportion.passes.span_reduction import SpanSplits, op_minimum
from apportion.passes.strategy import Greedy
from apportion.passes.work_distribution import greedy, ranked
from apportion.plans.plan import OpPlan

#: best assignments of each op that seed group-wide trials (its greedy one seeds one more)
SEEDS_PER_OP = 6
#: the most distinct seeds (group-wide trials) one group tries, in the order of its ops
SEEDS_PER_GROUP = 64
#: the greedy rule each op of a group is measured against by default (``Balanced``'s
#: ``group_baseline``): the reference design's
REFERENCE = Greedy()

OpSplits = dict[str, dict[str, int]]
Key = tuple[tuple[str, int], ...]


def group_distribution(ctxs: Mapping[str, OpContext], tiling: Tiling, bufs: Buffers,
                       spans: SpanSplits, splits: Splits, cache: PlanCache | None = None,
                       baseline: Greedy = REFERENCE) -> Splits:
    """The group distribution pass: every loop group's splits after the search above, no op
    slower than ``baseline`` (a strategy's ``group_baseline``) would plan it alone.

    >>> from apportion.frontend.json_format import load
    >>> from apportion.passes.pipeline import plan
    >>> from apportion.target import spyre
    >>> stages = {}
    >>> _ = plan(load("examples/fused.json"), spyre(), debug=stages.__setitem__)
    >>> stages["group_distribution"]["add"]
    {'m': 32, 'n': 1}
    """
    cache = cache or PlanCache()
    changed: OpSplits = {}
    for group in tiling.groups:
        changed.update(align_group(group, ctxs, bufs.roles, splits, cache,
                                   baseline=baseline)[0])
    return splits.replace(changed)


def _greedy(ctx: OpContext, baseline: Greedy) -> dict[str, int] | None:
    """The op's splits alone under the greedy rule ``baseline``, or None where it finds
    none."""
    try:
        return greedy(ctx, baseline.start(op_minimum(ctx, baseline)[0]), baseline.rule)
    except PlanningError:
        return None


def group_cost(group: GroupTiling, ctxs: Mapping[str, OpContext],
               roles: Mapping[str, TensorRole], splits: Mapping[str, Mapping[str, int]],
               cache: PlanCache | None = None) -> float:
    """Predicted time of one iteration of ``group`` under ``splits``: its ops' times with the
    tensors the scratchpad planner keeps on chip costing no traffic (as the pipeline's
    ``iteration_time_us``)."""
    trial = _Trial(group, ctxs, roles, cache or PlanCache())
    return trial.start({n: dict(splits[n]) for n in group.ops})


def align_group(group: GroupTiling, ctxs: Mapping[str, OpContext],
                roles: Mapping[str, TensorRole], splits: Splits, cache: PlanCache,
                incremental: bool = True, baseline: Greedy = REFERENCE
                ) -> tuple[OpSplits, float]:
    """One group's splits (op-by-op ones unless a group-wide trial is predicted cheaper) and
    their predicted time per iteration; no op is predicted slower than the greedy rule
    ``baseline`` plans it alone. ``incremental=False`` evaluates every change whole (slow;
    the reference the incremental evaluation is tested against)."""
    first = ctxs[group.ops[0]]
    program = first.program
    # pinned and fallback ops keep their splits
    fixed = frozenset(n for n in group.ops
                      if program.pins.get(n) or not program.op(n).kind.divisible)
    own = {n: splits[n] for n in group.ops}
    greedy_splits: dict[str, dict[str, int] | None] = {}
    limits: dict[str, float] = {}
    for n in group.ops:
        ctx = ctxs[n]
        g = None if n in fixed else cache.get(("greedy", baseline, ctx.signature),
                                              lambda c=ctx: _tuple(_greedy(c, baseline)))
        greedy_splits[n] = None if g is None else dict(g)
        limits[n] = math.inf if g is None else cache.time_us(ctx, dict(g))
    trial = _Trial(group, ctxs, roles, cache, incremental)
    best, best_cost = own, trial.start(own)
    for key in _seeds(group, ctxs, fixed, greedy_splits, cache):
        seed = dict(key)
        follow = {n: None if n in fixed else _follow(ctxs[n], seed, limits[n], cache)
                  for n in group.ops}
        c = trial.start({n: own[n] if follow[n] is None else follow[n] for n in group.ops})
        # an op that gains nothing by following (a split-K reader paying its combine to
        # keep one input on chip) goes back to its own splits
        for n in group.ops:
            if trial.splits[n] != own[n]:
                c = trial.back_off(n, own[n], c)
        if c < best_cost * (1 - 1e-9):
            best, best_cost = {n: dict(s) for n, s in trial.splits.items()}, c
    return best, best_cost


def _tuple(splits: Mapping[str, int] | None) -> Key | None:
    return None if splits is None else tuple(splits.items())


def _seeds(group: GroupTiling, ctxs: Mapping[str, OpContext], fixed: frozenset[str],
           greedy_splits: Mapping[str, dict[str, int] | None], cache: PlanCache) -> list[Key]:
    """The group's distinct seeds, in the order of its ops (each op's greedy splits, then its
    best few), at most ``SEEDS_PER_GROUP``; identical ops are asked once."""
    keys: dict[Key, None] = {}
    asked: set[object] = set()
    for name in group.ops:
        ctx = ctxs[name]
        if name in fixed or ctx.signature in asked:
            continue
        asked.add(ctx.signature)
        mine = greedy_splits[name]
        best = cache.get(("ranked", ctx.signature, SEEDS_PER_OP), lambda c=ctx: tuple(
            tuple(s.items()) for s in ranked(c, {d: 1 for d in c.sizes}, SEEDS_PER_OP)))
        for seed in [*([mine] if mine else []), *map(dict, best)]:
            keys.setdefault(tuple(sorted((d, c) for d, c in seed.items() if c > 1)))
            if len(keys) == SEEDS_PER_GROUP:
                return list(keys)
    return list(keys)


def _follow(ctx: OpContext, seed: dict[str, int], limit: float, cache: PlanCache
            ) -> dict[str, int] | None:
    """The seed's cuts on the op's own dims, or None when not valid or slower than ``limit``."""
    s = {d: seed.get(d, 1) for d in ctx.sizes}
    ok = cache.get(("valid", ctx.signature, tuple(s.items())), lambda: ctx.valid(s))
    if not ok or cache.time_us(ctx, s) > limit * (1 + 1e-9):
        return None
    return s


class _Merged(Mapping[int, "Request | None"]):
    """The requests of a trial with some replaced (by position)."""

    def __init__(self, base: list[Request | None], changed: dict[int, Request | None]) -> None:
        self.base, self.changed = base, changed

    def __getitem__(self, j: int) -> Request | None:
        return self.changed[j] if j in self.changed else self.base[j]

    def __len__(self) -> int:
        return len(self.base)

    def __iter__(self):
        return iter(range(len(self.base)))


@dataclass
class _Step:
    """A proposed change of a trial: new requests, placements and op times, not yet kept."""

    requests: dict[int, Request | None]
    live: dict[int, dict[str, tuple[int, int]]]
    placed: dict[str, bool]
    times: dict[int, float]


class _Trial:
    """One group-wide assignment under evaluation: each op's splits, the scratchpad requests
    of the group's tiles, the placement step by step, and each op's predicted time.

    ``start`` evaluates an assignment whole; ``back_off`` tries one op's own splits instead and
    keeps them when the group gets cheaper, re-evaluating only what that op touches.
    """

    def __init__(self, group: GroupTiling, ctxs: Mapping[str, OpContext],
                 roles: Mapping[str, TensorRole], cache: PlanCache,
                 incremental: bool = True) -> None:
        self.group, self.ctxs, self.roles, self.cache = group, ctxs, roles, cache
        self.incremental = incremental
        first = ctxs[group.ops[0]]
        self.program, self.target = first.program, first.target
        self.capacity = self.target.scratchpad_capacity
        self.symbolic = any(isinstance(c, str) for c in group.counts)
        ops = group.ops
        self.pos = {n: i for i, n in enumerate(ops)}
        self.op: list[Op] = [self.program.op(n) for n in ops]
        self.made = made = {o.out.tensor: i for i, o in enumerate(self.op)}
        # per position: the tile it makes (None: not a tile), its readers and last reader
        self.tile: list[str | None] = []
        self.readers: list[tuple[int, ...]] = []
        self.begin: dict[str, int] = {}
        self.end: dict[str, int] = {}
        # per position: the loops it sits in and its buffer's depth (what placement reads)
        self.loops: list[tuple] = []
        for i, o in enumerate(self.op):
            role = roles[o.out.tensor]
            inside = tuple(self.pos[r] for r in role.inside)
            self.readers.append(inside)
            self.tile.append(o.out.tensor if role.role == "tile" else None)
            if role.role == "tile":
                self.begin[o.out.tensor], self.end[o.out.tensor] = lifetime(
                    group, roles, o.out.tensor)
            else:
                self.begin[o.out.tensor] = self.end[o.out.tensor] = i
            loop = group.tile(o.name).loop
            self.loops.append((loop.count, loop.tiled_dims, role.depth, tuple(
                common_depth(loop, group.tile(ops[r]).loop) for r in inside)))
        # producers (positions in the group) of each op's inputs
        self.inputs: list[tuple[int, ...]] = [
            tuple(dict.fromkeys(made[a.tensor] for a in o.ins if a.tensor in made))
            for o in self.op]
        self.inplace = [inplace_inputs(o, self.program) for o in self.op]
        self.sig = [ctxs[n].signature for n in ops]
        # per position: where its readers read its tile (slot of the tensor in each reader)
        self.reads = [tuple(ctxs[ops[r]].slots.index(o.out.tensor) for r in self.readers[i])
                      for i, o in enumerate(self.op)]
        self._plans: dict[tuple[int, tuple], OpPlan] = {}
        self.splits: dict[str, dict[str, int]] = {}
        self.key: list[tuple] = []
        self.requests: list[Request | None] = []
        self.live: list[dict[str, tuple[int, int]]] = []
        self.placed: set[str] = set()
        self.times: list[float] = []

    # --- measures, kept across trials --------------------------------------------------------

    def _plan(self, i: int, key: tuple) -> OpPlan:
        """An op plan of op ``i`` under splits ``key``, as far as placement reads one."""
        p = self._plans.get((i, key))
        if p is None:
            ctx = self.ctxs[self.group.ops[i]]
            p = self._plans[(i, key)] = OpPlan(
                ctx.op.name, ctx.op.fn, ctx.op.category.value, tuple(ctx.sizes.items()),
                ctx.op.reduction_dims, ctx.layout.stick_dims, ctx.layout.unit_elems, key, 0.0,
                0.0, ())
        return p

    def _request(self, i: int, key: list[tuple], requests: Mapping[int, Request | None]
                 ) -> Request | None:
        """Op ``i``'s scratchpad request under splits ``key`` (``requests``: those of the ops
        before it, by position), as ``plan_group`` makes it."""
        t = self.tile[i]
        if t is None:
            return None
        readers = self.readers[i]
        sig = self.sig
        # what the bytes depend on: producer and readers (structure, splits, where they read)
        lk = ("lx", sig[i], key[i], self.symbolic, self.loops[i],
              tuple(zip((sig[r] for r in readers), self.reads[i], (key[r] for r in readers),
                        (self.loops[r][:2] for r in readers), strict=True)))

        def measure() -> int | None:
            plans = {self.group.ops[j]: self._plan(j, key[j]) for j in (i, *readers)}
            return lx_bytes(self.op[i], [self.op[r] for r in readers], plans, self.program,
                            self.target, self.symbolic, self.group,
                            self.roles[self.op[i].out.tensor].depth)

        nbytes = self.cache.get(lk, measure)
        if nbytes is None:
            return None
        lx_inputs = []
        for x in self.inplace[i]:
            j = self.made.get(x)
            if j is None or j >= i or requests[j] is None or \
                    not same_loop(self.group, self.roles, x, self.op[i]):
                continue

            def boxes_match(j: int = j, x: str = x) -> bool:
                plans = {self.group.ops[m]: self._plan(m, key[m]) for m in (i, j)}
                return same_boxes(self.program, x, self.op[i], plans)

            if self.cache.get(("boxes", sig[i], key[i], sig[j], key[j]), boxes_match):
                lx_inputs.append(x)
        return Request(t, self.begin[t], self.end[t], nbytes, tuple(lx_inputs))

    def _time(self, i: int, changed: Mapping[str, bool] | None = None) -> float:
        """Op ``i``'s predicted time under its splits, its operands on chip where placed
        (``changed``: placements that differ from the trial's)."""
        n = self.group.ops[i]
        placed, changed = self.placed, changed or {}
        return self.cache.time_us(self.ctxs[n], self.splits[n], frozenset(
            a.tensor for a in self.op[i].operands
            if changed.get(a.tensor, a.tensor in placed)))

    def _place(self, i: int, live: dict[str, tuple[int, int]], r: Request) -> bool:
        """``placement.place``'s step for request ``r`` on the live tiles; True if placed."""
        end = self.end
        for t in [t for t in live if end[t] < r.start]:
            del live[t]
        reuse = next((t for t in r.inplace if t in live and end[t] == r.start
                      and live[t][1] >= r.nbytes), None)
        if reuse is not None:  # the input dies at this op: write the output over it
            live[r.tensor] = (live.pop(reuse)[0], r.nbytes)
            return True
        gaps, at = [], 0
        for off, n in sorted(live.values()):
            if off > at:
                gaps.append((off - at, at))
            at = max(at, off + n)
        fitting = [(size, off) for size, off in gaps if size >= r.nbytes]
        if fitting:
            live[r.tensor] = (min(fitting)[1], r.nbytes)
        elif self.capacity - at >= r.nbytes:
            live[r.tensor] = (at, r.nbytes)
        else:
            return False
        return True

    # --- evaluation ---------------------------------------------------------------------------

    def start(self, splits: Mapping[str, Mapping[str, int]]) -> float:
        """Evaluate ``splits`` whole; its predicted time per iteration."""
        ops = self.group.ops
        self.splits = {n: dict(splits[n]) for n in ops}
        self.key = [tuple(self.splits[n].items()) for n in ops]
        self.requests, self.live, self.placed = [], [], set()
        live: dict[str, tuple[int, int]] = {}
        for i in range(len(ops)):
            r = self._request(i, self.key, self.requests)  # type: ignore[arg-type]
            self.requests.append(r)
            if r is not None and self._place(i, live, r):
                self.placed.add(r.tensor)
            self.live.append(dict(live))
        self.times = [self._time(i) for i in range(len(ops))]
        return sum(self.times)

    def back_off(self, name: str, splits: dict[str, int], cost: float) -> float:
        """Give op ``name`` ``splits`` if that lowers the trial's ``cost``; the cost after."""
        if not self.incremental:
            before = {n: dict(s) for n, s in self.splits.items()}
            c_back = self.start({**before, name: splits})
            if c_back < cost:
                return c_back
            return self.start(before)
        i = self.pos[name]
        step = self._change(i, tuple(splits.items()))
        old = [self.times[j] for j in step.times]
        delta = sum(step.times.values()) - sum(old)
        if abs(delta) <= 1e-10 * abs(cost):  # within rounding: decide on the full sums
            times = list(self.times)
            for j, t in step.times.items():
                times[j] = t
            c_back = sum(times)
            if not c_back < cost:
                return cost
        elif delta >= 0:
            return cost
        self._keep(i, splits, step)
        return sum(self.times)

    def _change(self, i: int, key_i: tuple) -> _Step:
        """What giving op ``i`` splits ``key_i`` changes (requests, placement, times)."""
        key = list(self.key)
        key[i] = key_i
        touched = {i, *self.inputs[i], *self.readers[i]}
        requests: dict[int, Request | None] = {}
        merged = _Merged(self.requests, requests)
        queue = sorted(touched)
        done: set[int] = set()
        while queue:  # positions in increasing order: a request reads only earlier ones
            j = queue.pop(0)
            if j in done:
                continue
            done.add(j)
            r = self._request(j, key, merged)
            if r != self.requests[j]:
                requests[j] = r
                if (r is None) != (self.requests[j] is None):  # in-place choices of readers
                    queue = sorted({*queue, *(k for k in self.readers[j] if k not in done)})
        live: dict[int, dict[str, tuple[int, int]]] = {}
        placed: dict[str, bool] = {}
        if requests:
            lo, hi = min(requests), max(requests)
            state = dict(self.live[lo - 1]) if lo else {}
            for j in range(lo, len(self.requests)):
                r = requests[j] if j in requests else self.requests[j]
                was = self.requests[j]
                if was is not None and (r is None or r.tensor != was.tensor):
                    placed[was.tensor] = False
                if r is not None:
                    placed[r.tensor] = self._place(j, state, r)
                live[j] = dict(state)
                if j >= hi and state == self.live[j]:
                    break
            placed = {t: p for t, p in placed.items() if p != (t in self.placed)}
        ops = {i}
        for t in placed:
            j = self._producer_pos(t)
            ops.add(j)
            ops.update(self.readers[j])
        name = self.group.ops[i]
        saved = self.splits[name]
        self.splits[name] = dict(key_i)
        times = {j: self._time(j, placed) for j in sorted(ops)}
        self.splits[name] = saved
        return _Step(requests, live, placed, times)

    def _producer_pos(self, tensor: str) -> int:
        return self.made[tensor]

    def _keep(self, i: int, splits: dict[str, int], step: _Step) -> None:
        name = self.group.ops[i]
        self.splits[name] = dict(splits)
        self.key[i] = tuple(splits.items())
        for j, r in step.requests.items():
            self.requests[j] = r
        for j, state in step.live.items():
            self.live[j] = state
        for t, p in step.placed.items():
            if p:
                self.placed.add(t)
            else:
                self.placed.discard(t)
        for j, t in step.times.items():
            self.times[j] = t
