"""Running the partitioned form (``partitioned_mlir``) device by device with upstream MLIR, its
``shard.update_halo`` exchanges done between the devices' runs in numpy as upstream's op
documents them: every device holds its shard grown by one (low, high) pair along each
exchanged dim, and the halo rows are filled from the adjacent shards' cores (an outermost
shard's halo beyond the tensor is left as it is).

Each device's function is the SPMD function with ``shard.process_linear_index`` its own index,
its arguments and results cast to its static shard types, and every ``update_halo`` cut out:
its result becomes an argument, its operand an extra result. Run once per exchange plus once,
each run feeding the exchanges the previous run's operands made (an exchange's operand depends
only on the exchanges before it), the last run's results are the devices' outputs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apportion.backends.mlir import symbol_name
from apportion.runtime.upstream_mlir import run_function
from apportion.sharding.plan import ShardingPlan

_HALO = re.compile(r"^  (%[\w.$-]+) = shard\.update_halo (%[\w.$-]+) on @mesh split_axes = "
                   r"\[(.*)\] halo_sizes = \[(\d+), (\d+)\](?: \{[^}]*\})? : (tensor<[^>]+>)$")
_ARG = re.compile(r"(%[\w.$-]+): (tensor<[^>]+>)")


@dataclass(frozen=True)
class Exchange:
    """One ``shard.update_halo``: its result and operand, type, dim, grid axis and pair."""

    result: str
    operand: str
    type: str
    dim: int
    axis: int
    low: int
    high: int


def exchanges(text: str) -> list[Exchange]:
    """The function's ``update_halo`` ops (each exchanges one dim along one grid axis)."""
    out = []
    for line in text.splitlines():
        m = _HALO.match(line)
        if m:
            dims = re.findall(r"\[([^\[\]]*)\]", m.group(3))
            (dim,) = [j for j, a in enumerate(dims) if a.strip()]
            out.append(Exchange(m.group(1), m.group(2), m.group(6), dim, int(dims[dim]),
                                int(m.group(4)), int(m.group(5))))
    return out


def _ttype(shape: Sequence[int], element: str) -> str:
    return f"tensor<{''.join(f'{n}x' for n in shape)}{element}>"


def device_module(text: str, device: int, in_shapes: Sequence[Sequence[int]],
                  out_shapes: Sequence[Sequence[int]]) -> str:
    """The SPMD function as device ``device`` runs it, static types at its boundary, every
    ``update_halo`` result an extra trailing argument and its operand an extra result."""
    halos = exchanges(text)
    cut = {h.result for h in halos}
    lines = []
    for line in text.splitlines():
        if line.startswith("shard.grid "):
            continue
        if line.startswith("func.func "):
            head, _, rest = line.partition(") -> (")
            args = _ARG.findall(head)
            results = re.findall(r"tensor<[^>]+>", rest.split(")")[0])
            sig = []
            for (name, ty), shape in zip(args, in_shapes, strict=True):
                static = _ttype(shape, ty.rsplit("x", 1)[1][:-1])
                sig.append(f"{name}_static: {static}")
            sig += [f"{h.result}: {h.type}" for h in halos]
            outs = [_ttype(s, r.rsplit("x", 1)[1][:-1]) for s, r in zip(out_shapes, results,
                                                                         strict=True)]
            name = line.split("(")[0][len("func.func "):]
            lines.append(f"func.func {name}({', '.join(sig)}) -> "
                         f"({', '.join([*outs, *(h.type for h in halos)])}) {{")
            for (arg, ty), shape in zip(args, in_shapes, strict=True):
                static = _ttype(shape, ty.rsplit("x", 1)[1][:-1])
                lines.append(f"  {arg} = tensor.cast {arg}_static : {static} to {ty}")
            continue
        m = re.match(r"^  (%\w+) = shard\.process_linear_index on @mesh : index$", line)
        if m:
            lines.append(f"  {m.group(1)} = arith.constant {device} : index")
            continue
        m = _HALO.match(line)
        if m and m.group(1) in cut:
            continue
        if line.startswith("  return "):
            vals, _, types = line[len("  return "):].partition(" : ")
            rets = []
            for k, (v, ty, shape) in enumerate(zip(vals.split(", "), types.split(", "),
                                                    out_shapes, strict=True)):
                static = _ttype(shape, ty.rsplit("x", 1)[1][:-1])
                lines.append(f"  %ret{k} = tensor.cast {v} : {ty} to {static}")
                rets.append((f"%ret{k}", static))
            rets += [(h.operand, h.type) for h in halos]
            lines.append(f"  return {', '.join(v for v, _ in rets)} : "
                         f"{', '.join(t for _, t in rets)}")
            continue
        if "shard." in line:
            raise AssertionError(f"the per-device run handles update_halo only: {line.strip()}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def update_halo(arrays: Sequence[np.ndarray], h: Exchange, plan: ShardingPlan
                ) -> list[np.ndarray]:
    """Upstream's ``update_halo`` on every device's grown shard: the ``low`` rows before its
    core from the core's end of the device below it along the axis, the ``high`` rows after
    from the core's start of the device above."""
    mesh = plan.mesh
    axis = mesh.axes[h.axis].name
    out = []
    for d, a in enumerate(arrays):
        c = mesh.coords(d)
        core = a.shape[h.dim] - h.low - h.high
        new = a.copy()

        def rows(lo: int, hi: int, ndim: int = a.ndim) -> tuple[slice, ...]:
            return tuple(slice(lo, hi) if i == h.dim else slice(None) for i in range(ndim))

        if c[axis] > 0 and h.low:
            below = arrays[mesh.device({**c, axis: c[axis] - 1})]
            new[rows(0, h.low)] = below[rows(core, core + h.low)]
        if c[axis] < mesh.size(axis) - 1 and h.high:
            above = arrays[mesh.device({**c, axis: c[axis] + 1})]
            new[rows(h.low + core, h.low + core + h.high)] = above[rows(h.low, h.low + h.high)]
        out.append(new)
    return out


def run_partitioned(text: str, plan: ShardingPlan, inputs: Mapping[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
    """Every device's part of ``text`` (the plan's partitioned form) run by upstream MLIR on
    its shards of ``inputs``, the exchanges between; the outputs put back together whole."""
    program, mesh = plan.program, plan.mesh
    sizes = {a.name: a.size for a in mesh.axes}
    coords = [mesh.coords(d) for d in range(mesh.devices)]
    halos = exchanges(text)

    def elements(ty: str) -> tuple[int, ...]:
        return tuple(int(n) for n in ty[len("tensor<"):-1].split("x")[:-1])

    local_in = [[inputs[n][tuple(slice(lo, hi) for lo, hi in
                                 s.block(program.tensor(n).shape, c, sizes))]
                 for n, s in plan.inputs] for c in coords]
    out_shapes = [[s.local_shape(program.tensor(n).shape, c, sizes)
                   for n, s, _ in plan.outputs] for c in coords]
    given = [[np.zeros(elements(h.type), np.float32) for h in halos] for _ in coords]
    results: list[list[np.ndarray]] = []
    for _ in range(len(halos) + 1):
        results = []
        for d in range(mesh.devices):
            module = device_module(text, d, [a.shape for a in local_in[d]], out_shapes[d])
            outs = [(s, program.tensor(n).dtype) for s, (n, _, _) in
                    zip(out_shapes[d], plan.outputs, strict=True)]
            outs += [(elements(h.type), "float32") for h in halos]
            ins = [*local_in[d], *given[d]]
            dtypes = [program.tensor(n).dtype for n, _ in plan.inputs] + \
                ["float32"] * len(halos)
            results.append(run_function(module, symbol_name(program.name), ins, outs, dtypes))
        n_out = len(plan.outputs)
        for k, h in enumerate(halos):
            done = update_halo([results[d][n_out + k] for d in range(mesh.devices)], h, plan)
            for d in range(mesh.devices):
                given[d][k] = done[d]
    whole = {}
    for k, (name, s, _) in enumerate(plan.outputs):
        t = program.tensor(name)
        arr = np.zeros(t.shape, results[0][k].dtype)
        for d, c in enumerate(coords):
            arr[tuple(slice(lo, hi) for lo, hi in s.block(t.shape, c, sizes))] = results[d][k]
        whole[name] = arr
    return whole
