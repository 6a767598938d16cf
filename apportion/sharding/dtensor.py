"""A sharding plan executed on ``torch.distributed``: one process per device, DTensors placed
and redistributed as the plan says, checked against the reference executor.

``run_dtensor(plan)`` starts one process per mesh device (``spawn``; the ``gloo`` backend on
the CPU over loopback, or ``nccl`` with one GPU per rank where the machine has a GPU per device:
``device="auto"``, or ``cpu`` / ``cuda`` to choose), each builds a ``DeviceMesh`` of the
plan's mesh (same axis names and shape; device ``d`` is rank ``d``, row-major), and then, on
every rank:

* places each input with ``distribute_tensor`` in its planned placements (``Shard(dim)`` where
  an axis splits a dim, ``Replicate()`` elsewhere) and checks the local shard is the one the
  plan cuts (``Sharding.block``);
* runs the schedule of ``unroll``: each resharding step as ``DTensor.redistribute`` to the
  step's placements (``Partial(reduce_op)`` for pending reductions, the registry's
  ``DeviceCombine.collective`` of the reducer they wait on: ``sum``, ``max``, ``min``,
  ``product``; an ``any`` waits as ``max`` over 0/1 bytes, an ``argmax`` as ``max`` over its
  packed int64 keys, unpacked to indices on each rank by the step that reduces its last
  partial axis), and each op either as torch ops on the DTensors themselves (2-D and batched
  matmuls; pointwise kinds whose operands are read alike, by the registry's formula on the
  torch namespace), whose own sharding propagation must then give the planned placement, or
  on the local shards with the rank's per-device ops and finish (``rules.local_ops``: the
  numpy reference; a mean or argmax split over devices ends with its ``Finish``) wrapped back
  with ``DTensor.from_local``;
* asserts after every step and op that the DTensor's placements, global shape and local shape
  are the planned ones;
* gathers every output (``full_tensor``); rank 0 hands them back to the parent, which compares
  them with the reference executor's run of the unsharded program.

Uneven shards: apportion cuts a dim over devices as it cuts work over cores (10 over 4 is
3, 3, 2, 2; ``spec.chunk``), while DTensor's ``Shard`` assumes ``torch.chunk``'s cut (3, 3, 3,
1) wherever it cuts or gathers. Where the two differ for a tensor (``spec.chunk_agrees``), the
rank places its own block with ``DTensor.from_local`` and an explicit global shape and
stride, runs each resharding step itself on the local shards over the mesh axis's process
group (``own_step``: an all-gather of shards padded to the largest and trimmed, an
all-reduce, then the local cut of its block; a reduce-scatter is an all-reduce then the cut,
an all-to-all an all-gather then the cut), runs the op on its local shards, and gathers an
output by those steps too. So every plan the reference runs, uneven meshes included, runs
here; only the placements stay DTensor's.

A failure on one rank (an exception, a killed process) ends the whole run with an
``ExecutionError`` naming the root-cause rank, the op it was at and the error. A rank that raises
writes a failure record (``RankFailure``: its wall-clock time, where it was, the error, and
whether the error is only a consequence of a peer dying or hanging: a connection reset, closed
or refused, a broken pipe, a timed-out collective, ``is_peer_error``); a rank that dies without
one (a signal, an exit status) is dated when the parent sees it exit. Once one rank has failed
the parent keeps collecting until every rank has exited or ``GRACE_S`` has passed (a rank
SIGKILLed mid-collective leaves its peers a reset connection, so they end promptly), then stops
the rest and names ``root_cause``: the earliest failure of a rank's own (an exception or a
signal) over every peer that only saw a broken connection, which is named only when nothing
else failed, as torchrun's elastic agent picks the first failure by timestamp. A run that
outlives ``timeout_s`` is killed the same way; the process group's own timeout is as long, so a
rank blocked in a collective never waits for ever. ``fault`` injects a failure on one rank at
one op (``raise`` or ``kill``), for tests. The ranks meet through a file store in the run's
temporary folder (no TCP port is picked and then raced for), and that folder is removed when
the run ends, whether it succeeds, fails, times out or is interrupted.

A plan on a mesh with symbolic axis sizes runs once they are bound (``sizes``, as ``unroll``
takes them); an unbound one is refused before any process starts.

Needs the ``torch`` extra. A dim split over several axes must list them in mesh order (PyTorch
nests the cuts of several mesh dims on one tensor dim in mesh order). Peered axes run the same
collectives (gloo has no remote reads).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from apportion.backends.limits import cite
from apportion.errors import ExecutionError, TargetError
from apportion.frontend.json_format import dumps, loads
from apportion.ir.kinds import FLOATS, REDUCERS, Category
from apportion.ir.op import Op
from apportion.ir.program import Program
from apportion.runtime import kernels
from apportion.runtime.reference import (
    OutputCheck,
    compare,
    evaluate_op,
    random_inputs,
    run_unplanned,
)
from apportion.sharding.collectives import Step, argmax_index, keyed, steps
from apportion.sharding.plan import ShardingPlan
from apportion.sharding.rules import local_ops
from apportion.sharding.spec import Sharding, chunk_agrees
from apportion.sharding.unroll import _schedule, _step_names

#: DTensor's ``Partial`` reduce op for each elementwise combine of a collective
#: (``DeviceCombine.collective`` in the registry)
_TORCH_REDUCE = {"sum": "sum", "prod": "product", "max": "max", "min": "min"}


@dataclass(frozen=True)
class DistRun:
    """What a distributed run gave: the outputs gathered on rank 0, the placement checks one
    rank made (inputs, steps and ops), the ops torch ran on DTensors (its propagation checked
    against the plan) and the wall time."""

    outputs: dict[str, np.ndarray]
    placement_checks: int
    native_ops: tuple[str, ...]
    wall_s: float
    #: the process group's backend: ``gloo`` (CPU) or ``nccl`` (one GPU per rank)
    backend: str = "gloo"


def check_plan(plan: ShardingPlan) -> None:
    """Refuse what PyTorch's DTensor cannot express: a dim split over axes out of mesh order."""
    order = {a: i for i, a in enumerate(plan.mesh.names)}
    shardings: list[tuple[str, Sharding]] = list(plan.inputs)
    shardings += [(o.op, s) for o in plan.ops for s in (*o.strategy.ins, o.strategy.out)]
    shardings += [(t.tensor, s.dst) for t in plan.transfers for s in t.steps]
    for what, s in shardings:
        for i, axes in enumerate(s.dims):
            if list(axes) != sorted(axes, key=order.__getitem__):
                raise ExecutionError(f"{what}: dim {i} is split over {'*'.join(axes)}, not in "
                                     f"mesh order ({', '.join(plan.mesh.names)}); DTensor nests "
                                     "the cuts of one dim in mesh order "
                                     f"{cite('dtensor-axes-in-mesh-order')}")


def run_dtensor(plan: ShardingPlan, inputs: Mapping[str, Any] | None = None, seed: int = 0,
                timeout_s: float = 120.0, fault: Mapping[str, Any] | None = None,
                sizes: Mapping[str, int] | None = None, device: str = "auto") -> DistRun:
    """Run ``plan`` on ``torch.distributed`` (see the module docstring); returns the outputs.
    ``sizes`` binds the symbolic axis sizes of its mesh; ``device`` is ``cpu`` (gloo),
    ``cuda`` (nccl, one GPU per rank) or ``auto`` (cuda where there is a GPU per rank)."""
    return run_dtensor_many([plan], [inputs], seed, timeout_s, fault, sizes, device)[0]


def resolve_device(device: str, world: int) -> str:
    """``cpu`` or ``cuda`` for ``world`` ranks: ``auto`` takes cuda when there is a GPU per
    rank; an explicit ``cuda`` without enough GPUs is an error naming the counts."""
    if device not in ("auto", "cpu", "cuda"):
        raise ExecutionError(f"device {device!r}: expected auto, cpu or cuda")
    if device == "cpu":
        return device
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cuda" and gpus < world:
        raise ExecutionError(f"device cuda: the mesh has {world} devices, one process each, "
                             f"but this machine has {gpus} GPU{'s' if gpus != 1 else ''}")
    return "cuda" if gpus >= world else "cpu"


def run_dtensor_many(plans: Sequence[ShardingPlan],
                     inputs: Sequence[Mapping[str, Any] | None] | None = None, seed: int = 0,
                     timeout_s: float = 120.0, fault: Mapping[str, Any] | None = None,
                     sizes: Mapping[str, int] | None = None, device: str = "auto"
                     ) -> list[DistRun]:
    """Several plans over meshes of one device count, one after another in one launch of the
    processes (PyTorch is imported once per rank); ``sizes`` binds each one's mesh (the sizes
    it names)."""
    given = dict(sizes or {})
    known = {s for p in plans for s in p.mesh.symbols}
    if set(given) - known:
        name = sorted(set(given) - known)[0]
        raise TargetError(f"no mesh of the plans has a symbolic size {name!r}")
    plans = [p.bind({k: v for k, v in given.items() if k in p.mesh.symbols}) for p in plans]
    try:
        import torch.multiprocessing as mp
    except ImportError:
        raise ExecutionError("the dtensor backend needs PyTorch: install the torch extra "
                             f"(pip install -e '.[torch]') {cite('needs-pytorch')}") from None
    if not plans:
        return []
    world = plans[0].mesh.devices
    device = resolve_device(device, world)
    jobs = []
    for k, plan in enumerate(plans):
        check_plan(plan)
        if plan.mesh.devices != world:
            raise ExecutionError(f"plans of one launch need one device count: "
                                 f"{plan.mesh.devices} != {world}")
        given = None if inputs is None else inputs[k]
        xs = random_inputs(plan.program, seed) if given is None else given
        jobs.append({"program": dumps(plan.program), "plan": plan.to_dict(), "mesh": plan.mesh,
                     "target": plan.target,
                     "inputs": {n: np.asarray(v) for n, v in xs.items()}})
    tmp = Path(tempfile.mkdtemp(prefix="apportion-dtensor-"))
    procs: list[Any] = []
    start = time.monotonic()
    # everything after mkdtemp is inside the try: the folder goes whatever ends the run (an
    # error, the timeout, Ctrl-C while the ranks start or run)
    try:
        payload = tmp / "payload.pkl"
        with payload.open("wb") as f:
            pickle.dump({"jobs": jobs, "fault": dict(fault) if fault else None}, f)
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_worker, args=(r, world, str(payload), str(tmp), timeout_s,
                                                   device), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        _watch(procs, tmp, start + timeout_s, timeout_s,
               ", ".join(repr(p.program.name) for p in plans))
        with (tmp / "result.pkl").open("rb") as f:
            results = pickle.load(f)
    finally:
        try:
            _stop(procs)
        finally:  # a second Ctrl-C while the ranks are stopped still removes the folder
            shutil.rmtree(tmp, ignore_errors=True)
    wall = time.monotonic() - start
    backend = "nccl" if device == "cuda" else "gloo"
    return [DistRun(r["outputs"], r["checks"], tuple(r["native"]), wall, backend)
            for r in results]


def _stop(procs: Sequence[Any]) -> None:
    """Kill and reap every started rank, so none writes into the run's folder once it is
    removed (a process never started has no pid and nothing to stop)."""
    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.kill()
    for p in started:
        p.join(timeout=5)


#: seconds the parent keeps collecting the other ranks' failures after the first it sees: a
#: rank that raised has written its record before it exits, and its peers see the broken
#: connection at once, so this bounds only a peer busy outside any collective (then stopped)
GRACE_S = 5.0

#: what a rank raises when a peer died or hung rather than for a fault of its own (gloo's and
#: NCCL's texts for a closed or reset connection, a broken pipe, a timed-out collective)
_PEER_TEXT = re.compile(
    r"connection (reset|closed|refused|aborted)|closed by peer|broken pipe|tim(ed|ing) out|"
    r"socket closed|end of file|communicator was aborted|remote process exited", re.IGNORECASE)
_PEER_TYPES = frozenset({"ConnectionError", "TimeoutError", "DistNetworkError",
                         "DistStoreError"})


def is_peer_error(types: Sequence[str], message: str) -> bool:
    """Whether an exception (the names of its class and bases, its message) is only what a
    rank saw of a peer dying or hanging: a connection error, a store or network error, or a
    backend error whose text says the connection broke or a collective timed out."""
    return bool(_PEER_TYPES.intersection(types)) or bool(_PEER_TEXT.search(message))


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure as the parent collected it: from the rank's own record (``error``,
    ``peer``) or, for a rank that left none, from its exit status (``exitcode``, negative for
    a signal). ``time`` is wall-clock seconds: when the rank recorded it, or when the parent saw
    the rank exit (no later than that for a signal)."""

    rank: int
    time: float
    where: str = ""
    #: ``Type: message`` (its first line) of what the rank raised
    error: str | None = None
    #: the error is a consequence of a peer dying or hanging (``is_peer_error``)
    peer: bool = False
    exitcode: int | None = None

    def describe(self) -> str:
        """``failed at op 'x': Type: message``, ``was killed by signal SIGKILL at op 'x'`` or
        ``exited with status 3 at op 'x'``."""
        at = f" {self.where}" if self.where else ""
        if self.error is not None:
            return f"failed{at}: {self.error}"
        code = self.exitcode if self.exitcode is not None else 1
        if code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = str(-code)
            return f"was killed by signal {sig}{at}"
        return f"exited with status {code}{at}"


def root_cause(failures: Sequence[RankFailure]) -> RankFailure:
    """The failure to report: the earliest of those a rank had on its own (an exception of its
    own, a signal, an exit status), and only when there is none the earliest peer error; equal
    times go to the lower rank. A peer error dated before a kill still loses to it: the killed
    rank was dated when the parent saw it exit, and its peers broke because it did."""
    if not failures:
        raise ValueError("root_cause needs at least one failure")
    return min(failures, key=lambda f: (f.peer, f.time, f.rank))


def _watch(procs: list[Any], tmp: Path, deadline: float, timeout_s: float, name: str) -> None:
    """Wait for every rank; once one fails, collect the others' failures (every rank exited or
    ``GRACE_S`` passed), stop the rest and raise naming the root cause; at the deadline, stop
    every rank and raise."""
    from multiprocessing.connection import wait

    seen: dict[int, float] = {}  # failed rank -> wall-clock time the parent saw it exit
    first: float | None = None
    while True:
        codes = [0 if c not in (None, 0) and (tmp / f"rank{r}.done").exists() else c
                 for r, c in enumerate(p.exitcode for p in procs)]
        now = time.time()
        for r, c in enumerate(codes):
            if c not in (None, 0):
                seen.setdefault(r, now)
        if seen:
            first = time.monotonic() if first is None else first
            if all(c is not None for c in codes) or time.monotonic() > first + GRACE_S:
                _stop(procs)
                # a rank stopped here after writing its record (it was on its way out) counts
                recorded = {r for r in range(len(procs)) if (tmp / f"rank{r}.err").exists()}
                failures = [_failure(tmp, r, codes[r], seen.get(r, now))
                            for r in sorted(seen.keys() | recorded)]
                f = root_cause(failures)
                note = (" (an error of communication with a peer, and no rank failed on its "
                        "own)" if f.peer else "")
                raise ExecutionError(f"dtensor run of {name}: rank {f.rank} of {len(procs)} "
                                     f"{f.describe()}{note}; the other ranks were stopped")
        elif all(c == 0 for c in codes):
            return
        elif time.monotonic() > deadline:
            alive = [r for r, c in enumerate(codes) if c is None]
            _stop(procs)
            raise ExecutionError(f"dtensor run of {name} timed out after {timeout_s:g} s; "
                                 f"ranks {alive} were still running and were stopped")
        # woken at once when a rank exits (its time is then close to its death); the timeout
        # picks up the .done marks and the deadlines
        wait([p.sentinel for p, c in zip(procs, codes, strict=True) if c is None], 0.05)


def _failure(tmp: Path, rank: int, code: int | None, seen: float) -> RankFailure:
    """A rank's failure from its record, or else from its exit status and last position."""
    err = tmp / f"rank{rank}.err"
    if err.exists():
        rec = json.loads(err.read_text())
        return RankFailure(rank, float(rec["time"]), rec["where"], rec["error"],
                           is_peer_error(rec["types"], rec["message"]))
    where = tmp / f"rank{rank}.at"
    at = where.read_text().strip() if where.exists() else ""
    return RankFailure(rank, seen, at, exitcode=code)


def _write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: the parent reads it while the rank runs or dies."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)


# --- one rank -------------------------------------------------------------------------------

def _placements(s: Sharding, mesh_names: tuple[str, ...]) -> list[Any]:
    from torch.distributed.tensor import Partial, Replicate, Shard

    out: list[Any] = []
    for a in mesh_names:
        if a in s.partial:
            assert s.reducer is not None
            out.append(Partial(_TORCH_REDUCE[_collective(s.reducer)]))
        elif s.dim_of(a) is not None:
            out.append(Shard(s.dim_of(a)))  # type: ignore[arg-type]
        else:
            out.append(Replicate())
    return out


def _collective(reducer: str) -> str:
    """The elementwise combine a collective reduction of partials waiting on ``reducer`` uses
    (the registry's ``DeviceCombine.collective``)."""
    across = REDUCERS[reducer].across_devices
    assert across is not None, f"partials cannot wait on {reducer!r}"  # Sharding refuses it
    return across.collective


def torch_agrees(s: Sharding, shape: Sequence[int], sizes: Mapping[str, int]) -> bool:
    """Whether DTensor's ``Shard`` (``torch.chunk``'s cut) holds every device's block of a
    tensor of ``shape`` laid out as ``s``, as apportion cuts it (``spec.chunk_agrees``): then
    DTensor may place, redistribute and gather it itself.

    >>> torch_agrees(Sharding((("tp",), ())), (10, 3), {"tp": 4})
    False
    >>> torch_agrees(Sharding((("tp",), ())), (8, 3), {"tp": 4})
    True
    """
    return all(chunk_agrees(n, axes, sizes) for n, axes in zip(shape, s.dims, strict=True))


def _stride(shape: Sequence[int]) -> tuple[int, ...]:
    """The row-major stride of a tensor of ``shape`` (a DTensor's global stride)."""
    return tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))


def own_step(step: Step, local: Any, shape: Sequence[int], coords: Mapping[str, int],
             sizes: Mapping[str, int], group: Any) -> Any:
    """``step`` run by this rank on its local shard ``local`` (a torch tensor of its block of
    a tensor of ``shape`` under ``step.src``) over ``group``, the process group of the ranks
    along ``step.axis`` in coordinate order; returns its block under ``step.dst``. Shards are
    cut as apportion cuts them (``Sharding.block``), so uneven ones need no ``torch.chunk``
    (see the module docstring): an all-gather pads every shard to the largest and trims each
    after, a reduction is an all-reduce, and a reduce-scatter, an all-to-all or a slice end
    with the local cut of the rank's block."""
    import torch
    import torch.distributed as dist

    have = list(step.src.block(shape, coords, sizes))
    want = step.dst.block(shape, coords, sizes)
    x = local
    if step.kind in ("all_gather", "all_to_all"):
        assert step.dim is not None
        n = sizes[step.axis]
        blocks = [step.src.block(shape, {**coords, step.axis: k}, sizes)[step.dim]
                  for k in range(n)]
        widths = [hi - lo for lo, hi in blocks]
        padded = x.new_zeros(*x.shape[:step.dim], max(widths), *x.shape[step.dim + 1:])
        padded.narrow(step.dim, 0, x.shape[step.dim]).copy_(x)
        parts = [torch.empty_like(padded) for _ in range(n)]
        dist.all_gather(parts, padded, group=group)
        x = torch.cat([p.narrow(step.dim, 0, w) for p, w in zip(parts, widths, strict=True)],
                      dim=step.dim)
        have[step.dim] = (blocks[0][0], blocks[-1][1])
    elif step.kind in ("all_reduce", "reduce_scatter"):
        assert step.reducer is not None
        op = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
              "min": dist.ReduceOp.MIN}[_collective(step.reducer)]
        x = x.contiguous().clone()
        dist.all_reduce(x, op=op, group=group)
        if keyed(step.reducer) and not step.dst.partial:  # the keys fully reduced
            x = torch.from_numpy(argmax_index(x.cpu().numpy())).to(local.device)
    for j, ((lo, hi), (wlo, whi)) in enumerate(zip(have, want, strict=True)):
        if (lo, hi) != (wlo, whi):  # the rank's block of what it now holds
            assert lo <= wlo and whi <= hi, (step, have, want)
            x = x.narrow(j, wlo - lo, whi - wlo)
    return x.contiguous()


def _torch_dtype(dtype: str) -> Any:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "int8": torch.int8, "int32": torch.int32, "int64": torch.int64,
            "bool": torch.uint8}[dtype]


def _to_torch(a: np.ndarray, dtype: str) -> Any:
    import torch

    # ascontiguousarray makes a 0-d array 1-d: a model's scalar constants keep their shape ()
    shape = np.shape(a)
    if dtype == "bool":
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8).reshape(shape))
    return torch.from_numpy(np.ascontiguousarray(a).reshape(shape)).to(_torch_dtype(dtype))


def _to_numpy(t: Any, dtype: str) -> np.ndarray:
    t = t.cpu()  # a GPU rank's tensors (nccl) come to the host to be compared
    if dtype == "bool":
        return t.numpy().astype(bool)
    if dtype == "bfloat16":
        return t.float().numpy()
    return t.numpy()


def _native(op: Op, program: Program, ins: list[Any]) -> Any | None:
    """Torch ops run on the DTensors themselves, when ``op`` is a matmul torch has or a
    pointwise kind (the registry's formula on the torch namespace, in float32; its own sharding
    propagation places the result); None otherwise."""
    import torch

    if any(e.single_dim is None for a in op.operands for e in a.index):
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
            return torch.matmul(ins[0], ins[1])
        if len(x) == 3 and len(w) == 3 and x[0] == w[0] and x[2] == w[1] and \
                out == (x[0], x[1], w[2]):
            return torch.matmul(ins[0], ins[1])
        return None
    # a kind with no input makes no DTensor, and one reading truth values needs them as bools
    if kind.category is not Category.POINTWISE or kind.compute is None or not op.ins or \
            kind.conditions or any(d != dims[-1] for d in dims):
        return None
    from apportion.backends.torch.executor import XP  # torch under numpy's names

    wide = [t.to(torch.float32) for t in ins]  # as the reference, not in float16
    res = kind.compute(XP, *wide, **kind.numeric_attrs(dict(op.attrs)))
    return res.to(_torch_dtype(program.tensor(op.out.tensor).dtype))


def _worker(rank: int, world: int, payload: str, outdir: str, timeout_s: float,
            device: str = "cpu") -> None:
    where = "before the first op"

    def at(w: str) -> None:
        nonlocal where
        where = w
        # read by the parent if this rank dies
        _write_atomic(Path(outdir, f"rank{rank}.at"), w)

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
        results = []
        for job in data["jobs"]:
            program = loads(job["program"])
            plan = ShardingPlan.from_dict(job["plan"], program, job["mesh"], job["target"])
            results.append(_run_rank(rank, plan, job["inputs"], data["fault"], at, device))
        if rank == 0:
            tmp = Path(outdir) / "result.tmp"
            with tmp.open("wb") as f:
                pickle.dump(results, f)
            tmp.rename(Path(outdir) / "result.pkl")
        dist.barrier()
        # every rank is past its last collective: what teardown does now cannot change the
        # result (gloo's threads have aborted a rank's exit under load), so the parent counts
        # a rank with this mark as done whatever its exit status
        Path(outdir, f"rank{rank}.done").write_text("")
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent
        _record_failure(outdir, rank, where, e)
        os._exit(1)


def _record_failure(outdir: str, rank: int, where: str, e: BaseException) -> None:
    """Write the rank's failure record (``rank{r}.err``, read by ``_failure``)."""
    # dated before anything else: the parent orders the ranks' failures by this time
    now = time.time()
    last = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
    record = {"time": now, "where": where, "error": last, "message": str(e),
              "types": [c.__name__ for c in type(e).__mro__],
              "traceback": "".join(traceback.format_exception(e))}
    _write_atomic(Path(outdir, f"rank{rank}.err"), json.dumps(record))


def _run_rank(rank: int, plan: ShardingPlan, host: Mapping[str, np.ndarray],
              fault: Mapping[str, Any] | None, at: Any, device: str = "cpu") -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor

    program, mesh = plan.program, plan.mesh
    names = mesh.names
    dmesh = init_device_mesh(device, mesh.shape, mesh_dim_names=names)
    coords = mesh.coords(rank)
    sizes = {a.name: a.size for a in mesh.axes}
    env: dict[str, Any] = {}
    checks = 0

    def agrees(s: Sharding, tensor: str) -> bool:
        return torch_agrees(s, program.tensor(tensor).shape, sizes)

    def placed(local: Any, s: Sharding, tensor: str) -> Any:
        """This rank's block as a DTensor of the planned placements, global shape given."""
        full = program.tensor(tensor).shape
        return DTensor.from_local(local, dmesh, _placements(s, names), run_check=False,
                                  shape=torch.Size(full), stride=_stride(full))

    def by_steps(dt: Any, st: Step, tensor: str) -> Any:
        """``st`` run by this rank itself (uneven shards DTensor would cut as torch.chunk)."""
        local = own_step(st, dt.to_local(), program.tensor(tensor).shape, coords, sizes,
                         dmesh.get_group(st.axis))
        return placed(local, st.dst, tensor)

    def expect(dt: Any, s: Sharding, tensor: str, what: str) -> None:
        nonlocal checks
        t = program.tensor(tensor)
        want = tuple(_placements(s, names))
        local = s.local_shape(t.shape, coords, sizes)
        if tuple(dt.placements) != want or tuple(dt.shape) != t.shape or \
                tuple(dt.to_local().shape) != local:
            raise ExecutionError(f"rank {rank}: {what}: tensor {tensor!r} is "
                                 f"{tuple(dt.placements)} of shape {tuple(dt.shape)} (local "
                                 f"{tuple(dt.to_local().shape)}); the plan says {want} "
                                 f"({s}), local {local}")
        checks += 1

    for name, s in plan.inputs:
        t = program.tensor(name)
        at(f"placing input {name!r}")
        arr = kernels.to_storage(np.asarray(host[name]), t.dtype)
        block = s.block(t.shape, coords, sizes)
        mine = arr[tuple(slice(lo, hi) for lo, hi in block)]
        if not agrees(s, name):  # DTensor would cut it as torch.chunk: this rank's own block
            env[name] = placed(_to_torch(mine, t.dtype).to(device), s, name)
            expect(env[name], s, name, "placed input")
            continue
        dt = distribute_tensor(_to_torch(arr, t.dtype).to(device), dmesh,
                               _placements(s, names))
        expect(dt, s, name, "placed input")
        if not np.array_equal(_to_numpy(dt.to_local(), t.dtype), mine, equal_nan=True) \
                if mine.dtype.kind == "f" else \
                not np.array_equal(_to_numpy(dt.to_local(), t.dtype), mine):
            raise ExecutionError(f"rank {rank}: input {name!r}: distribute_tensor's shard is "
                                 f"not the block {block} the plan cuts")
        env[name] = dt
    native: list[str] = []
    for what, item in _schedule(plan):
        if what == "step":
            tr, k = item
            step: Step = tr.steps[k]
            src, dst = _step_names(tr, k)
            at(f"at {step} of tensor {tr.tensor!r}")
            if not (agrees(step.src, tr.tensor) and agrees(step.dst, tr.tensor)):
                env[dst] = by_steps(env[src], step, tr.tensor)
                expect(env[dst], step.dst, tr.tensor, str(step))
                continue
            env[dst] = env[src].redistribute(dmesh, _placements(step.dst, names))
            if step.reducer is not None and keyed(step.reducer) and not step.dst.partial:
                keys = env[dst]
                env[dst] = DTensor.from_local(
                    torch.from_numpy(argmax_index(keys.to_local().cpu().numpy())).to(device),
                    dmesh,
                    keys.placements, run_check=False, shape=keys.shape, stride=keys.stride())
            expect(env[dst], step.dst, tr.tensor, str(step))
            continue
        op = program.ops[item]
        shard = plan.ops[item]
        at(f"at op {op.name!r}")
        if fault and fault.get("rank") == rank and fault.get("op") == op.name:
            if fault.get("how") == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault at op {op.name!r}")
        ins = [env[r] for r in shard.reads]
        out = None
        # DTensor's propagation cuts as torch.chunk: uneven operands run on the local shards
        even = all(agrees(s, a.tensor) for s, a in
                   zip((*shard.strategy.ins, shard.strategy.out), op.operands, strict=True))
        try:
            out = _native(op, program, ins) if even else None
        except NotImplementedError:  # DTensor has no sharding rule for it: local shards
            out = None
        if out is not None:
            native.append(op.name)
        else:
            lops, types, finish = local_ops(op, program, mesh, shard.strategy, coords,
                                            shard.reads)
            local_env = {r: _to_numpy(env[r].to_local(), types[r].dtype)
                         for r in dict.fromkeys(shard.reads)}
            for lop in lops:
                ins = tuple(dict.fromkeys(a.tensor for a in lop.ins))
                lprog = Program("local", tuple(types[n] for n in (*ins, lop.out.tensor)), ins,
                                (lop.out.tensor,), (lop,))
                local_env[lop.out.tensor] = np.asarray(evaluate_op(lop, lprog, local_env))
            res = finish.run(local_env) if finish is not None else local_env[op.out.tensor]
            dtype = program.tensor(op.out.tensor).dtype
            out = placed(_to_torch(res, dtype).to(device), shard.strategy.out, op.out.tensor)
        expect(out, shard.strategy.out, op.out.tensor, f"op {op.name!r}")
        env[op.out.tensor] = out
    outputs = {}
    for name, s, local in plan.outputs:
        at(f"gathering output {name!r}")
        t = program.tensor(name)
        if agrees(s, name):
            outputs[name] = _to_numpy(env[local].full_tensor(), t.dtype)
            continue
        dt = env[local]  # gathered by this rank's own steps: DTensor's would cut as torch.chunk
        for st in steps(t.shape, t.dtype, s, Sharding.replicated(t.rank), mesh):
            dt = by_steps(dt, st, name)
        outputs[name] = _to_numpy(dt.to_local(), t.dtype)
    return {"outputs": outputs, "checks": checks, "native": native}


def check_dtensor(plan: ShardingPlan, seed: int = 0, timeout_s: float = 120.0,
                  fault: Mapping[str, Any] | None = None, sizes: Mapping[str, int] | None = None,
                  device: str = "auto") -> tuple[list[OutputCheck], DistRun]:
    """Run ``plan`` on ``torch.distributed`` with random inputs and compare every output with
    the reference executor's run of the unsharded program (``sizes``: as ``run_dtensor``)."""
    return check_dtensor_many([plan], seed, timeout_s, fault, sizes, device)[0]


def check_dtensor_many(plans: Sequence[ShardingPlan], seed: int = 0, timeout_s: float = 120.0,
                       fault: Mapping[str, Any] | None = None,
                       sizes: Mapping[str, int] | None = None, device: str = "auto"
                       ) -> list[tuple[list[OutputCheck], DistRun]]:
    """``check_dtensor`` of several plans in one launch."""
    inputs = [random_inputs(p.program, seed) for p in plans]
    runs = run_dtensor_many(plans, inputs, seed, timeout_s, fault, sizes, device)
    return [(compare(run_unplanned(p.program, xs), run.outputs, p.program), run)
            for p, xs, run in zip(plans, inputs, runs, strict=True)]
