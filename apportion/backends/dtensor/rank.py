"""What one rank of a distributed run does: the stages of a ``MeshSchedule`` on its device,
its values DTensors placed as the schedule's ``Layout``s say.

Every rank builds a ``DeviceMesh`` of the schedule's mesh axes (device ``d`` is rank ``d``,
row-major) and then:

* places each input with ``distribute_tensor`` in its layout's placements (``Shard(dim)``
  where an axis splits a dim, ``Replicate()`` elsewhere) and checks its local shard is its
  box of ``Device.inputs``;
* runs each ``Compute`` stage's launch on its device, op by op: a 2-D or batched matmul, or a
  pointwise kind whose operands are read alike (the registry's formula on torch, ``XP``), as
  torch ops on the DTensors themselves, whose own sharding propagation must then give the
  planned layout; every other op on the local shards with the reference's ``evaluate_op``,
  its result wrapped back with ``DTensor.from_local`` where it has a layout (a value a device
  keeps to itself, a split mean's or argmax's local part, stays a local array);
* runs each ``Collective`` as ``DTensor.redistribute`` from its source's layout to its
  result's (``Partial(reduce_op)`` for a pending reduction, the registry's
  ``DeviceCombine.collective``: ``sum``, ``max``, ``min``, ``product``; an argmax waits as
  ``max`` over its int64 keys, unpacked to indices where the step says ``unpack``), and each
  ``MeshFinish`` on the local arrays (``FinishPart.apply``);
* asserts after every input, op, step and finish that the DTensor's placements, global shape
  and local shape are the planned ones;
* gathers every output (``full_tensor``) for rank 0 to hand back.

Uneven shards: apportion cuts a dim over devices as it cuts work over cores (10 over 4 is
3, 3, 2, 2), while DTensor's ``Shard`` assumes ``torch.chunk``'s cut (3, 3, 3, 1) wherever it
cuts or gathers. Where the two differ for a value (``torch_agrees``: a device's box is not
the one torch would cut), the rank places its own box with ``DTensor.from_local`` and an
explicit global shape and stride, runs a collective on it itself over the mesh axis's process
group by the schedule's boxes (``own_collective``: an all-gather of shards padded to the
largest and trimmed, an all-reduce, then the cut of its result box), runs ops on its local
shards, and gathers an output by the boxes too. Every decision between the two ways is made
from what every rank knows alike (all devices' boxes, all devices' ops), so the ranks always
take the same collectives.
"""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from apportion.backends.dtensor import launch as launching
from apportion.errors import ExecutionError
from apportion.frontend.json_format import loads
from apportion.ir.kinds import FLOATS, REDUCERS, Category
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.plans.tiles import Region
from apportion.runtime import kernels
from apportion.runtime.reference import evaluate_op
from apportion.schedule.mesh import (
    READS,
    Collective,
    Device,
    FinishPart,
    Layout,
    argmax_index,
    box_shape,
    intersect,
    within,
)

#: DTensor's ``Partial`` reduce op for each elementwise combine of a collective
#: (``DeviceCombine.collective`` in the registry)
TORCH_REDUCE = {"sum": "sum", "prod": "product", "max": "max", "min": "min"}


def combine(reducer: str) -> str:
    """The elementwise combine a collective reduction of partials waiting on ``reducer`` uses
    (the registry's ``DeviceCombine.collective``).

    >>> combine("argmax"), combine("sum")
    ('max', 'sum')
    """
    across = REDUCERS[reducer].across_devices
    if across is None:
        raise ExecutionError(f"partials cannot wait on a {reducer!r} reduction across devices")
    return across.collective


def torch_box(shape: Sequence[int], lay: Layout, axes: Sequence[tuple[str, int]],
              coords: Mapping[str, int]) -> Region:
    """The box of a tensor of ``shape`` that DTensor's placements of ``lay`` give the device
    at ``coords``: each mesh axis in order cuts the dim it shards as ``torch.chunk`` does
    (pieces of ``ceil(n / size)``, the last ones short or empty).

    >>> lay = Layout("x", "x", (("tp",), ()), boxes=())
    >>> [torch_box((10, 3), lay, [("tp", 4)], {"tp": c})[0] for c in range(4)]
    [(0, 3), (3, 6), (6, 9), (9, 10)]
    """
    box = [(0, n) for n in shape]
    for axis, size in axes:
        kind, dim = lay.axis_placement(axis)
        if kind != "shard":
            continue
        assert isinstance(dim, int)
        lo, hi = box[dim]
        step = -(-(hi - lo) // size)
        start = min(lo + coords[axis] * step, hi)
        box[dim] = (start, min(start + step, hi))
    return tuple(box)


def torch_agrees(shape: Sequence[int], lay: Layout, axes: Sequence[tuple[str, int]],
                 devices: Sequence[Device]) -> bool:
    """Whether every device's box of ``lay`` is the one DTensor's placements cut
    (``torch_box``): then DTensor may place, redistribute and gather the value itself."""
    return all(torch_box(shape, lay, axes, dict(dev.coords)) == box
               for dev, box in zip(devices, lay.boxes, strict=True))


def own_collective(c: Collective, local: Any, device: int, group: Any) -> Any:
    """Collective ``c`` run by this rank on its local array ``local`` (a torch tensor, its
    box ``c.src_boxes[device]``) over ``group``, the process group of ``c.group(device)`` in
    rank order; returns its box ``c.dst_boxes[device]``. Shards are cut as the schedule's
    boxes say, so uneven ones need no ``torch.chunk``: a gather pads every shard to the
    largest and trims each after, a reduction is an all-reduce, and a reduce-scatter, an
    all-to-all or a slice end with the cut of the rank's result box."""
    import torch
    import torch.distributed as dist

    members = c.group(device)
    have = list(c.src_boxes[device])
    want = c.dst_boxes[device]
    x = local
    if c.kind in READS:
        return _read(c, local, device, group)
    if c.kind in ("all_gather", "all_to_all"):
        assert c.dim is not None
        dim = c.dim
        blocks = [c.src_boxes[p][dim] for p in members]
        if any(a[1] != b[0] for a, b in zip(blocks, blocks[1:], strict=False)):
            raise ExecutionError(f"{c}: the boxes of group {members} along dim {dim}, "
                                 f"{blocks}, do not follow one another")
        widths = [hi - lo for lo, hi in blocks]
        padded = x.new_zeros(*x.shape[:dim], max(widths), *x.shape[dim + 1:])
        padded.narrow(dim, 0, x.shape[dim]).copy_(x)
        parts = [torch.empty_like(padded) for _ in members]
        dist.all_gather(parts, padded, group=group)
        x = torch.cat([p.narrow(dim, 0, w) for p, w in zip(parts, widths, strict=True)],
                      dim=dim)
        have[dim] = (blocks[0][0], blocks[-1][1])
    elif c.reducer is not None:
        op = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
              "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[combine(c.reducer)]
        x = x.contiguous().clone()
        dist.all_reduce(x, op=op, group=group)
        if c.unpack:  # the keys fully reduced: the indices they hold
            x = torch.from_numpy(argmax_index(x.cpu().numpy())).to(local.device)
    for j, ((lo, hi), (wlo, whi)) in enumerate(zip(have, want, strict=True)):
        if (lo, hi) != (wlo, whi):  # the rank's box of what it now holds
            if not (lo <= wlo and whi <= hi):
                raise ExecutionError(f"device {device}: {c}: its result box {want} is not "
                                     f"within what it holds, {tuple(have)}")
            x = x.narrow(j, wlo - lo, whi - wlo)
    return x.contiguous()


def _read(c: Collective, local: Any, device: int, group: Any) -> Any:
    """A ``halo`` or ``peer_read`` by point-to-point messages over ``group``: the rank sends
    each peer exactly the part of its box that peer lacks (``Collective.lacked``), receives
    what it lacks of its own result box, and copies the part it holds itself. Gloo and NCCL
    have no one-sided reads of a peer's memory; these messages move the same elements."""
    import torch
    import torch.distributed as dist

    src, dst = c.src_boxes[device], c.dst_boxes[device]
    out = local.new_empty(box_shape(dst))
    mine = intersect(src, dst)
    if mine is not None:
        out[_slices(within(mine, dst))] = local[_slices(within(mine, src))]
    ops, recvs = [], []
    for p in c.group(device):
        if p == device:
            continue
        send = c.lacked(device, p)
        if send is not None:
            ops.append(dist.P2POp(dist.isend, local[_slices(within(send, src))].contiguous(),
                                  p, group))
        got = c.lacked(p, device)
        if got is not None:
            buf = local.new_empty(box_shape(got))
            ops.append(dist.P2POp(dist.irecv, buf, p, group))
            recvs.append((got, buf))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    for got, buf in recvs:
        out[_slices(within(got, dst))] = buf
    return torch.as_tensor(out).contiguous()


def _slices(box: Region) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in box)


def _torch_dtype(dtype: str) -> Any:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "int8": torch.int8, "int32": torch.int32, "int64": torch.int64,
            "bool": torch.uint8}[dtype]


def to_torch(a: np.ndarray, dtype: str) -> Any:
    """A storage array as a torch tensor (bools as uint8 bytes, which gloo reduces)."""
    import torch

    # ascontiguousarray makes a 0-d array 1-d: a model's scalar constants keep their shape ()
    shape = np.shape(a)
    if dtype == "bool":
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8).reshape(shape))
    return torch.from_numpy(np.ascontiguousarray(a).reshape(shape)).to(_torch_dtype(dtype))


def to_numpy(t: Any, dtype: str) -> np.ndarray:
    """A torch tensor as a storage array of ``dtype``."""
    t = t.cpu()  # a GPU rank's tensors (nccl) come to the host to be compared
    if dtype == "bool":
        return t.numpy().astype(bool)
    if dtype == "bfloat16":
        return t.float().numpy()
    return t.numpy()


def native_form(op: Op, program: Program) -> str | None:
    """``matmul`` or ``pointwise`` when torch runs ``op`` on DTensors (a 2-D or batched matmul
    read as ``[m, k] x [k, n]``; a pointwise kind over float operands read alike, with a
    formula and no conditions) and reading each input whole; None otherwise. A torch op on
    DTensors computes over its operands' whole (local) shapes, so an op reading a leading
    slice of one (``x[:n]`` of a longer axis) runs on the local shards instead.

    >>> from apportion.frontend.json_format import load, from_dict
    >>> p = load("examples/mlp.json")
    >>> [native_form(o, p) for o in p.ops]
    ['matmul', 'matmul', 'pointwise', 'pointwise', 'matmul']
    >>> lead = from_dict({"name": "lead", "inputs": ["x"], "outputs": ["y"],
    ...     "tensors": {"x": {"shape": [12, 8], "dtype": "float32"}},
    ...     "ops": [{"name": "cp", "op": "exp", "out": "y[i,j]", "ins": ["x[i,j]"],
    ...              "dims": {"i": 6}}]})
    >>> native_form(lead.ops[0], lead) is None
    True
    """
    if any(e.single_dim is None for a in op.operands for e in a.index):
        return None
    if any(op.sizes[e.single_dim] != n for a in op.ins
           for e, n in zip(a.index, program.tensor(a.tensor).shape, strict=True)):
        return None
    if any(program.tensor(a.tensor).dtype not in FLOATS for a in op.operands):
        return None
    dims = [tuple(e.single_dim for e in a.index) for a in op.operands]
    kind = op.kind
    if kind.category is Category.MATMUL and len(op.ins) == 2:
        # the category is a sum over the reduction dims of the inputs' product: torch.matmul
        # where the operands are read as [m, k] x [k, n] (batched: [b, m, k] x [b, k, n])
        (x, w), out = dims[:2], dims[2]
        if len(x) == 2 and len(w) == 2 and x[1] == w[0] and out == (x[0], w[1]):
            return "matmul"
        if len(x) == 3 and len(w) == 3 and x[0] == w[0] and x[2] == w[1] and \
                out == (x[0], x[1], w[2]):
            return "matmul"
        return None
    # a kind with no input makes no DTensor, and one reading truth values needs them as bools
    if kind.category is not Category.POINTWISE or kind.compute is None or not op.ins or \
            kind.conditions or any(d != dims[-1] for d in dims):
        return None
    return "pointwise"


def run_native(op: Op, program: Program, ins: list[Any]) -> Any:
    """``op`` (``native_form`` not None) as torch ops on the DTensors ``ins``."""
    import torch

    from apportion.runtime.torch_xp import XP

    if native_form(op, program) == "matmul":
        out = _torch_dtype(program.tensor(op.out.tensor).dtype)
        if any(t.dtype != out for t in ins):  # a partial held wider: sum in its dtype
            ins = [t.to(out) for t in ins]
        return torch.matmul(ins[0], ins[1])
    wide = [t.to(torch.float32) for t in ins]  # as the reference, not in float16
    res = op.kind.compute(XP, *wide, **op.kind.numeric_attrs(dict(op.attrs)))
    return res.to(_torch_dtype(program.tensor(op.out.tensor).dtype))


def worker(rank: int, world: int, payload: str, outdir: str, timeout_s: float,
           device: str = "cpu") -> None:
    """One rank (a spawned process): every job of the payload, then rank 0's result for the
    parent; any failure is recorded for the parent (``launch.record_failure``)."""
    where = "before the first op"

    def at(w: str) -> None:
        nonlocal where
        where = w
        launching.mark_at(outdir, rank, w)

    try:
        import torch
        import torch.distributed as dist

        if device == "cuda":
            torch.cuda.set_device(rank)
        # a file store in the run's folder: a free TCP port picked by the parent could be
        # taken by another program before rank 0 binds it
        dist.init_process_group("nccl" if device == "cuda" else "gloo",
                                init_method=Path(outdir, "store").absolute().as_uri(),
                                rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        with open(payload, "rb") as f:
            data = pickle.load(f)
        results = [Rank(rank, job, device, at).run(data["fault"]) for job in data["jobs"]]
        if rank == 0:
            launching.write_result(outdir, results)
        dist.barrier()
        launching.mark_done(outdir, rank)
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent
        launching.record_failure(outdir, rank, where, e)
        os._exit(1)


class Rank:
    """One rank running one job (a schedule as ``runner.job`` packs it): its values by local
    name, DTensors where the value has a layout (``dts``) and storage arrays where it is the
    device's own (``own``)."""

    def __init__(self, rank: int, job: Mapping[str, Any], device: str,
                 at: Callable[[str], None]) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self.rank = rank
        self.program: Program = loads(job["program"])
        self.axes: tuple[tuple[str, int], ...] = job["axes"]
        self.names = tuple(a for a, _ in self.axes)
        self.devices: tuple[Device, ...] = job["devices"]
        self.layouts: dict[str, Layout] = {lay.local: lay for lay in job["layouts"]}
        self.stages: list[tuple[str, Any]] = job["stages"]
        self.segments = {k: loads(text) for k, text in job["segments"].items()}
        self.host: Mapping[str, np.ndarray] = job["inputs"]
        self.device = device
        self.at = at
        self.dmesh = init_device_mesh(device, tuple(n for _, n in self.axes),
                                      mesh_dim_names=self.names)
        self.dts: dict[str, Any] = {}
        self.own: dict[str, np.ndarray] = {}
        self.checks = 0
        self.native: list[str] = []
        self.ops = 0

    # -- layouts ------------------------------------------------------------------------------

    def layout(self, local: str, what: str) -> Layout:
        lay = self.layouts.get(local)
        if lay is None:
            raise ExecutionError(f"rank {self.rank}: {what}: value {local!r} has no layout in "
                                 "the schedule")
        return lay

    def placements(self, lay: Layout) -> list[Any]:
        from torch.distributed.tensor import Partial, Replicate, Shard

        out: list[Any] = []
        for axis in self.names:
            kind, arg = lay.axis_placement(axis)
            if kind == "shard":
                out.append(Shard(arg))
            elif kind == "partial":
                out.append(Partial(TORCH_REDUCE[combine(str(arg))]))
            else:
                out.append(Replicate())
        return out

    def agrees(self, lay: Layout) -> bool:
        return torch_agrees(self.program.tensor(lay.tensor).shape, lay, self.axes, self.devices)

    def dtype(self, lay: Layout) -> str:
        """The dtype the devices hold the value in (a partial sum's accumulator dtype)."""
        return lay.dtype or self.program.tensor(lay.tensor).dtype

    def placed(self, local: Any, lay: Layout) -> Any:
        """This rank's box as a DTensor of ``lay``'s placements, global shape given."""
        import torch
        from torch.distributed.tensor import DTensor

        full = self.program.tensor(lay.tensor).shape
        stride = tuple(int(np.prod(full[i + 1:])) for i in range(len(full)))
        return DTensor.from_local(local, self.dmesh, self.placements(lay), run_check=False,
                                  shape=torch.Size(full), stride=stride)

    def expect(self, dt: Any, lay: Layout, what: str) -> None:
        """The DTensor's placements, global and local shapes are the layout's."""
        want = tuple(self.placements(lay))
        shape = self.program.tensor(lay.tensor).shape
        local = box_shape(lay.boxes[self.rank])
        got = tuple(dt.to_local().shape)
        if tuple(dt.placements) != want or tuple(dt.shape) != shape or got != local:
            raise ExecutionError(f"rank {self.rank}: {what}: tensor {lay.tensor!r} is "
                                 f"{tuple(dt.placements)} of shape {tuple(dt.shape)} (local "
                                 f"{got}); the schedule says {want} ({lay}), local {local}")
        self.checks += 1

    def local(self, name: str, dtype: str) -> np.ndarray:
        """A value's local array on this rank (its shard, for a DTensor)."""
        if name in self.own:
            return self.own[name]
        if name not in self.dts:
            raise ExecutionError(f"rank {self.rank}: value {name!r} is read before it is made")
        arr = to_numpy(self.dts[name].to_local(), dtype)
        self.own[name] = arr  # values are written once: the array stays valid
        return arr

    def wrap(self, name: str, arr: np.ndarray, what: str) -> None:
        """A local result kept: a DTensor of its layout, or the device's own array."""
        lay = self.layouts.get(name)
        if lay is None:
            self.own[name] = arr
            return
        dt = self.placed(to_torch(arr, self.dtype(lay)).to(self.device), lay)
        self.expect(dt, lay, what)
        self.dts[name] = dt
        self.own[name] = arr

    # -- the stages ---------------------------------------------------------------------------

    def run(self, fault: Mapping[str, Any] | None) -> dict[str, Any]:
        self.place_inputs()
        for kind, item in self.stages:
            if kind == "compute":
                self.compute(item, fault)
            elif kind == "finish":
                self.finish(item[self.rank])
            else:
                self.collective(item)
        outputs = {p.tensor: self.gather(p.tensor, p.local)
                   for p in self.devices[self.rank].outputs}
        return {"outputs": outputs, "checks": self.checks, "native": self.native,
                "ops": self.ops}

    def place_inputs(self) -> None:
        from torch.distributed.tensor import distribute_tensor

        for p in self.devices[self.rank].inputs:
            self.at(f"placing input {p.tensor!r}")
            lay = self.layout(p.local, f"input {p.tensor!r}")
            dtype = self.dtype(lay)
            arr = kernels.to_storage(np.asarray(self.host[p.tensor]), dtype)
            mine = arr[tuple(slice(lo, hi) for lo, hi in p.box)]
            if not self.agrees(lay):  # DTensor would cut it as torch.chunk: the rank's own box
                self.wrap(p.local, mine, "placed input")
                continue
            dt = distribute_tensor(to_torch(arr, dtype).to(self.device), self.dmesh,
                                   self.placements(lay))
            self.expect(dt, lay, "placed input")
            got = to_numpy(dt.to_local(), dtype)
            same = np.array_equal(got, mine, equal_nan=True) if mine.dtype.kind == "f" else \
                np.array_equal(got, mine)
            if not same:
                raise ExecutionError(f"rank {self.rank}: input {p.tensor!r}: "
                                     f"distribute_tensor's shard is not the box {p.box} the "
                                     "schedule places")
            self.dts[p.local] = dt

    def compute(self, keys: Sequence[str], fault: Mapping[str, Any] | None) -> None:
        """This device's launch, op by op; ops every device's launch runs natively (the same
        decision on every rank) run on the DTensors."""
        prog = self.segments[keys[self.rank]]
        natives = self.natives([self.segments[k] for k in keys])
        for op in prog.ops:
            self.at(f"at op {op.name!r}")
            self.ops += 1
            if fault and fault.get("rank") == self.rank and fault.get("op") == op.name:
                if fault.get("how") == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError(f"injected fault at op {op.name!r}")
            out = None
            if op.name in natives:
                try:
                    out = run_native(op, prog, [self.dts[a.tensor] for a in op.ins])
                except NotImplementedError:  # DTensor has no sharding rule for it: local
                    out = None
            name = op.out.tensor
            if out is not None:
                self.native.append(op.name)
                self.expect(out, self.layouts[name], f"op {op.name!r}")
                self.dts[name] = out
                continue
            env = {t: self.local(t, prog.tensor(t).dtype)
                   for t in dict.fromkeys(a.tensor for a in op.ins)}
            self.wrap(name, np.asarray(evaluate_op(op, prog, env)), f"op {op.name!r}")

    def natives(self, programs: Sequence[Program]) -> set[str]:
        """The ops of a compute stage torch runs on DTensors: those of a native form on every
        device whose operands all have layouts DTensor cuts as the schedule does."""
        ops = [{o.name: o for o in p.ops} for p in programs]
        out = set()
        for op in programs[0].ops:
            lays = [self.layouts.get(a.tensor) for a in op.operands]
            if any(lay is None or not self.agrees(lay) for lay in lays):
                continue
            if all(op.name in d and native_form(d[op.name], p) is not None
                   for d, p in zip(ops, programs, strict=True)):
                out.add(op.name)
        return out

    def collective(self, c: Collective) -> None:
        from torch.distributed.tensor import DTensor

        self.at(f"at {c} of tensor {c.tensor!r}")
        src = self.layout(c.source, str(c))
        dst = self.layout(c.result, str(c))
        if c.kind in READS or not (self.agrees(src) and self.agrees(dst)):
            group = self._group(c)
            local = own_collective(c, self.dts[c.source].to_local(), self.rank, group)
            if c.out_dtype != c.dtype:  # the reduced partials, whole: the tensor's dtype
                local = local.to(_torch_dtype(c.out_dtype))
            dt = self.placed(local, dst)
        else:
            dt = self.dts[c.source].redistribute(self.dmesh, self.placements(dst))
            if c.out_dtype != c.dtype:
                dt = dt.to(_torch_dtype(c.out_dtype))
            if c.unpack:
                keys = dt
                index = argmax_index(keys.to_local().cpu().numpy())
                dt = DTensor.from_local(to_torch(index, "int64").to(self.device), self.dmesh,
                                        keys.placements, run_check=False, shape=keys.shape,
                                        stride=keys.stride())
        self.expect(dt, dst, str(c))
        self.dts[c.result] = dt

    def _group(self, c: Collective) -> Any:
        """The process group ``c`` runs over: its mesh axis's; a read across several axes
        (``Collective.axes``) has none in the mesh, and its point-to-point messages (``_read``)
        go over the default group, addressed by global rank, which is the device."""
        if len(c.axes) > 1:
            if c.kind not in READS:
                raise ExecutionError(f"rank {self.rank}: {c}: only a read runs across several "
                                     f"mesh axes ({', '.join(c.axes)})")
            return None
        group = self.dmesh.get_group(c.axis)
        self._check_group(c, group)
        return group

    def _check_group(self, c: Collective, group: Any) -> None:
        import torch.distributed as dist

        ranks = tuple(dist.get_process_group_ranks(group))
        if ranks != c.group(self.rank):
            raise ExecutionError(f"rank {self.rank}: {c}: the mesh's process group along "
                                 f"{c.axis!r} is ranks {ranks}, the schedule's group "
                                 f"{c.group(self.rank)}")

    def finish(self, part: FinishPart) -> None:
        self.at(f"at {part.kind} writing {part.result!r}")
        env = {s: self.local(s, self._dtype_of(s)) for s in part.sources}
        self.wrap(part.result, np.asarray(part.apply(env)), f"finish {part.result!r}")

    def _dtype_of(self, name: str) -> str:
        lay = self.layouts.get(name)
        if lay is not None:
            return self.dtype(lay)
        for prog in self.segments.values():
            if name in prog.tensor_map:
                return prog.tensor(name).dtype
        raise ExecutionError(f"rank {self.rank}: value {name!r} is in no launch")

    def gather(self, tensor: str, local: str) -> np.ndarray:
        """Output ``tensor`` whole (every rank takes part), from the value ``local``."""
        import torch
        import torch.distributed as dist

        self.at(f"gathering output {tensor!r}")
        lay = self.layout(local, f"output {tensor!r}")
        dtype = self.dtype(lay)
        if lay.partial:
            raise ExecutionError(f"output {tensor!r} is left partial ({lay}); an output is "
                                 "whole on every device")
        if self.agrees(lay):
            return to_numpy(self.dts[local].full_tensor(), dtype)
        # DTensor would gather as torch.chunk cut: every rank's box, padded to the largest
        x = self.dts[local].to_local()
        shapes = [box_shape(b) for b in lay.boxes]
        big = tuple(max(s[j] for s in shapes) for j in range(len(shapes[0])))
        padded = x.new_zeros(big)
        padded[tuple(slice(0, n) for n in x.shape)].copy_(x)
        parts = [torch.empty_like(padded) for _ in lay.boxes]
        dist.all_gather(parts, padded)
        whole = np.empty(self.program.tensor(tensor).shape,
                         dtype=kernels.storage_dtype(dtype))
        for part, box, shape in zip(parts, lay.boxes, shapes, strict=True):
            mine = to_numpy(part[tuple(slice(0, n) for n in shape)], dtype)
            whole[tuple(slice(lo, hi) for lo, hi in box)] = mine
        return whole
