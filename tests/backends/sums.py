"""Programs that read through sums of three dims (``x[b, 64*a+32*c+d]``, as the rotary
embeddings of a Llama from transformers do), shared by the emitter and IREE tests: IREE 3.13
crashes on some of these maps, so the emitter reads such operands through a gather
(``mlir.forall.tensors.iree_safe_map``)."""

from __future__ import annotations

from typing import Any

import apportion as ap
from apportion.frontend.json_format import from_dict

#: a pointwise op whose first operand reads through the sum (crashed IREE 3.13 on 1 and 8 cores)
SUM3: dict[str, Any] = {
    "name": "s",
    "tensors": {"x": {"shape": [16, 128], "dtype": "float32"},
                "w": {"shape": [16, 2, 32], "dtype": "float32"}},
    "inputs": ["x", "w"], "outputs": ["y"],
    "ops": [{"name": "m", "op": "mul", "out": "y[a,b,c,d]",
             "ins": ["x[b,64*a+32*c+d]", "w[b,c,d]"], "dims": {"a": 2}}]}

_DIMS = {"a": 2, "c": 2, "d": 32}


def sums_program(split: bool = True) -> ap.Program:
    """Ops of every category reading through 64*a+32*c+d (d, a or k last), as the first operand
    where there are two: matmuls with the sum over output dims (one split-K 4 ways: partials and
    a combine) and over reduction dims (its k split over 4 cores), a sum and an argmax over a,
    an exp that IREE fuses into a mul, and a neg writing through the merge; ``split``: the
    splits, which need 4 cores."""
    tensors = {"x": [16, 128], "w": [16, 8], "z": [4, 512], "v": [2, 2, 128, 8],
               "u": [16, 2, 32], "xk": [256, 128], "wk": [256, 8]}
    return from_dict({
        "name": "sums",
        "tensors": {n: {"shape": s, "dtype": "bfloat16" if n == "v" else "float32"}
                    for n, s in tensors.items()},
        "inputs": list(tensors), "outputs": ["m", "p", "q", "s", "i", "f", "g"],
        "ops": [{"name": "mm", "op": "matmul", "out": "m[a,c,d,n]",
                 "ins": ["x[k,64*a+32*c+d]", "w[k,n]"], "dims": _DIMS},
                {"name": "sk", "op": "matmul", "out": "p[a,c,d,n]",
                 "ins": ["xk[k,64*a+32*c+d]", "wk[k,n]"], "dims": _DIMS},
                {"name": "mk", "op": "matmul", "out": "q[b,n]",
                 "ins": ["z[b,256*a+128*c+k]", "v[a,c,k,n]"]},
                {"name": "sum", "op": "sum", "out": "s[b,c,d]", "ins": ["x[b,64*a+32*c+d]"],
                 "dims": _DIMS},
                {"name": "am", "op": "argmax", "out": "i[b,c,d]",
                 "ins": ["x[b,64*a+32*c+d]"], "dims": _DIMS},
                {"name": "e", "op": "exp", "out": "e[a,b,c,d]", "ins": ["x[b,64*a+32*c+d]"],
                 "dims": _DIMS},
                {"name": "f", "op": "mul", "out": "f[a,b,c,d]", "ins": ["e[a,b,c,d]", "u[b,c,d]"]},
                {"name": "g", "op": "neg", "out": "g[b,64*a+32*c+d]",
                 "ins": ["x[b,64*a+32*c+d]"], "dims": _DIMS}],
        **({"split_k": {"sk": 4}, "work_division": {"mk": {"k": 4}}} if split else {})})


def tiled_sums_program() -> ap.Program:
    """Reads through the sum in loop nests: a pointwise pair over tiles of b and of a symbolic
    count T of a, and a sum over a accumulated over tiles of a and c."""
    return from_dict({
        "name": "tiled_sums",
        "tensors": {"x": {"shape": [16, 128], "dtype": "float32"},
                    "u": {"shape": [16, 2, 32], "dtype": "float32"}},
        "inputs": ["x", "u"], "outputs": ["e", "f", "s"],
        "ops": [{"name": "e", "op": "exp", "out": "e[a,b,c,d]", "ins": ["x[b,64*a+32*c+d]"],
                 "dims": _DIMS},
                {"name": "f", "op": "mul", "out": "f[a,b,c,d]",
                 "ins": ["x[b,64*a+32*c+d]", "u[b,c,d]"], "dims": _DIMS},
                {"name": "r", "op": "sum", "out": "s[b,c,d]", "ins": ["x[b,64*a+32*c+d]"],
                 "dims": _DIMS}],
        "tiling": [{"ops": ["e", "f"], "loops": [{"count": 2, "dims": ["b"]},
                                                 {"count": "T", "dims": ["a"]}]},
                   {"ops": ["r"], "loops": [{"count": 2, "dims": ["a"]},
                                            {"count": 2, "dims": ["c"]}]}]})


#: reads through the sum beside a run-time size M
DYNAMIC: dict[str, Any] = {
    "name": "dsums", "symbols": {"M": {"max": 64}},
    "tensors": {"x": {"shape": ["M", 128], "dtype": "float32"},
                "u": {"shape": ["M", 2, 32], "dtype": "float32"}},
    "inputs": ["x", "u"], "outputs": ["y", "s"],
    "ops": [{"name": "m", "op": "mul", "out": "y[a,t,c,d]",
             "ins": ["x[t,64*a+32*c+d]", "u[t,c,d]"], "dims": {"a": 2}},
            {"name": "r", "op": "sum", "out": "s[t,c,d]", "ins": ["x[t,64*a+32*c+d]"],
             "dims": _DIMS}]}
