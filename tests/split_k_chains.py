"""Shared by the split-K select chain tests: a matmul over a run-time K whose chain picks more
slices than the target has cores, the targets it is planned for (spyre at 8 and 32 cores with
the gpu resolver, the gpu target cut to 8 and 32 cores), and a user chain whose slices divide
unevenly over the cores."""

from __future__ import annotations

import dataclasses
from typing import Any

import apportion as ap
from apportion.frontend.json_format import from_dict
from apportion.planned import PlannedProgram
from apportion.target.split_k import Case, ReductionShape, SelectChain
from apportion.target.target import Target

#: K sizes a run binds: two the chain cuts into 128 slices (more than 8 or 32 cores), and one no
#: power-of-two slice count of whole sticks divides (left whole)
SIZES = (4096, 40960, 3000)
#: (preset, cores) the chains are planned for
TARGETS = (("spyre", 8), ("spyre", 32), ("gpu", 8), ("gpu", 32))


def matmul_doc(k_max: int = 65536, m: int = 32, n: int = 32) -> dict[str, Any]:
    """``y[m, n] = x[m, K] @ w[K, n]`` in float32 with K known only at run time."""
    return {"name": "chain_mm", "symbols": {"K": {"max": k_max}},
            "tensors": {"x": {"shape": [m, "K"], "dtype": "float32"},
                        "w": {"shape": ["K", n], "dtype": "float32"}},
            "inputs": ["x", "w"], "outputs": ["y"],
            "ops": [{"name": "mm", "op": "matmul", "out": "y[m,n]",
                     "ins": ["x[m,k]", "w[k,n]"]}]}


def static_doc(k: int, m: int = 32, n: int = 32) -> dict[str, Any]:
    """``matmul_doc`` with K fixed at ``k``."""
    doc = matmul_doc(m=m, n=n)
    del doc["symbols"]
    for t in doc["tensors"].values():
        t["shape"] = [k if d == "K" else d for d in t["shape"]]
    return doc


def target(preset: str, cores: int) -> Target:
    """The preset at ``cores`` cores, deciding split-K by IREE's GPU heuristic (spyre's own
    resolver, ``cost``, returns no chains)."""
    return dataclasses.replace(ap.targets.resolve(preset, cores), split_k="gpu")


def planned(preset: str, cores: int, k_max: int = 65536) -> PlannedProgram:
    return ap.plan(from_dict(matmul_doc(k_max)), target(preset, cores))


#: a user chain of 40 slices (K <= 20480) else 12, each of whole 32-element sticks: planned at
#: K = 23040 (12 slices, spread over 6 of 8 cores), run at 12800 its 40 slices fall 7, 7, 7, 7,
#: 6, 6 to those cores
UNEVEN = SelectChain("K", (Case(40, hi=20480, multiple=40 * 32), Case(12, multiple=12 * 32)))
UNEVEN_MAX = 23040


def uneven_resolver(shape: ReductionShape) -> SelectChain | None:
    return UNEVEN if shape.symbol == "K" else None


def planned_uneven(cores: int = 8) -> PlannedProgram:
    return ap.plan(from_dict(matmul_doc(k_max=UNEVEN_MAX)), ap.targets.spyre(cores=cores),
                   split_k=uneven_resolver)
