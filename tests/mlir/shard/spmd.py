"""Running the partitioned form (``partitioned_mlir``) device by device with upstream MLIR, its
data-moving shard ops (``update_halo`` and the collectives) done between the devices' runs in
numpy as upstream's dialect documents them (``exchange``).

Each device's function is the SPMD function with ``shard.process_linear_index`` its own index,
its arguments and results cast to its static shard types, and every data-moving op cut out:
its result becomes an argument, its operand an extra result. Run once per exchange plus once,
each run feeding the exchanges the previous run's operands made (an exchange's operand depends
only on the exchanges before it), the last run's results are the devices' outputs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apportion.mlir.builder import symbol_name
from apportion.mlir.upstream import run_function
from apportion.sharding.plan import ShardingPlan

_OP = re.compile(r"^  (%[\w.$-]+) = shard\.(update_halo|all_gather|all_slice|all_reduce|"
                 r"reduce_scatter|all_to_all) (%[\w.$-]+) on @mesh (.*?)(?: \{[^}]*\})? : "
                 r"(tensor<[^>]+>)(?: -> (tensor<[^>]+>))?$")
_ARG = re.compile(r"(%[\w.$-]+): (tensor<[^>]+>)")
#: MLIR element types and the dtypes ``run_function`` passes them as
_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16",
           "i64": "int64", "i32": "int32", "i8": "int8"}


@dataclass(frozen=True)
class Exchange:
    """One shard op that moves data between devices: its result and operand, kind, the types
    before and after, its grid axis, and its dims (an ``update_halo``'s dim and pair)."""

    result: str
    operand: str
    kind: str
    type: str
    after: str
    axis: int
    dim: int = -1
    to_dim: int = -1
    reduction: str = ""
    low: int = 0
    high: int = 0


def _field(attrs: str, name: str) -> str:
    m = re.search(rf"{name} = (\w+)", attrs)
    return m.group(1) if m else ""


def exchanges(text: str) -> list[Exchange]:
    """The function's data-moving shard ops, in order (each along one grid axis)."""
    out = []
    for line in text.splitlines():
        m = _OP.match(line)
        if not m:
            continue
        result, kind, operand, attrs, before, after = m.groups()
        after = after or before
        if "?" in before or "?" in after:
            raise AssertionError(f"the per-device run takes static types only: {line.strip()}")
        if kind == "update_halo":
            split = re.search(r"split_axes = \[(.*)\] halo_sizes = \[(\d+), (\d+)\]", attrs)
            assert split is not None, line
            dims = re.findall(r"\[([^\[\]]*)\]", split.group(1))
            (dim,) = [j for j, a in enumerate(dims) if a.strip()]
            out.append(Exchange(result, operand, kind, before, after, int(dims[dim]), dim,
                                low=int(split.group(2)), high=int(split.group(3))))
            continue
        grid = re.search(r"grid_axes = \[(\d+)\]", attrs)
        assert grid is not None, line
        dim = _field(attrs, "gather_axis") or _field(attrs, "slice_axis") or \
            _field(attrs, "scatter_axis") or _field(attrs, "concat_axis")
        out.append(Exchange(result, operand, kind, before, after, int(grid.group(1)),
                            int(dim) if dim else -1,
                            int(_field(attrs, "split_axis") or -1),
                            _field(attrs, "reduction")))
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
            sig += [f"{h.result}: {h.after}" for h in halos]
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
        m = _OP.match(line)
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
            raise AssertionError(f"the per-device run has no model of {line.strip()}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def _element(ty: str) -> str:
    return _DTYPES[ty[:-1].rsplit("x", 1)[1]]


def _shape(ty: str) -> tuple[int, ...]:
    return tuple(int(n) for n in ty[len("tensor<"):-1].split("x")[:-1])


def _rows(ndim: int, dim: int, lo: int, hi: int) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) if i == dim else slice(None) for i in range(ndim))


def _reduce(parts: Sequence[np.ndarray], reduction: str) -> np.ndarray:
    """The group's arrays combined in rank order, in their own dtype."""
    combine = {"sum": np.add, "max": np.maximum, "min": np.minimum, "product": np.multiply,
               "bitwise_or": np.bitwise_or}[reduction]
    total = parts[0]
    for p in parts[1:]:
        total = combine(total, p).astype(p.dtype)
    return total


def exchange(arrays: Sequence[np.ndarray], h: Exchange, plan: ShardingPlan
             ) -> list[np.ndarray]:
    """``h`` on every device's array, as upstream's shard dialect documents its ops, the
    group being the devices along ``h.axis`` in rank order:

    * ``update_halo``: the ``low`` rows before a device's core from the core's end of the
      device below it, the ``high`` rows after from the core's start of the device above (an
      outermost device's halo beyond the tensor left as it is);
    * ``all_gather``: the group's arrays concatenated along the gather axis;
    * ``all_slice``: the device's equal piece of its array along the slice axis;
    * ``all_reduce``: the group's arrays reduced; ``reduce_scatter``: reduced, then the
      device's equal piece along the scatter axis;
    * ``all_to_all``: piece ``r`` of each array along the split axis to rank ``r``, the pieces
      received concatenated along the concat axis in rank order.
    """
    mesh = plan.mesh
    axis = mesh.axes[h.axis].name
    k = mesh.size(axis)
    out = []
    for d, a in enumerate(arrays):
        c = mesh.coords(d)
        group = [arrays[mesh.device({**c, axis: r})] for r in range(k)]
        me = c[axis]

        def piece(x: np.ndarray, dim: int, r: int) -> np.ndarray:
            n = x.shape[dim] // k
            return x[_rows(x.ndim, dim, r * n, (r + 1) * n)]

        if h.kind == "update_halo":
            core = a.shape[h.dim] - h.low - h.high
            new = a.copy()
            if me > 0 and h.low:
                new[_rows(a.ndim, h.dim, 0, h.low)] = \
                    group[me - 1][_rows(a.ndim, h.dim, core, core + h.low)]
            if me < k - 1 and h.high:
                new[_rows(a.ndim, h.dim, h.low + core, h.low + core + h.high)] = \
                    group[me + 1][_rows(a.ndim, h.dim, h.low, h.low + h.high)]
            out.append(new)
        elif h.kind == "all_gather":
            out.append(np.concatenate(group, axis=h.dim))
        elif h.kind == "all_slice":
            out.append(piece(a, h.dim, me))
        elif h.kind == "all_reduce":
            out.append(_reduce(group, h.reduction))
        elif h.kind == "reduce_scatter":
            out.append(piece(_reduce(group, h.reduction), h.dim, me))
        else:  # all_to_all
            out.append(np.concatenate([piece(g, h.to_dim, me) for g in group], axis=h.dim))
    return out


def run_partitioned(text: str, plan: ShardingPlan, inputs: Mapping[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
    """Every device's part of ``text`` (the plan's partitioned form) run by upstream MLIR on
    its shards of ``inputs``, the exchanges between; the outputs put back together whole."""
    program, mesh = plan.program, plan.mesh
    sizes = {a.name: a.size for a in mesh.axes}
    coords = [mesh.coords(d) for d in range(mesh.devices)]
    moves = exchanges(text)
    local_in = [[inputs[n][tuple(slice(lo, hi) for lo, hi in
                                 s.block(program.tensor(n).shape, c, sizes))]
                 for n, s in plan.inputs] for c in coords]
    out_shapes = [[s.local_shape(program.tensor(n).shape, c, sizes)
                   for n, s, _ in plan.outputs] for c in coords]
    given = [[np.zeros(_shape(h.after), _element(h.after).replace("bfloat16", "float32"))
              for h in moves] for _ in coords]
    results: list[list[np.ndarray]] = []
    n_out = len(plan.outputs)
    for _ in range(len(moves) + 1):
        results = []
        for d in range(mesh.devices):
            module = device_module(text, d, [a.shape for a in local_in[d]], out_shapes[d])
            outs = [(s, plan.outputs[k][1].held_dtype(program.tensor(n).dtype))
                    for k, (s, (n, _, _)) in enumerate(zip(out_shapes[d], plan.outputs,
                                                           strict=True))]
            outs += [(_shape(h.type), _element(h.type)) for h in moves]
            dtypes = [program.tensor(n).dtype for n, _ in plan.inputs] + \
                [_element(h.after) for h in moves]
            results.append(run_function(module, symbol_name(program.name),
                                        [*local_in[d], *given[d]], outs, dtypes))
        for k, h in enumerate(moves):
            done = exchange([results[d][n_out + k] for d in range(mesh.devices)], h, plan)
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
