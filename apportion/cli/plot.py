"""Draw which core computes which block of one op's output."""

from __future__ import annotations

from pathlib import Path

from apportion.errors import PlanningError
from apportion.plans.plan import OpPlan
from apportion.plans.views import core_slices


def plot_op(op_plan: OpPlan, out_dims: tuple[str, ...], path: str | Path) -> Path:
    """Save a picture of the output blocks of ``op_plan`` coloured by core.

    The two innermost output dims are drawn as rows and columns; outer output dims become panels
    (at most 8). Cores that share an output block (a split reduction) are listed in it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if not out_dims:
        raise PlanningError(f"op {op_plan.name!r} has a scalar output; nothing to draw")
    dims = list(out_dims)
    rows_d, cols_d = (dims[-2], dims[-1]) if len(dims) >= 2 else (None, dims[-1])
    outer = dims[:-2]
    slices = core_slices(op_plan)
    blocks: dict[tuple, list[int]] = {}
    for core, sl in enumerate(slices):
        key = tuple(sl[d] for d in dims)
        blocks.setdefault(key, []).append(core)
    panels = sorted({k[: len(outer)] for k in blocks})[:8]
    sizes = op_plan.sizes
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    cmap = plt.get_cmap("tab20", max(op_plan.cores, 1))
    for ax, panel in zip(axes[0], panels, strict=False):
        for key, cores in blocks.items():
            if key[: len(outer)] != panel:
                continue
            (c0, c1) = key[-1]
            (r0, r1) = key[-2] if rows_d else (0, 1)
            ax.add_patch(Rectangle((c0, r0), c1 - c0, r1 - r0, facecolor=cmap(cores[0]),
                                   edgecolor="black", linewidth=0.5))
            label = ",".join(map(str, cores)) if len(cores) <= 4 else f"{cores[0]}..{cores[-1]}"
            ax.text((c0 + c1) / 2, (r0 + r1) / 2, label, ha="center", va="center", fontsize=7)
        ax.set_xlim(0, sizes[cols_d])
        ax.set_ylim(sizes[rows_d] if rows_d else 1, 0)
        ax.set_xlabel(f"{cols_d} ({sizes[cols_d]})")
        ax.set_ylabel(f"{rows_d} ({sizes[rows_d]})" if rows_d else "")
        title = ", ".join(f"{d}[{a}:{b}]" for d, (a, b) in zip(outer, panel, strict=True))
        ax.set_title(title or op_plan.name, fontsize=9)
    splits = " ".join(f"{d}:{n}" for d, n in op_plan.splits if n > 1) or "none"
    fig.suptitle(f"{op_plan.name}: {op_plan.cores} cores, splits {splits}, "
                 f"utilization {op_plan.utilization:.1%}")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
