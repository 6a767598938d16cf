"""Per-device programs: a sharding plan unrolled into one ordinary program per device, with
explicit collective steps between, and the wrappers that keep the caller's signature.

Every device runs the same *stages* in the same order (SPMD): compute segments, each a normal
apportion ``Program`` over that device's shards (``ap.plan`` plans it on the device's cores),
and ``Collective`` steps that every device takes part in. A device's segment holds its part of
each op (``rules.local_op``: its shard of the iteration space, its operands' shards, accesses
shifted by where its shards start) and the local cuts of resharding (a ``slice`` step is a
``copy`` op reading the part of its block the device keeps); the other steps of a transfer
(all-gather, all-reduce, reduce-scatter, all-to-all) are collectives. A mean or argmax whose
reduction is split over devices ends its part with a ``rules.Finish`` stage (elementwise on
the device: the local mean scaled to its share of the whole count, or the argmax's value and
global index packed into keys), between segments. Devices may differ in their shapes (uneven
shards) and offsets, so each device has its own programs.

A plan on a mesh with symbolic axis sizes unrolls once they are bound: ``unroll(plan,
sizes={"N": 4})`` binds them (``ShardingPlan.bind``) and refuses a mesh left unbound, naming
the axis.

``Unrolled.shard_inputs`` cuts each host input into the devices' shards (numpy views of the
host array, no copy per device); ``unshard_outputs`` assembles each output from the devices'
shards (checking that replicas agree); ``run`` (or calling the value) does the three with the
reference executor and numpy collectives (``collectives.apply``), and returns the outputs by
their names, so the caller keeps the program's signature. ``run(planned=True)`` runs each
device's segments as ``ap.plan`` plans them for its cores (core slice by core slice).

>>> from apportion.frontend.json_format import load
>>> from apportion.sharding.mesh import parse
>>> from apportion.sharding.search import search
>>> u = unroll(search(load("examples/mlp.json"), parse("tp=2"), outputs="replicated"))
>>> [type(s).__name__ for s in u.devices[0].stages]
['Program', 'Collective']
>>> all(c.ok for c in u.check())
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from apportion.errors import ExecutionError
from apportion.ir.affine import AffineExpr
from apportion.ir.op import Access, Op
from apportion.ir.program import Program, TensorType
from apportion.runtime import kernels
from apportion.runtime.reference import (
    OutputCheck,
    bind_inputs,
    compare,
    random_inputs,
    run_unplanned,
)
from apportion.sharding.collectives import Step, apply
from apportion.sharding.plan import ShardingPlan, Transfer
from apportion.sharding.rules import Finish, local_ops
from apportion.target.target import Target


@dataclass(frozen=True)
class Collective:
    """One communicating step that every device runs at once: each device's local
    ``source`` (its shard of ``tensor`` in ``step.src``) becomes its ``result`` (in
    ``step.dst``)."""

    tensor: str
    source: str
    result: str
    step: Step

    def __str__(self) -> str:
        return f"{self.result} = {self.step}({self.source})"


Stage = Program | Collective | Finish


@dataclass(frozen=True)
class DeviceProgram:
    """What device ``device`` runs: its stages (compute segments, collectives, finishes), and
    where its shards of the program's inputs and outputs come from and go (``(tensor, local
    name, block)``, the block as ``(start, stop)`` per dim)."""

    device: int
    coords: tuple[tuple[str, int], ...]
    stages: tuple[Stage, ...]
    inputs: tuple[tuple[str, str, tuple[tuple[int, int], ...]], ...]
    outputs: tuple[tuple[str, str, tuple[tuple[int, int], ...]], ...]

    @property
    def segments(self) -> tuple[Program, ...]:
        return tuple(s for s in self.stages if isinstance(s, Program))


def _slice_op(t: Transfer, k: int, step: Step, src_name: str, dst_name: str,
              plan: ShardingPlan, coords: Mapping[str, int],
              types: dict[str, TensorType]) -> Op:
    """The local cut of a ``slice`` step: a copy of the part of its block the device keeps."""
    tensor = plan.program.tensor(t.tensor)
    sizes = {a.name: a.size for a in plan.mesh.axes}
    src_block = step.src.block(tensor.shape, coords, sizes)
    dst_block = step.dst.block(tensor.shape, coords, sizes)
    dims = tuple((f"d{j}", hi - lo) for j, (lo, hi) in enumerate(dst_block))
    index = tuple(AffineExpr(((f"d{j}", 1),), dst_block[j][0] - src_block[j][0])
                  for j in range(len(dims)))
    types[dst_name] = TensorType(dst_name, tuple(n for _, n in dims), tensor.dtype)
    out = Access(dst_name, tuple(AffineExpr.dim(d) for d, _ in dims))
    return Op(f"reshard.{t.name}.{k}", "copy", out, (Access(src_name, index),), dims)


def _schedule(plan: ShardingPlan) -> list[tuple[str, Any]]:
    """The stages every device runs, in order: ("op", index) and ("step", (transfer, k))."""
    n = len(plan.program.ops)
    before: dict[int, list[Transfer]] = {}
    for t in plan.transfers:
        before.setdefault(min(t.at, n), []).append(t)
    out: list[tuple[str, Any]] = []
    for i in range(n + 1):
        for t in before.get(i, []):
            out.extend(("step", (t, k)) for k in range(len(t.steps)))
        if i < n:
            out.append(("op", i))
    return out


def _step_names(t: Transfer, k: int) -> tuple[str, str]:
    src = t.source if k == 0 else f"{t.name}~{k}"
    dst = t.name if k == len(t.steps) - 1 else f"{t.name}~{k + 1}"
    return src, dst


def _device(plan: ShardingPlan, device: int, schedule: list[tuple[str, Any]]) -> DeviceProgram:
    p, mesh = plan.program, plan.mesh
    coords = mesh.coords(device)
    sizes = {a.name: a.size for a in mesh.axes}
    types: dict[str, TensorType] = {}
    ins = []
    for name, s in plan.inputs:
        t = p.tensor(name)
        types[name] = TensorType(name, s.local_shape(t.shape, coords, sizes), t.dtype)
        ins.append((name, name, s.block(t.shape, coords, sizes)))
    entries: list[Op | Collective | Finish] = []
    for what, item in schedule:
        if what == "op":
            op = p.ops[item]
            shard = plan.ops[item]
            lops, lt, finish = local_ops(op, p, mesh, shard.strategy, coords, shard.reads)
            types.update(lt)
            entries.extend(lops)
            if finish is not None:
                entries.append(finish)
            continue
        t, k = item
        step = t.steps[k]
        src, dst = _step_names(t, k)
        if step.kind == "slice":
            entries.append(_slice_op(t, k, step, src, dst, plan, coords, types))
        else:
            tt = p.tensor(t.tensor)
            types[dst] = TensorType(dst, step.dst.local_shape(tt.shape, coords, sizes),
                                    tt.dtype)
            entries.append(Collective(t.tensor, src, dst, step))
    outs = []
    for name, s, local in plan.outputs:
        outs.append((name, local, s.block(p.tensor(name).shape, coords, sizes)))
    # what each entry reads, to know what a segment hands on
    reads_after: list[set[str]] = [set() for _ in range(len(entries) + 1)]
    final = {local for _, local, _ in outs}
    later: set[str] = set(final)
    for i in range(len(entries) - 1, -1, -1):
        reads_after[i + 1] = set(later)
        e = entries[i]
        later |= {a.tensor for a in e.ins} if isinstance(e, Op) else \
            set(e.sources) if isinstance(e, Finish) else {e.source}
    stages: list[Stage] = []
    run: list[int] = []

    def close() -> None:
        if not run:
            return
        ops = [entries[i] for i in run]
        assert all(isinstance(o, Op) for o in ops)
        made = [o.out.tensor for o in ops]  # type: ignore[union-attr]
        seg_in = list(dict.fromkeys(a.tensor for o in ops for a in o.ins  # type: ignore
                                    if a.tensor not in made))
        after = reads_after[run[-1] + 1]
        seg_out = [m for m in made if m in after] or [made[-1]]
        names = dict.fromkeys([*seg_in, *made])
        stages.append(Program(f"{p.name}.d{device}.s{len(stages)}",
                              tuple(types[n] for n in names), tuple(seg_in), tuple(seg_out),
                              tuple(ops)))  # type: ignore[arg-type]
        run.clear()

    for i, e in enumerate(entries):
        if isinstance(e, Op):
            run.append(i)
        else:
            close()
            stages.append(e)
    close()
    return DeviceProgram(device, tuple(coords.items()), tuple(stages), tuple(ins), tuple(outs))


@dataclass(frozen=True)
class Unrolled:
    """A sharding plan as one program per device (see the module docstring)."""

    plan: ShardingPlan
    devices: tuple[DeviceProgram, ...]

    @property
    def program(self) -> Program:
        return self.plan.program

    # -- the wrappers ---------------------------------------------------------------------------

    def shard_inputs(self, inputs: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
        """Each device's shards of the inputs: views of the host arrays (in storage dtype)."""
        host = bind_inputs(self.program, inputs)
        return [{local: host[name][tuple(slice(lo, hi) for lo, hi in block)]
                 for name, local, block in dev.inputs} for dev in self.devices]

    def unshard_outputs(self, envs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Each output assembled from the devices' shards; replicas must agree."""
        out: dict[str, np.ndarray] = {}
        for k, name in enumerate(self.program.outputs):
            t = self.program.tensor(name)
            whole = np.empty(t.shape, dtype=kernels.storage_dtype(t.dtype))
            written = np.zeros(t.shape, dtype=bool)
            for dev, env in zip(self.devices, envs, strict=True):
                _, local, block = dev.outputs[k]
                sl = tuple(slice(lo, hi) for lo, hi in block)
                part = np.asarray(env[local])
                if part.shape != whole[sl].shape:
                    raise ExecutionError(f"device {dev.device}: output {name!r} shard has shape "
                                         f"{part.shape}, its block {block} needs "
                                         f"{whole[sl].shape}")
                seen = written[sl]
                if seen.any() and not _same(whole[sl][seen], part[seen]):
                    raise ExecutionError(f"device {dev.device}: its replica of output {name!r} "
                                         "differs from another device's")
                whole[sl] = part
                written[sl] = True
            if not written.all():
                raise ExecutionError(f"output {name!r}: no device holds some of its elements")
            out[name] = whole
        return out

    # -- running --------------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, Any] | None = None, planned: bool = False,
            target: Target | None = None, seed: int = 0) -> dict[str, np.ndarray]:
        """Run every device's stages with the reference executor (``planned``: each segment
        as ``ap.plan`` plans it for the device's cores) and numpy collectives; returns the
        outputs by name."""
        xs = random_inputs(self.program, seed) if inputs is None else inputs
        envs = self.shard_inputs(xs)
        plans = self._segment_plans(target) if planned else {}
        for k in range(len(self.devices[0].stages)):
            first = self.devices[0].stages[k]
            if isinstance(first, Finish):
                for dev, env in zip(self.devices, envs, strict=True):
                    fin = dev.stages[k]
                    assert isinstance(fin, Finish)
                    env[fin.result] = fin.run(env)
                continue
            if isinstance(first, Collective):
                arrays = [env[first.source] for env in envs]
                dtype = self.program.tensor(first.tensor).dtype
                for env, res in zip(envs, apply(first.step, arrays, self.plan.mesh, dtype),
                                    strict=True):
                    env[first.result] = res
                continue
            for dev, env in zip(self.devices, envs, strict=True):
                seg = dev.stages[k]
                assert isinstance(seg, Program)
                given = {n: env[n] for n in seg.inputs}
                res = plans[_key(seg)].run(given) if planned else run_unplanned(seg, given)
                env.update({n: res[n] for n in seg.outputs})
        return self.unshard_outputs(envs)

    __call__ = run

    def check(self, seed: int = 0, planned: bool = False,
              target: Target | None = None) -> list[OutputCheck]:
        """The per-device programs run on random inputs against the unsharded program."""
        inputs = random_inputs(self.program, seed)
        expected = run_unplanned(self.program, inputs)
        return compare(expected, self.run(inputs, planned, target), self.program)

    def _segment_plans(self, target: Target | None) -> dict[Program, Any]:
        from apportion.planned import plan

        tgt = target or self.plan.target
        out: dict[Program, Any] = {}
        for dev in self.devices:
            for seg in dev.segments:
                key = _key(seg)
                if key not in out:
                    out[key] = plan(replace(seg, name=seg.name), tgt)
        return out

    def planned(self, target: Target | None = None) -> list[list[Any]]:
        """Per device, each segment planned by ``ap.plan`` for the device's cores (identical
        segments planned once)."""
        plans = self._segment_plans(target)
        return [[plans[_key(s)] for s in dev.segments] for dev in self.devices]

    @cached_property
    def distinct_segments(self) -> int:
        return len({_key(s) for dev in self.devices for s in dev.segments})


def _key(seg: Program) -> Program:
    """A segment without its device in its name: devices with equal shards share its plan."""
    return replace(seg, name=seg.name.split(".d")[0] + ".s" + seg.name.rsplit(".s", 1)[1])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind == "f":
        return bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))
    return bool(np.array_equal(a, b))


def unroll(plan: ShardingPlan, sizes: Mapping[str, int] | None = None) -> Unrolled:
    """The per-device programs of ``plan``; ``sizes`` binds the symbolic axis sizes of its
    mesh (``ShardingPlan.bind``), which must all be bound."""
    plan = plan.bind(sizes)
    schedule = _schedule(plan)
    return Unrolled(plan, tuple(_device(plan, d, schedule) for d in range(plan.mesh.devices)))
