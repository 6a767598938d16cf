"""Pass `coarse_tile`: loop nests around the program's tiling groups, and per-iteration sizes.

A group (``Program.tiling``) is a contiguous run of ops inside nested counted loops, outermost
first. Every op of a group sits in every level of its nest; at a level it is tiled on the level's
dims it has, and an op without any of them computes the same box every iteration of that level
(redundant work, never a wrong value: its inputs do not change along that level). Levels divide
a dim outermost first, so a dim tiled at two levels is divided twice. One loop variable steps
all dims of a level, so a level may list several letters only when each op has at most one of
them. The group's loop path is its index in ``tiling`` then 0 per inner level: ``[g, 0, ...]``.

Tiling a reduction dim makes the op accumulate: its output is a whole-tensor accumulator (see
pass ``buffers``), complete only after the loop, so no other op of the group may read it.
``argmax`` tiled over its reduction dims is not supported (its accumulator would need indices).

Symbolic counts are run-time parameters. Plan time cannot know the tile, so a dim tiled by a
symbolic count is planned at its whole size (as if the count were 1): every span, scratchpad
offset and per-core slice planned then bounds what any count gives. The count stays named in
the plan; execution takes its value and checks that it divides the dim into whole sticks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from apportion.errors import PlanningError, ProgramError
from apportion.ir.kinds import KINDS
from apportion.ir.op import Op
from apportion.ir.program import Program, TilingGroup
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

    def tile(self, op: str) -> OpTile:
        return next(t for t in self.tiles if t.op == op)


@dataclass(frozen=True)
class Tiling:
    """The result of ``coarse_tile``: every group and the tile of every grouped op."""

    groups: tuple[GroupTiling, ...]

    def group_of(self, op: str) -> GroupTiling | None:
        return next((g for g in self.groups if op in g.ops), None)

    def tile(self, op: str) -> OpTile | None:
        g = self.group_of(op)
        return None if g is None else g.tile(op)

    def sizes(self, op: Op) -> dict[str, int]:
        """Per-iteration sizes of ``op`` (its whole dims when it is in no loop)."""
        t = self.tile(op.name)
        return dict(op.dims) if t is None else t.size_map


def coarse_tile(program: Program, op_layouts: Mapping[str, OpLayout] | None = None,
                max_count: int | None = None) -> Tiling:
    """Loop nests of the program's tiling groups; with ``op_layouts``, tiles hold whole sticks;
    with ``max_count`` (the target's ``max_loop_count``), no integer count exceeds it.

    >>> from apportion.frontend.json_format import load
    >>> t = coarse_tile(load("examples/fused.json"))
    >>> t.tile("add").loop
    LoopInfo(group=(0, 0), count=(2, 4), tiled_dims=(('m',), ('n',)))
    >>> t.tile("add").sizes
    (('m', 512), ('n', 1024))
    """
    seen: dict[str, int] = {}
    groups = []
    for gi, group in enumerate(program.tiling):
        for name in group.ops:
            program.op(name)  # unknown ops raise, naming the valid ones
            if name in seen:
                why = "twice" if seen[name] == gi else f"in groups {seen[name]} and {gi}"
                raise ProgramError(f"op {name!r} is in tiling group {list(group.ops)} {why}; "
                                   "an op belongs to at most one loop nest")
            seen[name] = gi
        _check_contiguous(program, group)
        groups.append(_tile_group(program, gi, group, op_layouts, max_count))
    return Tiling(tuple(groups))


def _check_contiguous(program: Program, group: TilingGroup) -> None:
    index = {o.name: i for i, o in enumerate(program.ops)}
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
                op_layouts: Mapping[str, OpLayout] | None, max_count: int | None) -> GroupTiling:
    ops = [program.op(n) for n in group.ops]
    where = f"tiling group {list(group.ops)}"
    for level, lv in enumerate(group.loops):
        if max_count is not None and isinstance(lv.count, int) and lv.count > max_count:
            raise PlanningError(f"{where}: loop level {level} count {lv.count} exceeds the "
                                f"target's max_loop_count {max_count}")
    for op in ops:
        if not op.kind.divisible:
            raise PlanningError(f"{where}: op {op.name!r} is a fallback ({op.kind.name}), which "
                                "runs whole on one core and cannot sit in a loop nest")
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
        for op in ops:
            both = [d for d in lv.dims if d in op.sizes]
            if len(both) > 1:
                # one loop variable steps every dim of a level: two dims of one op would only
                # ever meet on the diagonal, leaving the other tiles uncomputed
                raise ProgramError(f"{where}: op {op.name!r} has dims {both[0]!r} and "
                                   f"{both[1]!r}, both tiled at loop level {level}; a level tiles "
                                   "one dim per op (the dims of a level are the letters different "
                                   "ops use); put them at separate levels")
    tile_sizes = _divide(group, ops, owner, op_layouts)
    path = (gi,) + (0,) * (len(group.loops) - 1)
    counts = tuple(lv.count for lv in group.loops)
    tiles = tuple(_op_tile(op, group, path, counts, tile_sizes) for op in ops)
    _check_letters(program, group, ops)
    _check_reductions(program, group, ops, tiles)
    return GroupTiling(gi, path, group.ops, counts, tuple(lv.dims for lv in group.loops), tiles)


def _divide(group: TilingGroup, ops: list[Op], owner: dict[str, Op],
            op_layouts: Mapping[str, OpLayout] | None) -> dict[str, int]:
    """Per-iteration size of every dim letter of the group, dividing level by level."""
    where = f"tiling group {list(group.ops)}"
    sizes = {d: op.sizes[d] for d, op in owner.items()}
    for level, lv in enumerate(group.loops):
        if isinstance(lv.count, str):
            continue  # symbolic: planned at the size it has (see the module docstring)
        for d in lv.dims:
            n = sizes[d]
            if n % lv.count:
                op = owner[d]
                raise PlanningError(f"{where}: loop level {level} count {lv.count} does not "
                                    f"divide dim {d!r} of op {op.name!r} (size {n}"
                                    f"{'' if n == op.sizes[d] else ' after outer levels'})")
            sizes[d] = n // lv.count
            if op_layouts is None or lv.count == 1:
                continue
            for op in ops:
                # a tile boundary inside a stick would have two iterations write one stick
                per = dict(op_layouts[op.name].unit_elems).get(d, 1)
                if sizes[d] % per:
                    raise PlanningError(
                        f"{where}: loop level {level} count {lv.count} cuts dim {d!r} of op "
                        f"{op.name!r} (size {n}) into tiles of {sizes[d]} elements, not whole "
                        f"sticks of {per}; the count must divide its {-(-n // per)} sticks")
    return sizes


def _op_tile(op: Op, group: TilingGroup, path: tuple[int, ...], counts: tuple[int | str, ...],
             tile_sizes: dict[str, int]) -> OpTile:
    tiled = tuple(tuple(d for d in lv.dims if d in op.sizes) for lv in group.loops)
    red = set(op.reduction_dims)
    red_levels = [lvl for lvl, dims in enumerate(tiled) if red & set(dims)]
    sizes = tuple((d, tile_sizes[d] if any(d in t for t in tiled) else n) for d, n in op.dims)
    return OpTile(op.name, LoopInfo(path, counts, tiled), sizes,
                  red_levels[0] if red_levels else None)


def _check_letters(program: Program, group: TilingGroup, ops: list[Op]) -> None:
    """A tensor made in the group is read there with the letters its producer tiles it by."""
    tiled = {d for lv in group.loops for d in lv.dims}
    made = {op.out.tensor: op for op in ops}
    for op in ops:
        for acc in op.ins:
            prod = made.get(acc.tensor)
            if prod is None:
                continue
            for axis, (w, r) in enumerate(zip(prod.out.index, acc.index, strict=True)):
                d = w.single_dim
                if d in tiled and r.single_dim != d:
                    raise ProgramError(
                        f"tiling group {list(group.ops)}: op {op.name!r} reads tensor "
                        f"{acc.tensor!r} axis {axis} as {r.to_source()!r}, but its producer "
                        f"{prod.name!r} writes that axis as {d!r}, a tiled dim; tiles would not "
                        "line up (ops of a group use one letter per dim)")


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
        for inner in range(level + 1, len(group.loops)):
            if not tile.loop.tiled_dims[inner]:
                raise PlanningError(
                    f"{where}: op {op.name!r} accumulates over {dims[0]!r} (tiled at loop level "
                    f"{level}) but has none of the dims {list(group.loops[inner].dims)} of inner "
                    f"level {inner}: it would add each tile {group.loops[inner].count} times")
        for reader in ops:
            if any(a.tensor == op.out.tensor for a in reader.ins):
                raise PlanningError(
                    f"{where}: op {reader.name!r} reads {op.out.tensor!r} in the loop, but "
                    f"{op.name!r} makes it by accumulating over {dims[0]!r} (tiled at loop "
                    f"level {level}); it is complete only after the loop; move {reader.name!r} "
                    "out of the group or tile another dim")
