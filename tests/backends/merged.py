"""Programs whose ops write through a merge of dims (``y[t, 64*h+d]``), shared by the emitter
tests, and plans that put such ops in loop nests (which the planner refuses)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import apportion as ap
from apportion.frontend.json_format import from_dict
from apportion.ir.op import Op
from apportion.planned import PlannedProgram

#: the example of the IR change: an exp writing y[8, 256] through 64*h+d, then its consumer
EXAMPLE: dict[str, Any] = {
    "name": "merge",
    "tensors": {"x": {"shape": [8, 4, 64], "dtype": "float32"},
                "y": {"shape": [8, 256], "dtype": "float32"},
                "z": {"shape": [8, 256], "dtype": "float32"}},
    "inputs": ["x"], "outputs": ["z"],
    "ops": [{"name": "m", "op": "exp", "out": "y[t,64*h+d]", "ins": ["x[t,h,d]"]},
            {"name": "e", "op": "neg", "out": "z[t,j]", "ins": ["y[t,j]"]}]}

_TENSORS: dict[str, tuple[list[int], str]] = {
    "x": ([8, 4, 64], "float32"), "a": ([8, 4, 128], "float16"),
    "b": ([4, 128, 64], "float16"), "r": ([4, 8, 256], "float32"),
    "q": ([2, 3, 4, 64], "bfloat16"), "u": ([8, 4, 1, 64], "float16"),
    "v": ([8, 1, 32], "float32")}

#: op name -> (op dict, the tensors it writes with their shapes and dtypes)
_OPS: dict[str, tuple[dict[str, Any], dict[str, tuple[list[int], str]]]] = {
    # pointwise, and a consumer that reads the merged tensor plainly
    "m": ({"name": "m", "op": "exp", "out": "y[t,64*h+d]", "ins": ["x[t,h,d]"]},
          {"y": ([8, 256], "float32")}),
    "e": ({"name": "e", "op": "neg", "out": "z[t,j]", "ins": ["y[t,j]"]},
          {"z": ([8, 256], "float32")}),
    # out[t, 64*h+d] = sum_k a[t,h,k] * b[h,k,d]
    "mm": ({"name": "mm", "op": "matmul", "out": "o[t,64*h+d]", "ins": ["a[t,h,k]", "b[h,k,d]"]},
           {"o": ([8, 256], "float16")}),
    # reductions writing one axis that merges two parallel dims, one beside a literal 0
    "s": ({"name": "s", "op": "sum", "out": "s[8*i+j]", "ins": ["r[i,j,k]"]},
          {"s": ([32], "float32")}),
    "mx": ({"name": "mx", "op": "max", "out": "mx[8*i+j,0]", "ins": ["r[i,j,k]"]},
           {"mx": ([32, 1], "float32")}),
    "am": ({"name": "am", "op": "argmax", "out": "am[8*i+j]", "ins": ["r[i,j,k]"]},
           {"am": ([32], "int64")}),
    # several merged axes in one output
    "two": ({"name": "two", "op": "relu", "out": "w[3*p+c,64*g+d]", "ins": ["q[p,c,g,d]"]},
            {"w": ([6, 256], "bfloat16")}),
    # size-1 digits: inside a merge, and a merge whose only other digit has size 1
    "one": ({"name": "one", "op": "copy", "out": "uo[t,64*h+64*o+d]", "ins": ["u[t,h,o,d]"]},
            {"uo": ([8, 256], "float16")}),
    "lone": ({"name": "lone", "op": "neg", "out": "vo[t,32*o+d]", "ins": ["v[t,o,d]"]},
             {"vo": ([8, 32], "float32")}),
}

#: the ops the LoopSpec simulator runs (it has no argmax kernel)
SIMULATED = ("m", "e", "mm", "s", "mx", "two", "one", "lone")


def merged_program(ops: tuple[str, ...] = tuple(_OPS), name: str = "merged",
                   **extra: Any) -> ap.Program:
    """A program of some of the merged-write ops above (all by default)."""
    chosen = [_OPS[n] for n in ops]
    written = {t: v for _, w in chosen for t, v in w.items()}
    read = {a.split("[")[0] for op, _ in chosen for a in op["ins"]}
    inputs = [t for t in _TENSORS if t in read]
    tensors = {n: {"shape": s, "dtype": d}
               for n, (s, d) in {**{t: _TENSORS[t] for t in inputs}, **written}.items()}
    outputs = [t for t in written if t not in read]
    return from_dict({"name": name, "tensors": tensors, "inputs": inputs, "outputs": outputs,
                      "ops": [op for op, _ in chosen], **extra})


def split_k_program() -> ap.Program:
    """A matmul writing its output through 64*h+d, pinned to split its reduction 4 ways (split-K:
    partial and combine ops that write through the merge too)."""
    return from_dict({
        "name": "skmerge",
        "tensors": {"a": {"shape": [4, 2, 4096], "dtype": "float16"},
                    "b": {"shape": [2, 4096, 64], "dtype": "float16"},
                    "out": {"shape": [4, 128], "dtype": "float16"}},
        "inputs": ["a", "b"], "outputs": ["out"],
        "ops": [{"name": "mm", "op": "matmul", "out": "out[t,64*h+d]",
                 "ins": ["a[t,h,k]", "b[h,k,d]"]}],
        "split_k": {"mm": 4}})


def looped_program(symbolic: bool = True) -> ap.Program:
    """Merged writes in loop nests: a tile of t (fresh each iteration, read by the next op), a
    tile of the merge's outer dim h carried out of the loop, a tiled reduction accumulating
    through a merge (reset inside the outer loop), and one over a symbolic count T (2 where not
    ``symbolic``)."""
    return from_dict({
        "name": "looped",
        "tensors": {"x": {"shape": [64, 4, 64], "dtype": "float16"},
                    "w": {"shape": [16, 4, 64, 128], "dtype": "float32"},
                    "y": {"shape": [64, 256], "dtype": "float16"},
                    "z": {"shape": [64, 256], "dtype": "float16"},
                    "y2": {"shape": [64, 256], "dtype": "float16"},
                    "s": {"shape": [16, 256], "dtype": "float32"},
                    "s2": {"shape": [16, 256], "dtype": "float32"}},
        "inputs": ["x", "w"], "outputs": ["z", "y2", "s", "s2"],
        "ops": [{"name": "m", "op": "exp", "out": "y[t,64*h+d]", "ins": ["x[t,h,d]"]},
                {"name": "e", "op": "neg", "out": "z[t,j]", "ins": ["y[t,j]"]},
                {"name": "m2", "op": "exp", "out": "y2[t,64*h+d]", "ins": ["x[t,h,d]"]},
                {"name": "r", "op": "sum", "out": "s[t,64*h+d]", "ins": ["w[t,h,d,k]"]},
                {"name": "r2", "op": "sum", "out": "s2[t,64*h+d]", "ins": ["w[t,h,d,k]"]}],
        "tiling": [{"ops": ["m", "e"], "loops": [{"count": 2, "dims": ["t"]}]},
                   {"ops": ["m2"], "loops": [{"count": 2, "dims": ["t"]},
                                             {"count": 2, "dims": ["h"]}]},
                   {"ops": ["r"], "loops": [{"count": 2, "dims": ["t"]},
                                            {"count": 2, "dims": ["k"]}]},
                   {"ops": ["r2"], "loops": [{"count": "T" if symbolic else 2, "dims": ["k"]},
                                             {"count": 2, "dims": ["h"]}]}]})


@contextmanager
def merges_allowed_in_loops() -> Iterator[None]:
    """The planner as it was before ops could write through merges: it then tiles them like
    any op (it refuses merged writes in loop nests; a plan read back may hold them)."""
    with mock.patch.object(Op, "merges_output", new=property(lambda self: False)):
        yield


def plan_in_loops(program: ap.Program, target: ap.Target) -> PlannedProgram:
    """``program`` planned with its merged-write ops in the loop nests its tiling asks for."""
    with merges_allowed_in_loops():
        return ap.plan(program, target)
