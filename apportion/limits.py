"""The documented limits of the backends: what a backend refuses, each with an id, one line
saying what it cannot do, and the backends it binds.

This is the one list. ``docs/limits.md`` is rendered from it (``render``; a test keeps the two
equal), every refusal a backend makes cites one of these ids in its message (``cite``), and a
test fails when code cites an id that is not here or an id here is cited nowhere: a limit that
is lifted is deleted, so the list only shrinks.

>>> LIMITS_BY_ID["iree-host-op-in-loop-group"].backends
('iree',)
>>> cite("iree-host-op-in-loop-group")
'[limit iree-host-op-in-loop-group, docs/limits.md]'
>>> cited("op 'u' runs on the host but sits in a loop group "
...       "[limit iree-host-op-in-loop-group, docs/limits.md]").id
'iree-host-op-in-loop-group'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from apportion.errors import ApportionError, ExecutionError


@dataclass(frozen=True)
class Limit:
    """One documented limit: its id (cited by refusals), what cannot be done, the backends it
    binds, and where it is documented (apportion's own: ``docs/limits.md``; a backend another
    distribution adds documents its limits itself).

    >>> Limit("mine-static-only", "runs static programs only", ("mine",), "its README").citation
    '[limit mine-static-only, its README]'
    """

    id: str
    statement: str
    backends: tuple[str, ...]
    documented: str = "docs/limits.md"

    @property
    def citation(self) -> str:
        """The text a refusal appends to its message to name this limit."""
        return f"[limit {self.id}, {self.documented}]"


LIMITS: tuple[Limit, ...] = (
    # -- iree: the parallel IR (mlir/forall*.py) and its run (backends/iree/run.py);
    # -- openmp runs the same IR, so the emitter's limits bind it too
    Limit("iree-kind-without-mlir",
          "an op kind with no MLIR construction in the parallel IR (a pointwise body, a "
          "reducer's combine, or a fallback's construction) cannot be emitted; the kind is "
          "named", ("iree", "openmp")),
    Limit("iree-accumulate-kind",
          "a reduction tiled by a loop whose kind cannot accumulate across loop iterations "
          "(no running combine in MLIR) is not emitted", ("iree", "openmp")),
    Limit("iree-runtime-split-read",
          "a run-time split of a reduction dim (split-K over a run-time size) is emitted only "
          "where every operand reads the split dim alone, whole, through one axis",
          ("iree", "openmp")),
    Limit("iree-merged-write-destination",
          "a write through a merge of dims is emitted only where the destination holds the "
          "whole merged axis, at a static extent, cut by the loop tile into whole digits",
          ("iree", "openmp")),
    Limit("iree-host-op-in-loop-group",
          "an op IREE runs on the host between its modules that reads tensors (a kind its "
          "table lacks that has inputs: none in the registry today) cannot sit inside a loop "
          "group; random numbers, which read nothing, are made before the modules wherever "
          "they sit", ("iree",)),
    Limit("iree-host-ops-with-runtime-sizes",
          "ops IREE runs on the host between its modules that read tensors (none in the "
          "registry today) run only in programs without run-time sizes", ("iree",)),
    # -- bundle: LoopSpec/OpSpec values and the MLIR loop bundle
    Limit("bundle-emits-only",
          "the bundle backend emits LoopSpec programs and loop bundles (emit --bundle, "
          "--unrolled, --loopspec); it does not run them", ("bundle",)),
    Limit("bundle-static-sizes",
          "the loop bundle and LoopSpec launch concrete slices: a program with run-time sizes "
          "is emitted once they are bound (PlannedProgram.at, --param)", ("bundle",)),
    Limit("bundle-merged-scratchpad-tile",
          "a tensor written through a merge of dims split over cores cannot keep a scratchpad "
          "tile that loops read", ("bundle",)),
    # -- torch and dtensor: PyTorch
    Limit("needs-pytorch",
          "the torch and dtensor backends need PyTorch (the torch extra)",
          ("torch", "dtensor")),
    # -- dtensor: torch.distributed (backends/dtensor)
    Limit("dtensor-needs-mesh",
          "the dtensor backend runs sharding plans over a mesh of devices (--mesh, "
          "ap.sharding); a plan for one device's cores is not one", ("dtensor",)),
    Limit("dtensor-axes-in-mesh-order",
          "a tensor dim split over several mesh axes must list them in mesh order (DTensor "
          "nests the cuts of one dim in mesh order)", ("dtensor",)),
    # -- cuda: the parallel IR built into CUDA kernels (backends/cuda)
    Limit("cuda-needs-gpu",
          "the cuda backend runs its build on this machine's NVIDIA GPU (the driver's "
          "libcuda.so.1); without one, apportion cuda build writes the build and a GPU "
          "machine runs it (cuda run, cuda check)", ("cuda",)),
    Limit("cuda-needs-gpu-target",
          "the cuda backend runs plans whose foralls map to GPU blocks (a target with "
          "forall_mapping gpu_blocks: the gpu preset); foralls over cores make no kernels",
          ("cuda",)),
    Limit("cuda-one-device",
          "the cuda backend runs one device's plan; a program sharded over a mesh (--mesh) "
          "runs on the backends that run meshes", ("cuda",)),
)

LIMITS_BY_ID: dict[str, Limit] = {limit.id: limit for limit in LIMITS}

#: what ``cite`` writes into a refusal, and ``cited`` finds again
_CITATION = re.compile(r"\[limit ([a-z0-9-]+), docs/limits\.md\]")


def cite(limit_id: str) -> str:
    """The text a refusal appends to its message to name its documented limit (an unknown id
    raises KeyError at once: a refusal never cites a limit the docs lack).

    >>> cite("bundle-emits-only")
    '[limit bundle-emits-only, docs/limits.md]'
    """
    return LIMITS_BY_ID[limit_id].citation


def cited(message: str) -> Limit | None:
    """The documented limit an error message cites, or None (a refusal that cites none is a
    failure, not a limit).

    >>> cited("no such thing") is None
    True
    """
    found = _CITATION.search(message)
    return LIMITS_BY_ID.get(found.group(1)) if found else None


def refused(error: ApportionError) -> tuple[Limit, ...]:
    """The documented limit ``error`` cites: what a backend's ``supports`` answers when the work
    it tried itself (emitting, lowering, checking) raised ``error``. An apportion error that
    cites no limit is a bug, not a limit, and is raised again. The backend makes the attempt,
    so nothing here calls back up into it.

    >>> from apportion.errors import ExecutionError
    >>> refused(ExecutionError("no [limit bundle-emits-only, docs/limits.md]"))[0].id
    'bundle-emits-only'
    """
    limit = cited(str(error))
    if limit is None:
        raise error
    return (limit,)


class Unsupported(ExecutionError):
    """A backend refused a program up front: ``limits`` are the documented limits it hits.

    >>> e = Unsupported("bundle", "mlp", (LIMITS_BY_ID["bundle-emits-only"],))
    >>> str(e).startswith("backend 'bundle' cannot run program 'mlp': the bundle backend")
    True
    """

    def __init__(self, backend: str, program: str, limits: Sequence[Limit]) -> None:
        self.backend = backend
        self.limits = tuple(limits)
        why = "; ".join(f"{lim.statement} {lim.citation}" for lim in self.limits)
        super().__init__(f"backend {backend!r} cannot run program {program!r}: {why}")


def render() -> str:
    """``docs/limits.md``: every limit, grouped by backend, as the docs show it."""
    lines = ["# Documented limits of the backends", "",
             "Generated from `apportion/limits.py` (`python -c 'from "
             "apportion.limits import render; print(render(), end=\"\")' > "
             "docs/limits.md`); `tests/conformance/test_limits.py` keeps the two equal.", "",
             "Every refusal a backend makes cites one of these ids in its message "
             "(`[limit ID, docs/limits.md]`). A limit that is lifted is deleted here, and a "
             "test fails for an id cited in code but not listed, or listed but cited "
             "nowhere: the list only shrinks. The reference backend has none: it defines "
             "what a plan means. `apportion bench conformance` counts, on random programs, "
             "how many each backend runs and matches, and how many it refuses by which limit.",
             ""]
    names = list(dict.fromkeys(b for lim in LIMITS for b in lim.backends))
    for name in names:
        lines += [f"## {name}", "", "| id | limit |", "|---|---|"]
        lines += [f"| `{lim.id}` | {lim.statement} |" for lim in LIMITS if name in lim.backends]
        lines.append("")
    return "\n".join(lines)
