"""The threaded torch executor: a plan run core slice by core slice with torch kernels.

``run_torch(schedule, inputs, threads)`` runs a plan's schedule (``PlannedProgram.schedule``:
the one lowered form, run-time sizes and symbolic loop counts bound): every launch's boxes at
every iteration of its loops (``Launch.boxes_at``, the boxes the reference executor computes),
checked by ``reference.check_cover`` to cover the op's iteration space once, computed by torch
kernels on torch views of the operands; host steps whole. It reads nothing of the plan
itself. The boxes of one op run concurrently on a pool of ``threads`` threads; ops run in
program order. It gives the reference executor's numbers within the dtype tolerances
(``reference.TOLERANCES``).

The parts: ``tensors`` (how tensors are stored, and strided views of them over boxes),
``steps`` (how one op runs: its kernel, compute dtype and every box's views, a ``Step``),
``batching`` (the schedule as steps, boxes that form lattices batched into one kernel call
each) and this module (running the steps: fallbacks, the combination of split reductions, the
thread pool).

- Split reductions: the partials of one output slice are combined in box order with the
  kind's reducer (``combine`` and ``finish`` run on ``XP``).
- Whole-tensor fallbacks ``gather`` (embeddings), ``reshape``, ``concat``, ``full`` and
  ``arange`` run in torch on one core (``full`` and ``arange``, which read nothing, once per
  executor: a constant); ``cumsum`` and ``flip`` too where they compute in float64 or int64
  (``kernels.SCANS``: numpy's numbers exactly); the other fallbacks (``sort``, ``topk``, a
  float32-computed ``cumsum``, and ``uniform``/``normal``, whose numbers are numpy's
  generator's) run through the reference executor, converting their operands to numpy and
  back.
- Loop nests: an op in a loop group runs all its iterations' boxes (in loop order) before the
  next op starts, rather than op by op inside each iteration: no op reads another's output
  before it is whole either way, so the numbers are the same. A reduction tiled by a loop
  combines each iteration's cores, then the iterations in loop order, as an accumulator does.
  Where tensors live (device memory, scratchpads, tile buffers) does not change a number, so
  the simulated memory of the reference's ``loops.run_schedule``, which checks the plan's
  buffers, is not repeated here. Symbolic loop counts are the schedule's, bound.

Threads: with ``threads`` > 1 each op's boxes are dealt to ``threads`` pool tasks (box ``i`` to
task ``i mod threads``), but for ops with fewer than ``grain`` iteration points per core
(default ``GRAIN``, 2**20; 0: every op): their boxes run one after another on the calling
thread, same boxes, same numbers. Each box holds the GIL for its Python
work (views, dispatch) and releases it inside torch's kernels, so a small box spends its time
passing the GIL between threads: the tiny Llama's ops run 2x slower on two threads than on one
without the grain. A worker sets torch's intra-op threads to 1 (``torch.set_num_threads``)
because the pool *is* the parallelism: ``threads`` workers each starting an OpenMP team of
``torch.get_num_threads()`` would put threads x intra-op threads on ``threads`` cores, where
OpenMP's spinning teams slow each other down. The setting is process-wide in torch (new threads
take it), so a run restores the caller's count when it ends; with ``threads`` = 1 the boxes run
on the calling thread, also with one intra-op thread. Two runs in two threads at once would
race on that setting.

torch is imported with this module; ``import apportion`` and ``apportion.runtime`` do not
import it.

>>> import apportion as ap
>>> from apportion.runtime.reference import compare, random_inputs, run_unplanned
>>> planned = ap.plan(ap.load("examples/attention.json"), ap.targets.spyre(cores=8))
>>> xs = random_inputs(planned.program)
>>> ys = run_torch(planned.lowered, xs, threads=2)
>>> got = {name: from_torch_storage(y) for name, y in ys.items()}
>>> all(c.ok for c in compare(run_unplanned(planned.program, xs), got, planned.program))
True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from apportion.backends.torch.batching import schedule_steps
from apportion.backends.torch.kernels import XP, require_torch, torch
from apportion.backends.torch.steps import Step
from apportion.backends.torch.tensors import (
    cast,
    from_torch_storage,
    shaped,
    strided,
    to_torch_storage,
    torch_dtype,
)
from apportion.errors import ExecutionError
from apportion.ir.kinds import Partial, Reducer
from apportion.ir.program import Program
from apportion.runtime.reference import evaluate_op, run_op_boxes
from apportion.schedule.values import Schedule


def _combine(step: Step, reducer: Reducer, group: Sequence[int], parts: Mapping[int, Partial]
             ) -> Partial:
    """The partials of one output slice combined in box order: a loop iteration's cores
    first, then the iterations into the accumulation, as ``loops.run_schedule`` does (a fixed
    order of float sums)."""
    acc: Partial = None
    cur: Partial = None
    for n, i in enumerate(group):
        if n and step.iters[i] != step.iters[group[n - 1]]:
            acc = cur if acc is None else reducer.combine(XP, acc, cur)
            cur = None
        cur = parts[i] if cur is None else reducer.combine(XP, cur, parts[i])
    return cur if acc is None else reducer.combine(XP, acc, cur)


def _run_boxes(step: Step, env: Mapping[str, Any], out: Any, indices: Sequence[int],
               one_thread: bool) -> list[tuple[int, Partial]]:
    """Compute ``indices``' boxes; returns the partials of boxes that combine with others."""
    if one_thread:
        torch.set_num_threads(1)
    pending = []
    with torch.no_grad():
        for i in indices:
            part = step.box(env, out, i)
            if part is not None:
                pending.append((i, part))
    return pending


# --- whole-tensor fallbacks --------------------------------------------------------------------

def _run_whole(step: Step, env: Mapping[str, Any]) -> Any:
    op = step.op
    assert step.fn is not None
    try:
        res = step.fn(*(shaped(env[n], s) for n, s in zip(step.reads, step.in_shapes,
                                                           strict=True)))
        res = res.reshape(step.out_shape)
    except (IndexError, RuntimeError, ValueError) as e:
        raise ExecutionError(f"op {op.name!r}: {op.kind.name} failed: {e}") from None
    return cast(res, step.out_dtype).contiguous()



def _run_scan(step: Step, env: Mapping[str, Any]) -> Any:
    assert step.fn is not None
    x = shaped(env[step.reads[0]], step.in_shapes[0])
    res = step.fn(x if step.casts[0] is None else x.to(step.casts[0]))
    out = torch.empty(step.out_shape, dtype=step.out_torch)
    step.write(out, step.box_writes[0], strided(res, step.box_reads[0][0]))
    return out


def _run_numpy(step: Step, program: Program, env: Mapping[str, Any]) -> Any:
    """The op through the reference executor: its operands to numpy and the result back."""
    op = step.op
    arrays = {n: from_torch_storage(shaped(env[n], s))
              for n, s in zip(step.reads, step.in_shapes, strict=True)}
    if op.kind.divisible:
        res = run_op_boxes(op, program, arrays, step.boxes)
    else:
        res = evaluate_op(op, program, arrays)
    return to_torch_storage(np.asarray(res), step.out_dtype)


# --- the executor ------------------------------------------------------------------------------

#: iteration points per core below which an op's cores run one after another on the calling
#: thread: handing a task to a pool thread and back, and passing the GIL between the threads,
#: costs more than a kernel this small saves (on a 2-core machine a matmul of 2**19 points per
#: core ran slower on two threads than on one, one of 2**23 1.7x faster)
GRAIN = 1 << 20


@contextlib.contextmanager
def _intra_op_threads(n: int) -> Iterator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


class TorchExecutor:
    """A plan's schedule (bound at its sizes and loop counts) made ready to run with torch: its
    steps (every op's boxes, checked to cover its iteration space once) are built once, and a
    pool of ``threads`` threads is kept for the runs (ops of fewer than ``grain`` points per
    core run on the calling thread). ``run(inputs)`` returns the program's outputs;
    ``close()`` ends the pool (also on ``with``, and when the executor is collected).

    >>> import apportion as ap
    >>> from apportion.runtime.reference import random_inputs
    >>> planned = ap.plan(ap.load("examples/mlp.json"), ap.targets.spyre(cores=8))
    >>> with TorchExecutor(planned.lowered, threads=2) as ex:
    ...     ys = ex.run(random_inputs(planned.program))
    >>> ys["y"].shape, ys["y"].dtype
    (torch.Size([256, 1024]), torch.float16)
    """

    def __init__(self, schedule: Schedule, threads: int = 1, grain: int = GRAIN,
                 batched: bool = True) -> None:
        require_torch()
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ExecutionError(f"threads must be an int >= 1, got {threads!r}")
        if isinstance(grain, bool) or not isinstance(grain, int) or grain < 0:
            raise ExecutionError(f"grain must be an int >= 0, got {grain!r}")
        self.program = program = schedule.program
        self.threads = threads
        self.grain = grain
        #: run an op whose boxes form a lattice (``batching.batched``) as one batched kernel call
        #: where it runs on the calling thread; False: box by box, always
        self.batched = batched
        self._pool: ThreadPoolExecutor | None = None
        #: results of steps with no inputs (``full``, ``arange``), by tensor
        self._constants: dict[str, Any] = {}
        #: each input: name, shape and the torch dtype that stores it
        self._inputs = tuple((n, program.tensor(n).shape, torch_dtype(program.tensor(n).dtype))
                             for n in program.inputs)
        #: the torch steps of the schedule (every op's boxes and views)
        self.steps = schedule_steps(schedule)

    def __enter__(self) -> TorchExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)

    def bind(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The program's inputs checked (every one given, nothing else, right shapes) and held
        as contiguous torch tensors of their dtypes (numpy arrays are taken too)."""
        program = self.program
        extra = [n for n in inputs if n not in program.inputs]
        if extra:
            raise ExecutionError(f"{extra[0]!r} is not an input of program {program.name!r}; "
                                 f"inputs: {', '.join(program.inputs)}")
        env: dict[str, Any] = {}
        for name, shape, dtype in self._inputs:
            if name not in inputs:
                raise ExecutionError(f"input {name!r} of program {program.name!r} is missing")
            value = inputs[name]
            if tuple(value.shape) != shape:
                raise ExecutionError(f"input {name!r} has shape {tuple(value.shape)}, expected "
                                     f"{shape}")
            if isinstance(value, torch.Tensor) and value.dtype == dtype and \
                    value.is_contiguous():  # stored as the executor stores it: read as it is
                env[name] = value.detach() if value.requires_grad else value
            else:
                env[name] = to_torch_storage(value, program.tensor(name).dtype)
        return env

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run the schedule on ``inputs`` (torch tensors or numpy arrays by program input
        name); returns the program's outputs as torch tensors of their dtypes."""
        steps = self.steps
        env = self.bind(inputs)
        batched = self.batched
        with _intra_op_threads(1), torch.no_grad():
            for step in steps:
                if step.lattices and batched and self._pool_for(step) is None:
                    try:  # the common step, without _run_step's dispatch
                        env[step.out] = step.all_boxes(env)
                    except RuntimeError as e:  # a torch kernel refused (shapes, dtypes, bounds)
                        raise ExecutionError(f"op {step.op.name!r}: torch failed: {e}") from None
                else:
                    env[step.out] = self._run_step(step, env)
                for name in step.free:
                    env.pop(name, None)
        outs = {}
        for name in self.program.outputs:
            t = shaped(env[name], self.program.tensor(name).shape)
            # a cached constant is the executor's: the caller gets a copy to keep
            outs[name] = t.clone() if any(t is c for c in self._constants.values()) else t
        return outs

    def _pool_for(self, step: Step) -> ThreadPoolExecutor | None:
        if self.threads == 1:
            return None
        boxes = len(step.boxes)
        if boxes == 1 or step.op.points < self.grain * boxes:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads,
                                            thread_name_prefix="apportion-core")
        return self._pool

    def _run_step(self, step: Step, env: Mapping[str, Any]) -> Any:
        op = step.op
        if step.lattices and self.batched and self._pool_for(step) is None:
            try:
                return step.all_boxes(env)
            except RuntimeError as e:  # a torch kernel refused (shapes, dtypes, bounds)
                raise ExecutionError(f"op {op.name!r}: torch failed: {e}") from None
        if step.mode == "numpy":
            return _run_numpy(step, self.program, env)
        if step.mode == "scan":
            return _run_scan(step, env)
        if step.mode == "whole":
            if step.reads:
                return _run_whole(step, env)
            # a constant (full, arange): made once per executor, as a compiler folds it
            if step.out not in self._constants:
                self._constants[step.out] = _run_whole(step, env)
            return self._constants[step.out]
        pool = self._pool_for(step)
        out = torch.empty(step.out_shape, dtype=step.out_torch)
        n = len(step.boxes)
        try:
            if pool is None:
                pending = _run_boxes(step, env, out, range(n), False)
            else:  # one task per thread: boxes j, j + k, j + 2k, ...
                k = min(self.threads, n)
                runs = [range(j, n, k) for j in range(k)]
                futures = [pool.submit(_run_boxes, step, env, out, r, True) for r in runs]
                pending = [p for f in futures for p in f.result()]
        except RuntimeError as e:  # a torch kernel refused (shapes, dtypes, storage bounds)
            raise ExecutionError(f"op {op.name!r}: torch failed: {e}") from None
        if pending:
            parts = dict(pending)
            reducer = op.kind.reducer
            for g in step.groups:
                if len(g) == 1:
                    continue
                if reducer is None:
                    raise ExecutionError(f"op {op.name!r}: {len(g)} cores computed one slice "
                                         f"of a {op.category} op, which has nothing to combine")
                step.write(out, step.box_writes[g[0]],
                           step.finished(_combine(step, reducer, g, parts)))
        return out


def run_torch(schedule: Schedule, inputs: Mapping[str, Any], threads: int = 1,
              grain: int = GRAIN) -> dict[str, Any]:
    """Run ``schedule`` (a plan's, bound at its sizes and loop counts) core slice by core
    slice with torch kernels, the cores of each op on ``threads`` threads (those of ops with
    fewer than ``grain`` iteration points per core on the calling thread); returns the
    program's outputs as torch tensors (see the module docstring)."""
    with TorchExecutor(schedule, threads, grain) as ex:
        return ex.run(inputs)
