"""Random sharded cases for conformance testing: a random program, a random mesh of 1 or 2 axes
(sizes 2 to 4, a symbolic axis bound at run sometimes), random annotations, and whether the
strategy search or propagation completes them.

The generator draws from a ``random_programs.Draw`` as the program families do: ``tests`` pass
one over hypothesis's ``draw``, ``apportion bench conformance`` one over a seeded
``random.Random`` (``mesh_case(seed)`` gives mesh case ``seed`` back). The program is one of
``random_programs.random_case`` (bound at its run-time sizes: a sharding needs static shapes) or
of ``sharded``, a family made for meshes (matmuls whose contraction a split makes partial,
means and argmaxes finished across devices, transposes and heads that move a split from one dim
to another), so that over the seeds every resharding step (``all_gather``, ``all_reduce``,
``reduce_scatter``, ``all_to_all``, ``slice``) and both finishes (a mean's scale, an argmax's
keys) occur.

A case is plain data (a mesh spec, annotations as axis names per dim), as the program file's
``"shardings"`` field and ``--mesh`` hold them: the frontend sits below the sharding layer, so
the caller builds the mesh (``sharding.mesh.parse``) and the shardings (``Sharding``). Every
annotation splits a dim into non-empty shards at the mesh's planning sizes, uneven cuts
included (7 over 3); a symbolic axis is planned at its largest size and bound at one no larger,
so that no shard the plan makes is empty at the bound size either.

>>> c = mesh_case(4)
>>> c.seed, c.mesh.count("=") in (1, 2), c == mesh_case(4)
(4, True, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apportion.frontend.random_programs import Draw, Seeded, _doc, random_case, target
from apportion.ir.program import Program
from apportion.target.target import Target

#: mesh axis names, outer first
AXES = ("dp", "tp")
#: the name of a symbolic axis size
SYMBOL = "N"
#: how the plan's strategies are chosen: the annotations completed along the ops, or the
#: strategy search (HiGHS) within them
CHOOSERS = ("propagate", "search")

#: a sharding as plain data: per tensor dim, the mesh axes that split it (outer first)
Dims = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class MeshCase:
    """One random program to shard and run: the program (static shapes), the mesh as
    ``sharding.mesh.parse`` reads it, the annotated tensors' shardings, the chooser, the target
    of each device's cores, the sizes a symbolic axis is bound to at run (empty: none), the
    program's family, the seed (None: drawn by hypothesis) and what it exercises."""

    program: Program
    mesh: str
    shardings: Mapping[str, Dims]
    chooser: str
    target: Target
    family: str
    seed: int | None = None
    sizes: Mapping[str, int] = field(default_factory=dict)
    features: tuple[str, ...] = ()


def sharded(d: Draw, windows: bool = False) -> Program:
    """2 to 6 ops over 2-D float32 tensors of 3 to 8 elements a dim: pointwise ops (broadcasts
    too), transposes, matmuls, reductions kept as ``[n, 1]`` (sum, max, min, a mean, an argmax
    giving int64 that no op reads), a fallback (cumsum), and heads read through ``D*h+d`` and
    summed or merged back into columns (the random sharded programs of ``tests/sharding``).
    ``windows``: also reads across shard boundaries, a shifted slice ``src[i + c, j]``, a
    three-point stencil summed over ``src[i + k, j]`` and a 1-D convolution of three taps
    (what a peered axis reads as a halo)."""
    tensors: dict[str, tuple[list[Any], str]] = {}
    inputs: list[str] = []
    made: list[str] = []
    ops: list[dict[str, Any]] = []

    def new(shape: list[int], source: bool = False, dtype: str = "float32") -> str:
        name = f"in{len(inputs)}" if source else f"t{len(made)}"
        tensors[name] = (shape, dtype)
        (inputs if source else made).append(name)
        return name

    new([d.integers(3, 8), d.integers(3, 8)], source=True)
    for i in range(d.integers(2, 6)):
        pool = [n for n in [*inputs, *made]
                if len(tensors[n][0]) == 2 and tensors[n][1] == "float32"]
        src = d.sampled_from(pool)
        a, b = tensors[src][0]
        kind = d.sampled_from(("unary", "binary", "bcast", "transpose", "matmul", "reduce",
                               "mean", "argmax", "fallback", "heads",
                               *(("shift", "stencil", "conv") if windows else ())))
        name = f"o{i}"
        if kind == "unary":
            out = new([a, b])
            ops.append({"name": name, "op": d.sampled_from(("exp", "neg", "relu", "tanh")),
                        "out": f"{out}[i,j]", "ins": [f"{src}[i,j]"]})
        elif kind == "binary":
            same = [n for n in pool if tensors[n][0] == [a, b]]
            other = d.sampled_from(same) if d.booleans() else new([a, b], source=True)
            out = new([a, b])
            ops.append({"name": name, "op": d.sampled_from(("add", "mul", "sub", "max")),
                        "out": f"{out}[i,j]", "ins": [f"{src}[i,j]", f"{other}[i,j]"]})
        elif kind == "bcast":
            col = new([a, 1], source=True)
            out = new([a, b])
            ops.append({"name": name, "op": "mul", "out": f"{out}[i,j]",
                        "ins": [f"{src}[i,j]", f"{col}[i,0]"]})
        elif kind == "transpose":
            out = new([b, a])
            ops.append({"name": name, "op": "copy", "out": f"{out}[j,i]",
                        "ins": [f"{src}[i,j]"]})
        elif kind == "matmul":
            w = new([b, d.integers(3, 8)], source=True)
            out = new([a, tensors[w][0][1]])
            ops.append({"name": name, "op": "matmul", "out": f"{out}[i,n]",
                        "ins": [f"{src}[i,k]", f"{w}[k,n]"]})
        elif kind in ("reduce", "mean", "argmax"):
            fn = kind if kind != "reduce" else d.sampled_from(("sum", "max", "min"))
            out = new([a, 1], dtype="int64" if fn == "argmax" else "float32")
            ops.append({"name": name, "op": fn, "out": f"{out}[i,0]", "ins": [f"{src}[i,k]"]})
        elif kind == "shift":
            c = d.integers(1, 2)
            if a <= c:  # shifted slices before left too few rows
                continue
            out = new([a - c, b])
            ops.append({"name": name, "op": "copy", "out": f"{out}[i,j]",
                        "ins": [f"{src}[i+{c},j]"], "dims": {"i": a - c}})
        elif kind == "stencil":
            if a <= 2:
                continue
            out = new([a - 2, b])
            ops.append({"name": name, "op": "sum", "out": f"{out}[i,j]",
                        "ins": [f"{src}[i+k,j]"], "dims": {"i": a - 2, "k": 3}})
        elif kind == "conv":  # a 1-D convolution over the rows: y[i, n] = x[i + k, c] w[k, c, n]
            if a <= 2:
                continue
            w = new([3, b, d.integers(3, 8)], source=True)
            out = new([a - 2, tensors[w][0][2]])
            ops.append({"name": name, "op": "matmul", "out": f"{out}[i,n]",
                        "ins": [f"{src}[i+k,c]", f"{w}[k,c,n]"], "dims": {"i": a - 2}})
        elif kind == "fallback":
            out = new([a, b])
            ops.append({"name": name, "op": "cumsum", "out": f"{out}[i,j]",
                        "ins": [f"{src}[i,j]"]})
        else:  # heads: b = H * D read as y[h, i, e] = src[i, D*h + e]
            divisors = [k for k in range(2, b + 1) if b % k == 0]
            if not divisors:
                continue
            dd = d.sampled_from(divisors)
            h = b // dd
            out = new([h, a, dd])
            ops.append({"name": name, "op": "copy", "out": f"{out}[h,i,e]",
                        "ins": [f"{src}[i,{dd}*h+e]"], "dims": {"h": h, "e": dd}})
            if d.booleans():  # back to 2-D: the heads summed
                back = new([a, dd])
                ops.append({"name": f"{name}s", "op": "sum", "out": f"{back}[i,e]",
                            "ins": [f"{out}[h,i,e]"]})
            else:  # or merged back into columns, written through D*h+e
                back = new([a, h * dd])
                ops.append({"name": f"{name}m", "op": "tanh", "out": f"{back}[i,{dd}*h+e]",
                            "ins": [f"{out}[h,i,e]"]})
    if not ops:
        out = new(list(tensors["in0"][0]))
        ops.append({"name": "o0", "op": "exp", "out": f"{out}[i,j]", "ins": ["in0[i,j]"]})
    extra = [d.sampled_from(made) for _ in range(d.integers(0, 2))]
    outputs = [t for t in made if t in {made[-1], *extra}]
    return _doc(tensors, ops, outputs, inputs=inputs, name="sharded")


def mesh(d: Draw, peered: bool = False) -> tuple[str, dict[str, int], dict[str, int]]:
    """A mesh spec of 1 or 2 axes of 2 to 4 devices, one axis symbolic sometimes
    (``dp=N~2..4``: planned at 4, bound at 2 to 4); returns the spec, each axis's planning size
    and the symbol's bound size (empty when no axis is symbolic). ``peered``: each axis is
    a chiplet axis with peered memory half the time (``tp=3@chiplet:peered``).

    >>> spec, planning, bound = mesh(Seeded(1))
    >>> set(planning) <= set(AXES) and all(2 <= n <= 4 for n in planning.values())
    True
    """
    names = AXES[:d.integers(1, 2)]
    symbolic = d.sampled_from((None, None, *names))  # a third or so of the meshes
    parts: list[str] = []
    planning: dict[str, int] = {}
    bound: dict[str, int] = {}
    for name in names:
        if name == symbolic:
            top = d.integers(3, 4)
            parts.append(f"{name}={SYMBOL}~2..{top}")
            planning[name] = top
            bound[SYMBOL] = d.integers(2, top)
        else:
            planning[name] = d.integers(2, 4)
            parts.append(f"{name}={planning[name]}")
        if peered and d.booleans():
            parts[-1] += "@chiplet:peered"
    return ",".join(parts), planning, bound


def shardings(d: Draw, program: Program, sizes: Mapping[str, int]) -> dict[str, Dims]:
    """Random annotations of about a third of ``program``'s tensors over mesh axes of
    ``sizes``: each axis on one dim or none (a dim's axes in mesh order), a dim split only
    where every shard keeps an element (``n >= `` the product of its axes' sizes)."""
    out: dict[str, Dims] = {}
    for t in program.tensors:
        if not t.shape or d.integers(0, 2) != 0:
            continue
        dims: list[tuple[str, ...]] = [() for _ in t.shape]
        for axis, n in sizes.items():
            slot = d.integers(-1, len(t.shape) - 1)
            if slot >= 0 and t.shape[slot] >= math.prod(sizes[a] for a in dims[slot]) * n:
                dims[slot] = (*dims[slot], axis)
        out[t.name] = tuple(dims)
    return out


def reduction_split(d: Draw, program: Program, sizes: Mapping[str, int]) -> dict[str, Dims]:
    """An annotation that splits the reduced dim of an input of one of ``program``'s
    reductions or matmuls over one mesh axis (none when no such dim can be split): the
    reduction then runs on partial values across devices, which an ``all_reduce`` or
    ``reduce_scatter`` combines, after a mean's or argmax's finish."""
    found: list[tuple[str, int, int]] = []
    for op in program.ops:
        if not op.kind.divisible:
            continue
        for acc in op.ins:
            for pos, e in enumerate(acc.index):
                if len(e.dims) == 1 and e.dims[0] in op.reduction_dims:
                    found.append((acc.tensor, pos, program.tensor(acc.tensor).rank))
    if not found:
        return {}
    tensor, pos, rank = d.sampled_from(found)
    axis = d.sampled_from(tuple(sizes))
    if program.tensor(tensor).shape[pos] < sizes[axis]:
        return {}
    return {tensor: tuple((axis,) if k == pos else () for k in range(rank))}


def random_mesh_case(d: Draw, seed: int | None = None, peered: bool = False) -> MeshCase:
    """A program (``sharded`` half the time, else one of ``random_case``'s families bound at
    its run-time sizes), a mesh, annotations, a chooser and a target for each device.
    ``peered``: axes with peered memory drawn too, and ``sharded`` programs that read across
    shard boundaries (halos; seeded cases without it are as they were)."""
    if d.booleans():
        program, family, tgt = sharded(d, peered), "sharded", target(d)
    else:
        c = random_case(d)
        program = c.program.bind(dict(c.sizes)) if c.program.symbols else c.program
        family, tgt = c.family, c.target
    spec, planning, bound = mesh(d, peered)
    ann = shardings(d, program, planning)
    if d.booleans():  # a reduction over devices: partial values, finishes
        ann |= reduction_split(d, program, planning)
    chooser = d.sampled_from(CHOOSERS)
    features = tuple(f for f, on in (
        (f"{len(planning)}-axis mesh", True), ("symbolic axis", bool(bound)),
        ("peered", "peered" in spec),
        ("annotated", bool(ann)), (chooser, True), ("tiled", bool(program.tiling))) if on)
    return MeshCase(program, spec, ann, chooser, tgt, family, seed, bound, features)


def mesh_case(seed: int) -> MeshCase:
    """Mesh case ``seed`` (what ``apportion bench conformance`` runs as mesh case ``seed``)."""
    return random_mesh_case(Seeded(seed), seed)
