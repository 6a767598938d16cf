"""Random small programs and annotations for the sharding property tests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from apportion.frontend.json_format import from_dict
from apportion.ir.program import Program
from apportion.sharding.mesh import Mesh, parse
from apportion.sharding.spec import Sharding, candidates

#: 1-D and 2-D meshes, even and uneven against the sizes below
MESHES = ("a=2", "a=3", "a=2,b=2", "a=3,b=2")


@st.composite
def programs(draw: Any) -> Program:
    """A program of 2 to 6 ops over 2-D float32 tensors: pointwise ops (broadcasts too),
    transposes, matmuls, reductions kept as [n, 1], a fallback, a head-style read through a sum
    of dims, and a mean."""
    size = st.integers(3, 8)
    tensors: dict[str, list[int]] = {}
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
        pool = [n for n in [*inputs, *made] if len(tensors[n]) == 2]
        src = draw(st.sampled_from(pool))
        a, b = tensors[src]
        kind = draw(st.sampled_from(["unary", "binary", "bcast", "transpose", "matmul",
                                     "reduce", "fallback", "heads", "mean"]))
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
        elif kind in ("reduce", "mean"):
            fn = "mean" if kind == "mean" else draw(st.sampled_from(["sum", "max", "min"]))
            out = new_out([a, 1])
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
            # back to 2-D: sum over the heads
            out2 = new_out([a, d])
            ops.append({"name": f"{name}s", "op": "sum", "out": f"{out2}[i,d]",
                        "ins": [f"{out}[h,i,d]"]})
    if not ops:
        out = new_out(tensors[x])
        ops.append({"name": "o0", "op": "exp", "out": f"{out}[i,j]", "ins": [f"{x}[i,j]"]})
    outputs = sorted({made[-1], *draw(st.lists(st.sampled_from(made), max_size=2))})
    return from_dict({"name": "rand", "tensors": {n: {"shape": s, "dtype": "float32"}
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
