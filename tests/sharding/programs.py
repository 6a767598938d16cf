"""Random small programs and annotations for the sharding property tests, and the fixed ones
the unroll and distributed tests share (a reduction, attention with its heads merged back)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program
from apportion.runtime.reference import random_inputs
from apportion.sharding.mesh import Mesh, parse
from apportion.sharding.spec import Sharding, candidates

#: 1-D and 2-D meshes, even and uneven against the sizes below
MESHES = ("a=2", "a=3", "a=2,b=2", "a=3,b=2")


@st.composite
def programs(draw: Any) -> Program:
    """A program of 2 to 6 ops over 2-D float32 tensors: pointwise ops (broadcasts too),
    transposes, matmuls, reductions kept as [n, 1] (a mean, an argmax giving int64 that no op
    reads), a fallback, a head-style read through a sum of dims and the heads summed or merged
    back into columns (a write through 3*h+e)."""
    size = st.integers(3, 8)
    tensors: dict[str, list[int]] = {}
    dtypes: dict[str, str] = {}
    inputs: list[str] = []
    ops: list[dict[str, Any]] = []
    made: list[str] = []

    def new_input(shape: list[int]) -> str:
        name = f"in{len(inputs)}"
        tensors[name] = shape
        inputs.append(name)
        return name

    def new_out(shape: list[int]) -> str:
        name = f"t{len(ops)}"
        tensors[name] = shape
        made.append(name)
        return name

    x = new_input([draw(size), draw(size)])
    for i in range(draw(st.integers(2, 6))):
        pool = [n for n in [*inputs, *made] if len(tensors[n]) == 2 and n not in dtypes]
        src = draw(st.sampled_from(pool))
        a, b = tensors[src]
        kind = draw(st.sampled_from(["unary", "binary", "bcast", "transpose", "matmul",
                                     "reduce", "fallback", "heads", "mean", "argmax"]))
        name = f"o{i}"
        if kind == "unary":
            fn = draw(st.sampled_from(["exp", "neg", "relu", "tanh"]))
            out = new_out([a, b])
            ops.append({"name": name, "op": fn, "out": f"{out}[i,j]", "ins": [f"{src}[i,j]"]})
        elif kind == "binary":
            same = [n for n in pool if tensors[n] == [a, b]]
            other = draw(st.sampled_from(same)) if draw(st.booleans()) else new_input([a, b])
            fn = draw(st.sampled_from(["add", "mul", "sub", "max"]))
            out = new_out([a, b])
            ops.append({"name": name, "op": fn, "out": f"{out}[i,j]",
                        "ins": [f"{src}[i,j]", f"{other}[i,j]"]})
        elif kind == "bcast":
            col = new_input([a, 1])
            out = new_out([a, b])
            ops.append({"name": name, "op": "mul", "out": f"{out}[i,j]",
                        "ins": [f"{src}[i,j]", f"{col}[i,0]"]})
        elif kind == "transpose":
            out = new_out([b, a])
            ops.append({"name": name, "op": "copy", "out": f"{out}[j,i]", "ins": [f"{src}[i,j]"]})
        elif kind == "matmul":
            n = draw(size)
            w = new_input([b, n])
            out = new_out([a, n])
            ops.append({"name": name, "op": "matmul", "out": f"{out}[i,n]",
                        "ins": [f"{src}[i,k]", f"{w}[k,n]"]})
        elif kind in ("reduce", "mean", "argmax"):
            fn = kind if kind != "reduce" else draw(st.sampled_from(["sum", "max", "min"]))
            out = new_out([a, 1])
            if fn == "argmax":
                dtypes[out] = "int64"
            ops.append({"name": name, "op": fn, "out": f"{out}[i,0]", "ins": [f"{src}[i,k]"]})
        elif kind == "fallback":
            out = new_out([a, b])
            ops.append({"name": name, "op": "cumsum", "out": f"{out}[i,j]",
                        "ins": [f"{src}[i,j]"]})
        else:  # heads: b = H * D read as y[h, i, d] = src[i, D*h + d]
            divisors = [d for d in range(2, b + 1) if b % d == 0 and b // d >= 1]
            if not divisors:
                continue
            d = draw(st.sampled_from(divisors))
            h = b // d
            out = new_out([h, a, d])
            ops.append({"name": name, "op": "copy", "out": f"{out}[h,i,d]",
                        "ins": [f"{src}[i,{d}*h+d]"], "dims": {"h": h, "d": d}})
            if draw(st.booleans()):  # back to 2-D: sum over the heads
                out2 = new_out([a, d])
                ops.append({"name": f"{name}s", "op": "sum", "out": f"{out2}[i,d]",
                            "ins": [f"{out}[h,i,d]"]})
            else:  # or merged back into columns, written through d*h+e
                out2 = new_out([a, h * d])
                ops.append({"name": f"{name}m", "op": "tanh", "out": f"{out2}[i,{d}*h+e]",
                            "ins": [f"{out}[h,i,e]"]})
    if not ops:
        out = new_out(tensors[x])
        ops.append({"name": "o0", "op": "exp", "out": f"{out}[i,j]", "ins": [f"{x}[i,j]"]})
    outputs = sorted({made[-1], *draw(st.lists(st.sampled_from(made), max_size=2))})
    return from_dict({"name": "rand", "tensors": {n: {"shape": s,
                                                      "dtype": dtypes.get(n, "float32")}
                                                  for n, s in tensors.items()},
                      "inputs": inputs, "outputs": outputs, "ops": ops})


@st.composite
def annotated(draw: Any) -> tuple[Program, Mesh, dict[str, Sharding]]:
    """A random program, a mesh and random annotations of some of its tensors."""
    program = draw(programs())
    mesh = parse(draw(st.sampled_from(MESHES)))
    ann: dict[str, Sharding] = {}
    for t in program.tensors:
        if draw(st.integers(0, 3)) == 0:
            ann[t.name] = draw(st.sampled_from(candidates(t.shape, mesh)))
    return program, mesh, ann


def reduction(fn: str, shape=(6, 10), dtype="float32", red="r[i] = x[i, k]") -> Program:
    """One reduction ``fn`` of ``x`` (of ``shape``) as ``red`` writes it."""
    out, src = (s.strip() for s in red.split("="))
    return from_dict({"name": fn, "inputs": ["x"], "outputs": ["r"],
                      "tensors": {"x": {"shape": list(shape), "dtype": dtype},
                                  "r": {"shape": [shape[0]],
                                        "dtype": "int64" if fn == "argmax" else dtype}},
                      "ops": [{"name": "r", "op": fn, "out": out, "ins": [src]}]})


def hard_inputs(p: Program) -> dict[str, np.ndarray]:
    """Random rows, then ties across devices, NaNs, signed zeros and all -inf."""
    x = random_inputs(p, 3)["x"].astype(np.float32)
    flat = x.reshape(x.shape[0], -1)
    n = flat.shape[1]  # 8 or more
    flat[0, :] = 0.5                        # all equal: the first wins
    flat[1, [2, n // 2 + 2, n - 1]] = 9.0   # a tie across devices
    flat[2, [n - 2, 5]] = np.nan            # NaN wins, the first NaN
    flat[3, :] = -0.0
    flat[3, [4, n - 1]] = 0.0               # -0 == +0: the first
    flat[4, :] = -np.inf
    flat[5, -1] = 7.0                       # the max in the last (short) shard
    return {"x": flat.reshape(x.shape).astype(p.tensor("x").dtype)}


def attention(h: int = 4, d: int = 64, t: int = 8, n: int = 64) -> Program:
    """Heads read through q[t, d*h+e] and written back merged, o[t, d*h+e]."""
    j = h * d
    return from_dict({
        "name": "attn", "inputs": ["x", "wq", "wk", "wv", "wo"], "outputs": ["y"],
        "tensors": {"x": {"shape": [t, n], "dtype": "float32"},
                    **{w: {"shape": [n, j], "dtype": "float32"} for w in ("wq", "wk", "wv")},
                    "wo": {"shape": [j, n], "dtype": "float32"}},
        "ops": [{"name": "q", "op": "matmul", "out": "q[t,j]", "ins": ["x[t,m]", "wq[m,j]"]},
                {"name": "k", "op": "matmul", "out": "k[t,j]", "ins": ["x[t,m]", "wk[m,j]"]},
                {"name": "v", "op": "matmul", "out": "v[t,j]", "ins": ["x[t,m]", "wv[m,j]"]},
                {"name": "s", "op": "matmul", "out": "s[h,t,c]",
                 "ins": [f"q[t,{d}*h+e]", f"k[c,{d}*h+e]"], "dims": {"h": h, "e": d}},
                {"name": "p", "op": "tanh", "out": "p[h,t,c]", "ins": ["s[h,t,c]"]},
                {"name": "pv", "op": "matmul", "out": f"o[t,{d}*h+e]",
                 "ins": ["p[h,t,c]", f"v[c,{d}*h+e]"], "dims": {"h": h, "e": d}},
                {"name": "proj", "op": "matmul", "out": "y[t,n]", "ins": ["o[t,j]", "wo[j,n]"]}]})


def as_float32(p: Program) -> Program:
    """``p`` with every tensor float32: a float16 sum's partials move in float32
    (``spec.partial_dtype``), so an all-reduce of them costs what a float32 one does, and a
    test of the plan a float32 model gets (Megatron's one all-reduce) reads it from this."""
    return replace(p, tensors=tuple(replace(t, dtype="float32") for t in p.tensors))
