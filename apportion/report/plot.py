"""Draw which core computes which block of one op's output."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from apportion.errors import ApportionError, PlanningError
from apportion.plans.plan import OpPlan, Plan
from apportion.plans.views import core_slices


class PlotError(ApportionError):
    """The plot cannot be written: a format matplotlib lacks, or the file cannot be saved."""


def plot_formats() -> dict[str, str]:
    """The file extensions matplotlib can write here (without the dot), with their names."""
    from matplotlib.figure import Figure

    return dict(sorted(Figure().canvas.get_supported_filetypes().items()))


def is_plot_file(text: str) -> bool:
    """Whether ``--plot TEXT`` names a picture file rather than a folder: a path with an
    extension that is not an existing folder nor ends in a separator (``plots/``)."""
    path = Path(text)
    return bool(path.suffix) and not path.is_dir() and not text.endswith(("/", os.sep))


def plot_file_name(op: str) -> str:
    """The picture of op ``op`` in a ``--plot DIR`` folder: ``OP.png`` (a separator in the
    name becomes ``_``)."""
    return op.replace("/", "_").replace(os.sep, "_") + ".png"


#: tab20's ten dark hues, then its ten light ones: neighbours in this order never share a hue
_TAB20_ORDER = (*range(0, 20, 2), *range(1, 20, 2))


def core_colour(core: int) -> tuple[float, float, float, float]:
    """The fill colour of ``core``'s blocks: 20 colours in turn, so that adjacent cores (ring
    neighbours, the blocks of one split reduction) never share one."""
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    r, g, b, a = cmap(_TAB20_ORDER[core % len(_TAB20_ORDER)])
    return float(r), float(g), float(b), float(a)


def check_plot_path(path: Path, option: str = "--plot") -> Path:
    """``path`` if matplotlib can write a picture there in the format its extension names.

    Checked before any planning. matplotlib picks the format from the extension (any case);
    ``.pgf`` also needs the TeX program matplotlib runs to measure text.
    """
    formats = plot_formats()
    valid = ", ".join(f".{e}" for e in formats)
    ext = path.suffix[1:].lower()
    if not ext:
        raise PlotError(f"{option} {str(path)!r} has no file extension; "
                        f"give one of {valid}")
    if ext not in formats:
        raise PlotError(f"{option} {str(path)!r}: matplotlib cannot write {path.suffix!r} "
                        f"files; valid extensions: {valid}")
    if ext == "pgf":
        import matplotlib

        tex = matplotlib.rcParams["pgf.texsystem"]
        if shutil.which(tex) is None:
            raise PlotError(f"{option} {str(path)!r}: .pgf needs {tex!r}, which is not "
                            "installed; pick another extension, such as .pdf or .png")
    return path


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
    for ax, panel in zip(axes[0], panels, strict=False):
        for key, cores in blocks.items():
            if key[: len(outer)] != panel:
                continue
            (c0, c1) = key[-1]
            (r0, r1) = key[-2] if rows_d else (0, 1)
            ax.add_patch(Rectangle((c0, r0), c1 - c0, r1 - r0, facecolor=core_colour(cores[0]),
                                   edgecolor="black", linewidth=0.5))
            # cores sharing a block combine partial sums as ring neighbours (consecutive ids)
            label = (",".join(map(str, cores)) if len(cores) <= 4 else
                     f"{cores[0]}..{cores[-1]}") + (" ring" if len(cores) > 1 else "")
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
    return _save(fig, plt, path)


def plot_utilization(plan: Plan, path: str | Path) -> Path:
    """Save a picture of every op's utilization in program order, coloured by op family, with
    its predicted time on a second axis: where along a model the cores sit idle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = ("matmul", "pointwise", "reduction", "layout", "fallback")
    colours = dict(zip(families, ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red"),
                       strict=True))
    fam = [o.kind.split(" ", 1)[0] for o in plan.ops]
    xs = range(len(plan.ops))
    fig, ax = plt.subplots(figsize=(max(6.0, min(24.0, len(plan.ops) * 0.08)), 4))
    ax.bar(xs, [o.utilization * 100 for o in plan.ops], width=1.0,
           color=[colours.get(f, "grey") for f in fam])
    ax.set_xlabel("op (program order)")
    ax.set_ylabel("utilization %")
    ax.set_ylim(0, 100)
    time_ax = ax.twinx()
    time_ax.plot(xs, [o.predicted_time_us for o in plan.ops], color="black", linewidth=0.7)
    time_ax.set_ylabel("predicted us")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[f]) for f in families if f in fam]
    ax.legend(handles, [f for f in families if f in fam], loc="upper right", fontsize=7)
    ax.set_title(f"{plan.program}: utilization along the program ({plan.cores} cores, "
                 f"{plan.strategy})", fontsize=9)
    fig.tight_layout()
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: str | Path) -> Path:
    out = Path(path)
    try:
        fig.savefig(out, dpi=110)
    except (OSError, RuntimeError, ValueError) as e:  # permissions, a full disk, no TeX
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise PlotError(f"cannot write plot {str(out)!r}: {reason}") from None
    finally:
        plt.close(fig)
    return out
