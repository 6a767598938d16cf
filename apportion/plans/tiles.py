"""Tile views of a loop nest: the box of an op's iteration space per loop iteration and core.

Levels divide a dim outermost first; a dim tiled at two levels is divided twice. Core slices of
an iteration are the op plan's slices of the tile, offset to the tile's origin.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping

from apportion.errors import ExecutionError
from apportion.ir.op import Access
from apportion.plans.plan import LoopInfo, OpPlan
from apportion.plans.views import dim_slices

#: one box of an op's iteration space: dim -> (start, stop) in elements
Box = dict[str, tuple[int, int]]
#: index range (start, stop) per tensor axis
Region = tuple[tuple[int, int], ...]


def resolve_counts(counts: tuple[int | str, ...], params: Mapping[str, int] | None = None
                   ) -> tuple[int, ...]:
    """Loop counts with symbolic ones replaced by their run-time values.

    >>> resolve_counts((2, "T"), {"T": 4})
    (2, 4)
    """
    out = []
    for c in counts:
        if isinstance(c, str):
            if not params or c not in params:
                raise ExecutionError(f"symbolic loop count {c!r} needs a value: pass "
                                     f"params={{{c!r}: n}}")
            v = params[c]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ExecutionError(f"symbolic loop count {c!r} = {v!r}; must be an int >= 1")
            out.append(v)
        else:
            out.append(c)
    return tuple(out)


def iterations(counts: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Every iteration of a nest, outermost level first (the last level varies fastest).

    >>> list(iterations((2, 2)))
    [(0, 0), (0, 1), (1, 0), (1, 1)]
    """
    return itertools.product(*(range(c) for c in counts))


class LoopTree:
    """One loop of a group's nest: its depth, count, and body (op names and inner loops, in
    program order)."""

    def __init__(self, depth: int, count: int | str, items: list) -> None:
        self.depth, self.count, self.items = depth, count, items

    def names(self) -> list[str]:
        """The ops inside, at any depth."""
        out: list[str] = []
        for it in self.items:
            out += [it] if isinstance(it, str) else it.names()
        return out

    def __repr__(self) -> str:
        return f"LoopTree({self.depth}, {self.count!r}, {self.items!r})"


def loop_tree(names: tuple[str, ...] | list[str], loops: Mapping[str, LoopInfo],
              depth: int = 0) -> list[str | LoopTree]:
    """A group's ops as the body at ``depth``: an op whose loop path ends there runs in it;
    consecutive ops with the same path below it share an inner loop.

    >>> loop_tree(["a", "b", "c"], {"a": LoopInfo((0,), (2,), (("m",),)),
    ...                              "b": LoopInfo((0, 0), (2, 4), (("m",), ("n",))),
    ...                              "c": LoopInfo((0,), (2,), (("m",),))})
    [LoopTree(0, 2, ['a', LoopTree(1, 4, ['b']), 'c'])]
    """
    items: list[str | LoopTree] = []
    names = list(names)
    i = 0
    while i < len(names):
        path = loops[names[i]].group
        if len(path) == depth:
            items.append(names[i])
            i += 1
            continue
        j = i
        while j < len(names) and len(loops[names[j]].group) > depth and \
                loops[names[j]].group[:depth + 1] == path[:depth + 1]:
            j += 1
        items.append(LoopTree(depth, loops[names[i]].count[depth],
                          loop_tree(names[i:j], loops, depth + 1)))
        i = j
    return items


def tile_box(sizes: Mapping[str, int], loop: LoopInfo | None, index: tuple[int, ...],
             counts: tuple[int, ...], op: str = "") -> Box:
    """The box of the iteration space at loop ``index`` (levels ``len(index)`` and deeper whole).

    ``sizes`` are the op's whole dims. Raises ExecutionError when a count does not divide.

    >>> loop = LoopInfo((0, 0), (2, 4), (("m",), ("n",)))
    >>> tile_box({"m": 1024, "n": 4096}, loop, (1, 3), (2, 4))
    {'m': (512, 1024), 'n': (3072, 4096)}
    >>> tile_box({"m": 1024, "n": 4096}, loop, (1,), (2, 4))
    {'m': (512, 1024), 'n': (0, 4096)}
    """
    box = {d: (0, n) for d, n in sizes.items()}
    if loop is None:
        return box
    for level, i in enumerate(index):
        for d in loop.tiled_dims[level]:
            lo, hi = box[d]
            if (hi - lo) % counts[level]:
                raise ExecutionError(
                    f"op {op!r}: loop level {level} count {counts[level]} (symbolic "
                    f"{loop.count[level]!r}) does not divide dim {d!r} of size {hi - lo}"
                    if isinstance(loop.count[level], str) else
                    f"op {op!r}: loop level {level} count {counts[level]} does not divide dim "
                    f"{d!r} of size {hi - lo}")
            step = (hi - lo) // counts[level]
            box[d] = (lo + i * step, lo + (i + 1) * step)
    return box


def core_boxes(op_plan: OpPlan, tile: Box) -> list[Box | None]:
    """Core id -> its box of ``tile`` (None for a core whose slice is empty).

    The plan's splits cut the tile as ``views.core_slices`` cuts the planned iteration space;
    a core gets nothing only when a symbolic count made the tile smaller than planned.

    >>> from apportion.plans.plan import OpPlan
    >>> p = OpPlan("e", "exp", "pointwise", (("i", 4),), (), (), (("i", 1),), (("i", 2),),
    ...            1.0, 0.0, ())
    >>> core_boxes(p, {"i": (8, 12)})
    [{'i': (8, 10)}, {'i': (10, 12)}]
    """
    per, splits = dict(op_plan.unit_elems), op_plan.split_map
    dims = [d for d, _ in op_plan.iteration_space]
    for d in dims:
        n = tile[d][1] - tile[d][0]
        if n % per[d] and n != op_plan.sizes[d]:
            raise ExecutionError(f"op {op_plan.name!r}: a tile of {n} elements of dim {d!r} is "
                                 f"not whole planning units of {per[d]}")
    per_dim = [[(tile[d][0] + lo, tile[d][0] + hi)
                for lo, hi in dim_slices(tile[d][1] - tile[d][0], per[d], splits[d])]
               for d in dims]
    out: list[Box | None] = []
    for combo in itertools.product(*per_dim):
        box = dict(zip(dims, combo, strict=True))
        out.append(None if any(hi <= lo for lo, hi in combo) else box)
    return out


def points(box: Box) -> int:
    return math.prod(hi - lo for lo, hi in box.values())


def region(access: Access, box: Mapping[str, tuple[int, int]]) -> Region:
    """Index range per tensor axis that ``access`` touches over ``box`` (its bounding box).

    >>> region(Access.parse("x[m, 128*h+d, 0]"), {"m": (0, 4), "h": (1, 2), "d": (0, 128)})
    ((0, 4), (128, 256), (0, 1))
    """
    out = []
    for e in access.index:
        lo = e.const + sum(c * box[d][0] for d, c in e.terms)
        hi = e.const + sum(c * (box[d][1] - 1) for d, c in e.terms) + 1
        out.append((lo, hi))
    return tuple(out)


def inside(inner: Region, outer: Region) -> bool:
    """True when every axis range of ``inner`` lies within ``outer``'s."""
    return all(o[0] <= i[0] and i[1] <= o[1] for i, o in zip(inner, outer, strict=True))
