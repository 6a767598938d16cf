"""Per-core views of an op plan: which slice of each dim every core computes."""

from __future__ import annotations

import itertools

from apportion.plans.plan import OpPlan


def dim_slices(size: int, per: int, split: int) -> list[tuple[int, int]]:
    """Element ranges of ``split`` slices of a dim of ``size`` elements in units of ``per``.

    Slices hold whole units, ``floor`` or ``ceil(units / split)`` of them, larger first.

    >>> dim_slices(10, 1, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    >>> dim_slices(100, 64, 2)   # 2 sticks of 64 elements, the last padded
    [(0, 64), (64, 100)]
    """
    units = -(-size // per)
    base, extra = divmod(units, split)
    out, lo = [], 0
    for i in range(split):
        hi = lo + base + (1 if i < extra else 0)
        out.append((min(lo * per, size), min(hi * per, size)))
        lo = hi
    return out


def core_slices(plan: OpPlan) -> list[dict[str, tuple[int, int]]]:
    """Core id -> ``{dim: (start, stop)}`` in elements; core ids run row-major over the op's dims.

    >>> from apportion.plans.plan import OpPlan
    >>> p = OpPlan("e", "exp", "pointwise", (("i", 4), ("j", 128)), (), ("j",),
    ...            (("i", 1), ("j", 64)), (("i", 2), ("j", 2)), 1.0, 0.0, ())
    >>> core_slices(p)[3]
    {'i': (2, 4), 'j': (64, 128)}
    """
    dims = [d for d, _ in plan.iteration_space]
    per_dim = [dim_slices(plan.sizes[d], dict(plan.unit_elems)[d], plan.split_map[d]) for d in dims]
    return [dict(zip(dims, combo, strict=True)) for combo in itertools.product(*per_dim)]


def ring_groups(plan: OpPlan) -> list[tuple[int, ...]]:
    """The groups of cores whose partial results combine into one output slice (a split
    reduction), each a run of consecutive core ids: ring neighbours, one hop per extra slice.

    Core ids run row-major over the op's dims and a reduction dim comes after every output dim,
    so the cores splitting it are adjacent. Ops without a split reduction have none.

    >>> from apportion.plans.plan import OpPlan
    >>> p = OpPlan("mm", "matmul", "matmul", (("m", 4), ("k", 8)), ("k",), (),
    ...            (("m", 1), ("k", 1)), (("m", 2), ("k", 4)), 1.0, 0.0, ())
    >>> ring_groups(p)
    [(0, 1, 2, 3), (4, 5, 6, 7)]
    """
    if all(plan.split_map[d] == 1 for d in plan.reduction_dims):
        return []
    groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
    parallel = [d for d, _ in plan.iteration_space if d not in plan.reduction_dims]
    for core, box in enumerate(core_slices(plan)):
        groups.setdefault(tuple(box[d] for d in parallel), []).append(core)
    return [tuple(g) for g in groups.values()]
