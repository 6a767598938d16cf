"""Reductions over several dims on the ``gpu`` target, one of them (or a parallel dim) a
run-time size ``K`` declared 1..64: the shared programs of the planning test
(``tests/passes/test_split_k_families.py``) and the emitter tests (iree, openmp, cuda).

A static slice count cuts a run-time size into whole slices only at its multiples, so the
planner cuts only the static reduction dims; the emitters cut several dims of one op beside a
run-time size."""

from __future__ import annotations

import apportion as ap
from apportion.frontend.json_format import from_dict

#: sizes of K the tests run at: the bounds, an odd size, one short of the planning size
SIZES = (1, 3, 63, 64)


def _doc(name: str, tensors: dict, ins: list[str], out: str, op: str = "sum") -> dict:
    return {"name": name, "symbols": {"K": {"min": 1, "max": 64}},
            "tensors": {t: {"shape": s, "dtype": "float32"} for t, s in tensors.items()},
            "inputs": list(tensors), "outputs": ["y"],
            "ops": [{"name": "r", "op": op, "out": out, "ins": ins}]}


#: name -> the program: the run-time reduction dim first or last of two (an inner reduction:
#: the gpu walk ends at a run-time dim, so first leaves the op whole, last cuts j), an outer
#: reduction (the walk tiles the static dim and leaves K whole), a matmul over h and K, and a
#: run-time parallel dim beside two static reduction dims (both cut)
PROGRAMS = {
    "run-time first": _doc("kfirst", {"x": [8, "K", 16]}, ["x[m,k,j]"], "y[m]"),
    "run-time last": _doc("klast", {"x": [8, 16, "K"]}, ["x[m,j,k]"], "y[m]"),
    "outer": _doc("outer", {"x": ["K", 256, 4]}, ["x[k,j,m]"], "y[m]"),
    "matmul": _doc("mm2", {"x": [4, 16, "K"], "w": [16, "K", 4]},
                   ["x[m,h,k]", "w[h,k,n]"], "y[m,n]", "matmul"),
    "run-time rows": _doc("krows", {"x": ["K", 64, 32]}, ["x[m,k,j]"], "y[m]"),
}

#: name -> the reduction dims the gpu target cuts (slices each)
CUT = {"run-time first": None, "run-time last": {"j": 16}, "outer": {"j": 2},
       "matmul": {"h": 16}, "run-time rows": {"k": 64, "j": 32}}


def planned(name: str) -> ap.PlannedProgram:
    return ap.plan(from_dict(PROGRAMS[name]), ap.targets.gpu())
