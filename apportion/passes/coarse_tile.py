"""Pass `coarse_tile`: loop nests around the program's tiling groups, and per-iteration sizes.

A group (``Program.tiling``) is a contiguous run of ops inside nested counted loops, outermost
first. An op at a lesser depth than the nest's runs once per iteration of the outer levels it
sits in, next to the inner loop its deeper neighbours share (consecutive ops deeper than it
share one inner loop; a shallower op between two runs of deeper ops makes two sibling inner
loops). The group may give an op its depth (``TilingGroup.depths``); otherwise the planner places
it (``placed_depths``): at most as deep as the innermost level tiling one of its dims, and out of
a reduction's loop when it reads that reduction's accumulator (a matmul tiled over M then K,
then an add of its result: the add runs once per M tile, after the K loop). At a level an op is
tiled on the level's dims it has, and an op without any of them that stays in it (the outer
level, or one its neighbours share) computes the same box every iteration of that level
(redundant work, never a wrong value: its inputs do not change along that level). Levels divide
a dim outermost first, so a dim tiled at two levels is divided twice.

One loop variable steps the dims of a level that different ops use. An op that has two (or more)
of one level's dims gets them one after the other: the level's loop steps the first, and the op
alone runs an inner loop of the same count over the next, so it computes every pair of tiles,
not only the diagonal. From there on the op's loops are its own (its path leaves its
neighbours').

Every op has its own chain of loops (``LoopInfo``: counts and tiled dims per level it sits in, and
its path ``[g, i1, i2, ...]``: ``g`` the group's index in ``tiling``, ``ik`` which loop at depth
``k`` among the siblings inside its parent, in program order). Two ops share a loop when their
paths agree up to its depth.

A fallback op (one core, whole) may sit in a loop. It runs on one core every iteration, whole
along the dims it works on: one along the last axis of its input (sort, cumsum, flip) is tiled on
its other dims only, and a whole-tensor fallback (gather, full, ...) on none (where a level tiles
such a dim the fallback computes all of it each iteration: redundant, never wrong). A reader in
the group must be tiled like its producer on the loops they share, so a fallback that would need
the whole of a tensor the loop makes one tile at a time is an error naming both.

A tile smaller than one stick is allowed where the hardware allows it: for a dim that is a stick
dim only of what the op reads (a load of part of a stick), and for a dim of an output that lives
only inside the op's loop (not a program output, read only by ops in that loop, not
accumulated): each iteration writes its own tile buffer, padded to whole sticks, which the
scratchpad plan sizes as such. A tile boundary inside a stick of a tensor written whole (two
iterations would write one stick) is an error naming the op, the dim and the stick.

Tiling a reduction dim makes the op accumulate: its output is an accumulator over the loops
outside the one tiling the reduction (see pass ``buffers``), complete only after that loop, so
an op of the group may read it only from outside that loop (at a lesser depth, where the planner
places a reader whose dims allow it).
``argmax`` tiled over its reduction dims is not supported (its accumulator would need indices).

Symbolic counts are run-time parameters. Plan time cannot know the tile, so a dim tiled by a
symbolic count is planned at the count's *smallest value*: the least count from its lower bound
(``LoopLevel.min``, default 1) up to its upper bound (``max``, default the target's
``max_loop_count``) that divides every dim of the level into whole sticks. Larger counts give
smaller tiles, so every span, scratchpad offset and per-core slice planned then bounds what any
count a run may take gives. A count without bounds is planned at 1, the whole range per
iteration. The count stays named in the plan, with its bounds and the value it was planned at
(``GroupPlan.symbolic``); execution takes its value and refuses one below the planned value or
above the bound, or one that does not divide the dim into whole sticks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from apportion.errors import PlanningError, ProgramError
from apportion.ir.kinds import KINDS
from apportion.ir.op import Op
from apportion.ir.program import LoopLevel, Program, TilingGroup
from apportion.passes.layouts import OpLayout
from apportion.plans.plan import LoopInfo

Pairs = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class OpTile:
    """One op's place in a loop nest and its per-iteration iteration space.

    ``sizes`` are per-iteration element counts, op dims in order; a dim a symbolic count tiles
    keeps its whole size (an upper bound). ``reduction_level`` is the outermost level tiling one
    of its reduction dims (None when none is tiled).
    """

    op: str
    loop: LoopInfo
    sizes: Pairs
    reduction_level: int | None = None

    @property
    def size_map(self) -> dict[str, int]:
        return dict(self.sizes)


@dataclass(frozen=True)
class GroupTiling:
    """One tiling group: its index in the program's ``tiling``, path, ops and loop levels."""

    index: int
    path: tuple[int, ...]
    ops: tuple[str, ...]
    counts: tuple[int | str, ...]
    dims: tuple[tuple[str, ...], ...]
    tiles: tuple[OpTile, ...]
    #: per symbolic count: (name, min, max, the value its tiles were planned at)
    symbolic: tuple[tuple[str, int, int | None, int], ...] = ()

    # The indexes below are built once per group: passes ask for a tile, a position or a
    # loop's extent per op and per reader, and a scan of the group each time made planning a
    # long group quadratic in its length.

    @cached_property
    def tile_map(self) -> dict[str, OpTile]:
        """Op -> its tile (the first, as ``tile`` always answered)."""
        out: dict[str, OpTile] = {}
        for t in self.tiles:
            out.setdefault(t.op, t)
        return out

    def tile(self, op: str) -> OpTile:
        return self.tile_map[op]

    @cached_property
    def positions(self) -> dict[str, int]:
        """Op -> its index in ``ops`` (its place in the loop body)."""
        return {n: i for i, n in enumerate(self.ops)}

    @cached_property
    def _loop_extents(self) -> tuple[dict[tuple[int, ...], tuple[int, int]],
                                     dict[tuple[int, ...], tuple[int, int]]]:
        """(every prefix of an op's loop path -> first and last position of the ops under it,
        every whole path -> first and last position of the ops with exactly that path)."""
        under: dict[tuple[int, ...], tuple[int, int]] = {}
        exact: dict[tuple[int, ...], tuple[int, int]] = {}
        for i, n in enumerate(self.ops):
            path = self.tile(n).loop.group
            for k in range(len(path) + 1):
                lo, _ = under.get(path[:k], (i, i))
                under[path[:k]] = (lo, i)
            lo, _ = exact.get(path, (i, i))
            exact[path] = (lo, i)
        return under, exact

    def extent(self, path: tuple[int, ...], length: int) -> tuple[int, int]:
        """First and last position of the ops whose loop path agrees with ``path`` in its
        first ``length`` entries (``q[:length] == path[:length]``)."""
        under, exact = self._loop_extents
        key = path[:length]
        # a key shorter than ``length`` matches only a path equal to it, not one it prefixes
        return under[key] if len(key) == length else exact[key]


@dataclass(frozen=True)
class Tiling:
    """The result of ``coarse_tile``: every group and the tile of every grouped op."""

    groups: tuple[GroupTiling, ...]

    @cached_property
    def group_map(self) -> dict[str, GroupTiling]:
        """Op -> the first group holding it, built once (asked per op and per reader)."""
        out: dict[str, GroupTiling] = {}
        for g in self.groups:
            for n in g.ops:
                out.setdefault(n, g)
        return out

    def group_of(self, op: str) -> GroupTiling | None:
        return self.group_map.get(op)

    def tile(self, op: str) -> OpTile | None:
        g = self.group_of(op)
        return None if g is None else g.tile(op)

    def sizes(self, op: Op) -> dict[str, int]:
        """Per-iteration sizes of ``op`` (its whole dims when it is in no loop)."""
        t = self.tile(op.name)
        return dict(op.dims) if t is None else t.size_map


class TileMemo:
    """What ``coarse_tile`` found per group, kept across programs that differ only in loop
    counts (auto-tiling's candidates: ``Program.with_group`` shares the ops and every group
    not being tried). Each candidate then costs the group tried, not the whole program, and
    raises exactly what a whole ``coarse_tile`` would, in the same order.

    Keys are object identities (the ops tuple, a group and its op list), never values: hashing
    every group per candidate would scan the program again. The memo holds the objects, so
    an identity is never reused while it is in use.
    """

    def __init__(self) -> None:
        # (ops, group ops lists) -> the first error of the per-op checks: (group index, error)
        self._ops: dict[tuple[int, ...], tuple[object, tuple[int, Exception] | None]] = {}
        # (ops, group index, group) -> its GroupTiling or the error tiling it raised
        self._groups: dict[tuple[int, int, int], tuple[object, GroupTiling | Exception]] = {}

    def op_error(self, program: Program) -> tuple[int, Exception] | None:
        members = tuple(g.ops for g in program.tiling)
        key = (id(program.ops), *(id(m) for m in members))
        found = self._ops.get(key)
        if found is None:
            found = self._ops[key] = ((program.ops, members), _op_error(program))
        return found[1]

    def group(self, program: Program, gi: int, group: TilingGroup,
              op_layouts: Mapping[str, OpLayout] | None, max_count: int | None,
              dim_symbols: Mapping[str, Mapping[str, str]] | None = None
              ) -> GroupTiling | Exception:
        key = (id(program.ops), gi, id(group))
        found = self._groups.get(key)
        if found is None:
            outcome: GroupTiling | Exception
            try:
                _check_contiguous(program, group)
                outcome = _tile_group(program, gi, group, op_layouts, max_count,
                                      dim_symbols or {})
            except (ProgramError, PlanningError) as e:
                outcome = e
            found = self._groups[key] = ((program.ops, group), outcome)
        return found[1]


def coarse_tile(program: Program, op_layouts: Mapping[str, OpLayout] | None = None,
                max_count: int | None = None, memo: TileMemo | None = None,
                dim_symbols: Mapping[str, Mapping[str, str]] | None = None) -> Tiling:
    """Loop nests of the program's tiling groups; with ``op_layouts``, tiles hold whole sticks;
    with ``max_count`` (the target's ``max_loop_count``), no integer count exceeds it.
    ``memo`` keeps each group's result for the next program differing in loop counts only
    (its ``op_layouts``, ``max_count`` and ``dim_symbols`` must be the same).
    ``dim_symbols`` (op -> dim -> symbol, ``Program.dim_symbols`` of the program before its
    run-time sizes were bound) names the dims whose size is known only at run time: their tile
    sizes are kept as expressions in ``LoopInfo.tile_sizes``, as are those of a symbolic count.

    >>> from apportion.frontend.json_format import load
    >>> t = coarse_tile(load("examples/fused.json"))
    >>> t.tile("add").loop
    LoopInfo(group=(0, 0), count=(2, 4), tiled_dims=(('m',), ('n',)))
    >>> t.tile("add").sizes
    (('m', 512), ('n', 1024))
    """
    memo = memo or TileMemo()
    first = memo.op_error(program)
    groups = []
    for gi, group in enumerate(program.tiling):
        # the per-op checks of a group come before its contiguity and tiling, as they ran
        if first is not None and first[0] == gi:
            raise first[1]
        outcome = memo.group(program, gi, group, op_layouts, max_count, dim_symbols)
        if isinstance(outcome, Exception):
            raise outcome
        groups.append(outcome)
    return Tiling(tuple(groups))


def tile_group(program: Program, index: int, op_layouts: Mapping[str, OpLayout] | None = None,
               max_count: int | None = None, memo: TileMemo | None = None,
               dim_symbols: Mapping[str, Mapping[str, str]] | None = None) -> GroupTiling:
    """Tiling group ``index`` of ``program`` alone, as ``coarse_tile`` tiles it, for a program
    whose groups' op lists are known to be valid and whose other groups are known to tile (a
    whole ``coarse_tile`` of it raises only what this raises): what an auto-tiling trial of
    that group needs, at the cost of that group."""
    outcome = (memo or TileMemo()).group(program, index, program.tiling[index], op_layouts,
                                         max_count, dim_symbols)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def _op_error(program: Program) -> tuple[int, Exception] | None:
    """The first error of the per-op checks of the tiling groups, and its group's index: an
    unknown op, one writing through a merge of dims, one in two groups (or twice in one)."""
    seen: dict[str, int] = {}
    try:
        for gi, group in enumerate(program.tiling):
            for name in group.ops:
                op = program.op(name)  # unknown ops raise, naming the valid ones
                if op.merges_output:
                    # a tile of a merged axis is contiguous only when its inner dims are
                    # whole; loop nests hold tiles as boxes of tensor axes, so such ops stay
                    # outside
                    raise ProgramError(
                        f"op {name!r} in tiling group {list(group.ops)} writes {op.out} "
                        "through a merge of dims; ops of a loop nest write one dim per axis "
                        "(leave it out of the group)")
                if name in seen:
                    why = "twice" if seen[name] == gi else f"in groups {seen[name]} and {gi}"
                    raise ProgramError(f"op {name!r} is in tiling group {list(group.ops)} "
                                       f"{why}; an op belongs to at most one loop nest")
                seen[name] = gi
    except ProgramError as e:
        return gi, e
    return None


def _check_contiguous(program: Program, group: TilingGroup) -> None:
    index = program.op_positions
    pos = [index[n] for n in group.ops]
    for a, b in zip(group.ops, group.ops[1:], strict=False):
        if index[b] < index[a]:
            raise ProgramError(f"tiling group {list(group.ops)} is not a contiguous run of ops: "
                               f"it lists {b!r} after {a!r}, but the program runs {b!r} first")
    members = set(group.ops)
    made = {program.op(n).out.tensor: n for n in group.ops}
    for i in range(min(pos), max(pos) + 1):
        other = program.ops[i]
        if other.name in members:
            continue
        reads = [a.tensor for a in other.ins if a.tensor in made]
        later = [n for n in group.ops if index[n] > i and any(
            a.tensor == other.out.tensor for a in program.op(n).ins)]
        why = ""
        if reads:
            why = f"; it reads {reads[0]!r} made by group op {made[reads[0]]!r}"
        if later:
            why += f"; group op {later[0]!r} reads its output {other.out.tensor!r}"
        if reads and later:
            why += ": a data dependence crossing the loop boundary"
        raise ProgramError(f"tiling group {list(group.ops)} is not a contiguous run of ops: "
                           f"op {other.name!r} (not in the group) sits between its ops{why}")


def _tile_group(program: Program, gi: int, group: TilingGroup,
                op_layouts: Mapping[str, OpLayout] | None, max_count: int | None,
                dim_symbols: Mapping[str, Mapping[str, str]]) -> GroupTiling:
    ops = [program.op(n) for n in group.ops]
    where = f"tiling group {list(group.ops)}"
    for level, lv in enumerate(group.loops):
        if max_count is not None and isinstance(lv.count, int) and lv.count > max_count:
            raise PlanningError(f"{where}: loop level {level} count {lv.count} exceeds the "
                                f"target's max_loop_count {max_count}")
    owner: dict[str, Op] = {}  # dim letter -> first op having it (sizes must agree)
    for op in ops:
        for d, n in op.dims:
            first = owner.setdefault(d, op)
            if first.sizes[d] != n:
                raise ProgramError(f"{where}: dim {d!r} has size {first.sizes[d]} in op "
                                   f"{first.name!r} but {n} in op {op.name!r}; ops of a group "
                                   "use one letter per dim")
    for level, lv in enumerate(group.loops):
        if len(set(lv.dims)) != len(lv.dims):
            raise ProgramError(f"{where}: loop level {level} lists a dim twice: {list(lv.dims)}")
        missing = [d for d in lv.dims if d not in owner]
        if missing:
            have = "; ".join(f"{o.name}: {', '.join(o.dim_names)}" for o in ops)
            what = "no op of the group has a dim tiled" if len(missing) == len(lv.dims) else \
                f"no op of the group has dim {missing[0]!r} tiled"
            raise ProgramError(f"{where}: {what} at loop level {level} ({list(lv.dims)}); "
                               f"op dims: {have}")
    _, planned = _divide(group, ops, owner, op_layouts, max_count)
    values = [lv.count if isinstance(lv.count, int) else planned[i]
              for i, lv in enumerate(group.loops)]
    depths = placed_depths(group, ops)
    chains = {op.name: _chain(op, group, depths[op.name]) for op in ops}
    paths = _paths(gi, group.ops, chains)
    path = (gi,) + (0,) * (len(group.loops) - 1)
    counts = tuple(lv.count for lv in group.loops)
    internal = _loop_internal(program, group, paths)
    tiles = tuple(_op_tile(op, chains[op.name], paths[op.name], counts, values, op_layouts,
                           where, dim_symbols.get(op.name, {}), op.name in internal)
                  for op in ops)
    _check_letters(program, group, ops, tiles)
    _check_reductions(program, group, ops, tiles)
    symbolic = tuple((lv.count, lv.min, lv.max, planned[i]) for i, lv in enumerate(group.loops)
                     if isinstance(lv.count, str))
    return GroupTiling(gi, path, group.ops, counts, tuple(lv.dims for lv in group.loops), tiles,
                       symbolic)


#: one loop of an op's chain: (key, group level, tiled dims); ops share a loop by equal keys
Link = tuple[tuple, int, tuple[str, ...]]


def _chain(op: Op, group: TilingGroup, depth: int) -> list[Link]:
    """The loops ``op`` sits in, outermost first: one per group level up to ``depth``, a level
    with several of its dims making one loop per dim (the first shared, the rest its own)."""
    fixed = _untiled(op)
    out: list[Link] = []
    own = False  # once the op has a loop of its own, every loop inside it is its own
    for level, lv in enumerate(group.loops[:depth]):
        # a fallback stays whole along the dims it works on: it runs over all of them on one
        # core every iteration (redundant where the level tiles them, never wrong)
        dims = [d for d in lv.dims if d in op.sizes and d not in fixed]
        parts = [(d,) for d in dims] or [()]
        for j, part in enumerate(parts):
            own = own or j > 0
            key = ("own", level, j, part) if own else ("level", level)
            out.append((key, level, part))
    return out


def placed_depths(group: TilingGroup, ops: list[Op]) -> dict[str, int]:
    """How many of the group's levels each op sits in: the depth ``depths`` gives it, else the
    depth its dims allow where that is needed or free.

    An op's dims allow the levels up to the innermost one tiling a dim it has (at least one:
    every op of a group sits in its outer level). An op that reads an accumulator inside the
    loop tiling that reduction must leave the loop, and does when its dims allow (a matmul
    tiled over M then K, then an add of its result: the add runs once per M tile, after the K
    loop). Any other op leaves the inner levels that tile none of its dims when it can do so
    without splitting a loop its neighbours share (its depth stays at least the lesser of its
    neighbours'): it computes its tile once instead of once per iteration of those levels, and
    no tensor needs a larger buffer for it.

    >>> from apportion.frontend.json_format import loads
    >>> p = loads('{"format": "apportion.program/1", "name": "t", "tensors": {'
    ...   '"x": {"shape": [64, 256], "dtype": "float32"}, '
    ...   '"w": {"shape": [256, 64], "dtype": "float32"}}, "inputs": ["x", "w"], '
    ...   '"outputs": ["y"], "ops": [{"name": "mm", "op": "matmul", "out": "h[m,n]", '
    ...   '"ins": ["x[m,k]", "w[k,n]"]}, {"name": "act", "op": "relu", "out": "y[m,n]", '
    ...   '"ins": ["h[m,n]"]}], "tiling": [{"ops": ["mm", "act"], "loops": ['
    ...   '{"count": 2, "dims": ["m"]}, {"count": 4, "dims": ["k"]}]}]}')
    >>> placed_depths(p.tiling[0], list(p.ops))
    {'mm': 2, 'act': 1}
    """
    given = dict(group.depths)
    full = len(group.loops)
    allowed = {}
    for op in ops:
        mine = set(op.sizes) - _untiled(op)
        levels = [k + 1 for k, lv in enumerate(group.loops) if mine & set(lv.dims)]
        allowed[op.name] = max(levels, default=1)
    depth = {op.name: given.get(op.name, full) for op in ops}
    fixed = set(given)
    made = {op.out.tensor: op for op in ops}
    for op in ops:
        if op.name in fixed:
            continue
        for acc in op.ins:
            prod = made.get(acc.tensor)
            level = None if prod is None else _reduction_level(prod, group, depth[prod.name])
            if level is not None and allowed[op.name] <= level:
                # it reads the accumulator only once complete: after the reduction's loop
                depth[op.name] = min(depth[op.name], allowed[op.name])
                fixed.add(op.name)
    names = [op.name for op in ops]
    changed = True
    while changed:
        changed = False
        for i, name in enumerate(names):
            if name in fixed:
                continue
            before = depth[names[i - 1]] if i > 0 else 0
            after = depth[names[i + 1]] if i + 1 < len(names) else 0
            # the loops the neighbours share go at most min(before, after) deep: staying that
            # deep keeps them one loop
            new = max(allowed[name], min(before, after))
            if new < depth[name]:
                depth[name] = new
                changed = True
    return depth


def _reduction_level(op: Op, group: TilingGroup, depth: int) -> int | None:
    """The outermost group level (of the ``depth`` ``op`` sits in) tiling one of its
    reduction dims: where it starts to accumulate (None when none is tiled)."""
    red = set(op.reduction_dims) - _untiled(op)
    return next((k for k, lv in enumerate(group.loops[:depth]) if red & set(lv.dims)), None)


def _untiled(op: Op) -> frozenset[str]:
    """Dims a loop may not tile: a fallback's along its input's last axis (or all of a
    whole-tensor fallback's)."""
    if op.kind.divisible:
        return frozenset()
    if op.kind.whole:
        return frozenset(op.sizes)
    last = op.ins[0].index[-1].single_dim if op.ins and op.ins[0].index else None
    return frozenset({last} if last else ())


def _paths(gi: int, names: tuple[str, ...], chains: Mapping[str, list[Link]]
           ) -> dict[str, tuple[int, ...]]:
    """Each op's loop path: the group index, then which sibling loop at each depth."""
    open_keys: list[tuple] = []
    open_path: list[int] = []
    children: list[int] = [0]  # loops opened so far under the open loop at each depth
    out = {}
    for name in names:
        keys = [k for k, _, _ in chains[name]]
        p = 0
        while p < min(len(keys), len(open_keys)) and keys[p] == open_keys[p]:
            p += 1
        del open_keys[p:], open_path[p:], children[p + 1:]
        for k in range(p, len(keys)):
            idx = gi if k == 0 else children[k]
            children[k] += 1
            open_keys.append(keys[k])
            open_path.append(idx)
            children.append(0)
        out[name] = tuple(open_path[:len(keys)])
    return out


def _divide(group: TilingGroup, ops: list[Op], owner: dict[str, Op],
            op_layouts: Mapping[str, OpLayout] | None, max_count: int | None
            ) -> tuple[dict[str, int], dict[int, int]]:
    """Per-iteration size of every dim letter of the group, dividing level by level, and the
    value each symbolic count is planned at (by level)."""
    where = f"tiling group {list(group.ops)}"
    sizes = {d: op.sizes[d] for d, op in owner.items()}
    planned: dict[int, int] = {}
    for level, lv in enumerate(group.loops):
        count = lv.count
        if isinstance(count, str):
            count = planned[level] = _smallest_value(where, level, lv, ops, sizes, op_layouts,
                                                     max_count)
            if count == 1:
                continue
        for d in lv.dims:
            n = sizes[d]
            if n % count:
                op = owner[d]
                raise PlanningError(f"{where}: loop level {level} count {count} does not "
                                    f"divide dim {d!r} of op {op.name!r} (size {n}"
                                    f"{'' if n == op.sizes[d] else ' after outer levels'})")
            sizes[d] = n // count
    return sizes, planned


def _smallest_value(where: str, level: int, lv: LoopLevel, ops: list[Op], sizes: dict[str, int],
                    op_layouts: Mapping[str, OpLayout] | None, max_count: int | None) -> int:
    """The smallest value symbolic count ``lv.count`` may take: from its ``min`` up to its
    ``max`` (or ``max_count``), the first dividing every dim of the level into whole units."""
    top = lv.max if lv.max is not None else max_count
    if top is not None and lv.min > top:
        raise PlanningError(f"{where}: symbolic loop count {lv.count!r} at level {level} has "
                            f"min {lv.min} above the target's max_loop_count {top}")
    dims = [d for d in lv.dims if d in sizes]
    units = {d: max([dict(op_layouts[o.name].unit_elems).get(d, 1) for o in ops if d in o.sizes]
                    or [1]) if op_layouts is not None else 1 for d in dims}
    common = math.gcd(*(sizes[d] // units[d] if sizes[d] % units[d] == 0 else 1
                        for d in dims)) if dims else 1
    c = lv.min
    while top is None or c <= top:
        if common % c == 0:
            return c
        if c > common:
            break
        c += 1
    bound = f"{lv.min}..{top}" if top is not None else f">= {lv.min}"
    raise PlanningError(f"{where}: symbolic loop count {lv.count!r} at level {level} has no "
                        f"value in {bound} dividing dims {dims} (sizes "
                        f"{[sizes[d] for d in dims]}) into whole sticks")


def _op_tile(op: Op, chain: list[Link], path: tuple[int, ...], counts: tuple[int | str, ...],
             values: list[int], op_layouts: Mapping[str, OpLayout] | None, where: str,
             symbols: Mapping[str, str], internal: bool = False) -> OpTile:
    """The op's loop info and per-iteration sizes (``counts``: each group level's count;
    ``values``: the same with a symbolic one at its planned value; ``symbols``: the op's dims
    whose size is a run-time symbol; ``internal``: its output lives only inside its loop, one
    tile at a time, so a tile may hold part of a stick of it)."""
    per = dict(op_layouts[op.name].unit_elems) if op_layouts is not None else {}
    written = set(op.out.index[-1].dims) if op.out.index else set()
    sizes = dict(op.sizes)
    for level, dims in ((lv, dims) for _, lv, dims in chain):
        count = values[level]
        for d in dims:
            n = sizes[d]
            sizes[d] = n // count
            unit = per.get(d, 1)
            if count > 1 and sizes[d] % unit and d in written and not internal:
                # a tile boundary inside a stick of a whole tensor would have two iterations
                # write one stick; a tile buffer that only its loop reads is each iteration's
                # own, padded to whole sticks
                raise PlanningError(
                    f"{where}: loop level {level} count {count} cuts dim {d!r} of op "
                    f"{op.name!r} (size {n}) into tiles of {sizes[d]} elements, not whole "
                    f"sticks of {unit}; the op writes its output {op.out.tensor!r} along that "
                    f"dim, so the count must divide its {-(-n // unit)} sticks (a tile of part "
                    "of a stick is allowed for a dim the op only reads, or for an output only "
                    "the op's own loop reads, one tile at a time: not a program output, "
                    "not read outside the loop)")
    loop = LoopInfo(path, tuple(counts[lv] for _, lv, _ in chain),
                    tuple(dims for _, _, dims in chain),
                    symbolic_tile_sizes(op, [(counts[lv], dims) for _, lv, dims in chain],
                                        symbols))
    red = set(op.reduction_dims)
    red_levels = [i for i, (_, _, dims) in enumerate(chain) if red & set(dims)]
    return OpTile(op.name, loop, tuple((d, sizes[d]) for d, _ in op.dims),
                  red_levels[0] if red_levels else None)


def _loop_internal(program: Program, group: TilingGroup, paths: Mapping[str, tuple[int, ...]]
                   ) -> frozenset[str]:
    """Ops of the group whose output lives only inside the op's own loop, one tile per
    iteration: not a program output, read only by ops of the group within that loop (at its
    depth or deeper), and not an accumulation (a tiled reduction's output outlives an iteration
    of its loop)."""
    out = set()
    for name in group.ops:
        op = program.op(name)
        if op.out.tensor in program.output_set or not op.kind.divisible:
            continue
        if set(op.reduction_dims) & {d for lv in group.loops for d in lv.dims}:
            continue
        path = paths[name]
        readers = program.consumer_map.get(op.out.tensor, ())
        if readers and all(r.name in paths and paths[r.name][:len(path)] == path
                           for r in readers):
            out.add(name)
    return frozenset(out)


def symbolic_tile_sizes(op: Op, levels: list[tuple[int | str, tuple[str, ...]]],
                        symbols: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Per-iteration sizes of ``op``'s dims that depend on a run-time value, as expressions:
    its size (a run-time symbol from ``symbols``, or the number) over the product of the
    counts of the ``levels`` (count, dims tiled) that tile it, symbolic counts by name. Dims
    whose tile size is a plain number are left out.

    >>> from apportion.frontend.json_format import loads
    >>> op = loads('{"name": "t", "tensors": {"x": {"shape": [1024, 512], "dtype": "float32"}},'
    ...   '"inputs": ["x"], "outputs": ["y"], "ops": [{"name": "e", "op": "exp", '
    ...   '"out": "y[m,n]", "ins": ["x[m,n]"]}]}').op("e")
    >>> symbolic_tile_sizes(op, [(4, ("m",)), ("T", ("n",))], {"m": "S"})
    (('m', 'S/4'), ('n', '512/T'))
    >>> symbolic_tile_sizes(op, [(2, ("m",)), ("T", ("m",))], {"m": "S"})
    (('m', 'S/(2*T)'),)
    """
    out = []
    for d, n in op.dims:
        factor, names = 1, []
        for count, dims in levels:
            if d in dims:
                if isinstance(count, str):
                    names.append(count)
                else:
                    factor *= count
        base = symbols.get(d)
        if base is None and not names:
            continue
        parts = ([str(factor)] if factor > 1 else []) + names
        if base is None:
            base = str(n)
        if not parts:
            out.append((d, base))
        elif len(parts) == 1:
            out.append((d, f"{base}/{parts[0]}"))
        else:
            out.append((d, f"{base}/({'*'.join(parts)})"))
    return tuple(out)


def common_depth(a: LoopInfo, b: LoopInfo) -> int:
    """How many loops two ops of one group share (their paths' common prefix).

    >>> common_depth(LoopInfo((0, 0), (2, 4), (("m",), ("n",))), LoopInfo((0,), (2,), (("m",),)))
    1
    """
    n = 0
    while n < min(len(a.group), len(b.group)) and a.group[n] == b.group[n]:
        n += 1
    return n


def _check_letters(program: Program, group: TilingGroup, ops: list[Op],
                   tiles: tuple[OpTile, ...]) -> None:
    """A tensor made in the group is read there with the letters its producer tiles it by, and
    tiled like it on every loop the two share (so each read lies in the producer's tile)."""
    where = f"tiling group {list(group.ops)}"
    tile_of = {t.op: t for t in tiles}
    made = {op.out.tensor: op for op in ops}
    for op in ops:
        for acc in op.ins:
            prod = made.get(acc.tensor)
            if prod is None:
                continue
            pl, rl = tile_of[prod.name].loop, tile_of[op.name].loop
            tiled = {d for dims in pl.tiled_dims for d in dims}
            for axis, (w, r) in enumerate(zip(prod.out.index, acc.index, strict=True)):
                d = w.single_dim
                if d in tiled and r.single_dim != d:
                    raise ProgramError(
                        f"{where}: op {op.name!r} reads tensor "
                        f"{acc.tensor!r} axis {axis} as {r.to_source()!r}, but its producer "
                        f"{prod.name!r} writes that axis as {d!r}, a tiled dim; tiles would not "
                        "line up (ops of a group use one letter per dim)")
            out_dims = set(prod.out.dims)
            for k in range(common_depth(pl, rl)):
                for d in pl.tiled_dims[k]:
                    if d in out_dims and d not in rl.tiled_dims[k]:
                        raise PlanningError(
                            f"{where}: op {op.name!r} reads tensor {acc.tensor!r}, which its "
                            f"producer {prod.name!r} tiles over {d!r} in the loop at depth {k} "
                            f"they share, but {op.name!r} is not tiled over {d!r} there (it "
                            "would read a whole tensor of which each iteration holds one tile)")


def _check_reductions(program: Program, group: TilingGroup, ops: list[Op],
                      tiles: tuple[OpTile, ...]) -> None:
    where = f"tiling group {list(group.ops)}"
    for op, tile in zip(ops, tiles, strict=True):
        level = tile.reduction_level
        if level is None:
            continue
        dims = [d for d in tile.loop.tiled_dims[level] if d in op.reduction_dims]
        if not op.kind.tileable_reduction:
            valid = ", ".join(sorted({k.name for k in KINDS if k.tileable_reduction}))
            raise PlanningError(f"{where}: op {op.name!r} ({op.fn}) is tiled over its reduction "
                                f"dim {dims[0]!r} at loop level {level}; tiled {op.fn} is not "
                                f"supported (tileable: {valid}); tile another dim or leave the "
                                "op out of the group")
        for inner in range(level + 1, len(tile.loop.count)):
            if not tile.loop.tiled_dims[inner]:
                lv = group.loops[min(inner, len(group.loops) - 1)]
                raise PlanningError(
                    f"{where}: op {op.name!r} accumulates over {dims[0]!r} (tiled at loop level "
                    f"{level}) but has none of the dims {list(lv.dims)} of inner "
                    f"level {inner}: it would add each tile {tile.loop.count[inner]} times")
        tile_of = {t.op: t for t in tiles}
        for reader in ops:
            rl = tile_of[reader.name].loop
            if any(a.tensor == op.out.tensor for a in reader.ins) and \
                    common_depth(tile.loop, rl) > level:
                inner = [d for ds in rl.tiled_dims[level:] for d in ds]
                if level == 0:  # every op of a group sits in its outer loop
                    fix = ""
                elif reader.name in dict(group.depths) or not inner:
                    fix = f"put {reader.name!r} at a lesser depth (after the loop), "
                else:  # it was left at the depth its dims need
                    fix = (f"{reader.name!r} has dim {inner[0]!r}, tiled inside that loop, so "
                           "it cannot run after it; ")
                raise PlanningError(
                    f"{where}: op {reader.name!r} reads {op.out.tensor!r} inside the loop over "
                    f"{dims[0]!r} (loop level {level}) in which {op.name!r} accumulates it; it "
                    f"is complete only after that loop; {fix}move it out of the group or tile "
                    "another dim")
