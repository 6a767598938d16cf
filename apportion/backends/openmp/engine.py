"""Parallel IR on tensors lowered by upstream MLIR 22 to OpenMP and LLVM, and run on this machine.

``lower_llvm`` takes the text of one ``func.func`` (the iree emitter's ``scf.forall`` IR, no
dialect of IREE's own) through upstream passes: one-shot bufferization across the function
boundary (identity layouts, results made out-parameters the caller allocates: the static ones
are written in place, a run-time-sized one copied into them), each ``scf.forall`` (now without
results) to ``scf.parallel`` (``--scf-forall-to-parallel``) and that to an OpenMP parallel
work-sharing loop (``--convert-scf-to-openmp``), each ``linalg`` op to sequential loops inside
it, the buffers freed by ownership-based deallocation, then everything to the LLVM dialect
(bf16 conversions expanded to integer code, math to intrinsics or libm). ``SEQUENTIAL`` lowers
each forall to ``scf.for`` instead (``--scf-forall-to-for``): the same IR run as one loop.

``Engine`` has that module JIT-compiled by MLIR's execution engine in a worker process
(``backends.openmp.worker``: upstream's Python bindings cannot share a process with IREE's, and
a crash there is an error here), linking the runner library (``memrefCopy``) and the OpenMP
runtime (``libiomp5``: the ``__kmpc_*`` entry points the OpenMP lowering calls), and calls the
function with numpy arrays through its C interface (``_mlir_ciface_NAME``: a pointer to a
memref descriptor per tensor, an ``int64`` per ``index``). The OpenMP team size is set per call
(``omp_set_num_threads``), so one compiled module runs on one thread or on many; a call's time
is measured in the worker, around the call alone.

Element types at the boundary: ``f16``, ``f32``, ``f64``, ``i8``, ``i32``, ``i64`` as numpy
arrays of that type; ``bf16`` as the ``uint16`` bit patterns of apportion's float32 arrays
rounded to bfloat16 (the high half of each float32); ``i1`` as numpy ``bool`` (one byte, as
LLVM stores ``i1``).

>>> text = '''func.func @twice(%x: tensor<4xf32>) -> tensor<4xf32> {
...   %e = tensor.empty() : tensor<4xf32>
...   %r = scf.forall (%i) in (4) shared_outs(%o = %e) -> (tensor<4xf32>) {
...     %v = tensor.extract %x[%i] : tensor<4xf32>
...     %w = arith.addf %v, %v : f32
...     %t = tensor.from_elements %w : tensor<1xf32>
...     scf.forall.in_parallel {
...       tensor.parallel_insert_slice %t into %o[%i] [1] [1] : tensor<1xf32> into tensor<4xf32>
...     }
...   }
...   return %r : tensor<4xf32>
... }'''
>>> import numpy as np
>>> from apportion.mlir import upstream
>>> if upstream.available():
...     out = Engine(text).call("twice", [(np.arange(4, dtype=np.float32), "f32")],
...                             [((4,), "f32")], threads=2)
...     assert out.outputs[0].tolist() == [0.0, 2.0, 4.0, 6.0]
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apportion.backends.openmp.worker import HOST
from apportion.errors import EmitError, ExecutionError
from apportion.mlir import upstream
from apportion.mlir.upstream import expand_as_cast, pipeline, widen_bools
from apportion.runtime.isolated import python_command

#: bufferize the tensor function: its results become out-parameters of the caller's arrays
_BUFFERIZE = ("one-shot-bufferize{bufferize-function-boundaries=1 "
              "function-boundary-type-conversion=identity-layout-map}",
              "buffer-results-to-out-params{hoist-static-allocs=1 modify-public-functions=1}")
#: after the foralls are loops: linalg to loops, buffers freed, the OpenMP loops made, the
#: strided memref metadata expanded (its affine maps lowered before the memrefs that use them)
_TO_MEMREF = ("convert-linalg-to-loops", "ownership-based-buffer-deallocation", "canonicalize",
              "buffer-deallocation-simplification", "bufferization-lower-deallocations",
              "convert-scf-to-openmp")
#: then (bool memrefs widened to bytes: ``widen_bools``; a reshape upstream cannot expand
#: said as a cast: ``expand_as_cast``) everything to LLVM, the strided metadata first. Memref ops
#: become LLVM before scf does: the OpenMP lowering wraps each iteration in a
#: ``memref.alloca_scope`` whose region must stay one block until it is lowered; the OpenMP
#: dialect is converted last, once the index arithmetic in its regions is LLVM's.
_TO_LLVM = ("expand-strided-metadata", "lower-affine", "finalize-memref-to-llvm",
            "convert-scf-to-cf", "arith-expand{include-bf16=1}",
            "convert-math-to-llvm", "convert-math-to-libm", "convert-arith-to-llvm",
            "convert-index-to-llvm", "convert-cf-to-llvm", "convert-func-to-llvm",
            "convert-openmp-to-llvm", "reconcile-unrealized-casts")


@dataclass(frozen=True)
class Lowering:
    """The two pass lists ``lower_llvm`` runs: to loops on memrefs (each forall made parallel
    or sequential), then, bools widened to bytes between the two, to LLVM."""

    name: str
    to_memref: tuple[str, ...]
    to_llvm: tuple[str, ...] = _TO_LLVM


#: each ``scf.forall`` an OpenMP work-sharing loop (the parallel run)
PARALLEL = Lowering("parallel", ("func.func(llvm-request-c-wrappers)", *_BUFFERIZE,
                                 "func.func(scf-forall-to-parallel)", *_TO_MEMREF))
#: each ``scf.forall`` an ``scf.for`` (the same IR run as sequential loops)
SEQUENTIAL = Lowering("sequential", ("func.func(llvm-request-c-wrappers)", *_BUFFERIZE,
                                     "func.func(scf-forall-to-for)", *_TO_MEMREF))

def lower_llvm(text: str, lowering: Lowering = PARALLEL) -> str:
    """``text`` (one or more ``func.func`` on tensors) lowered to the LLVM dialect, as text;
    an ExecutionError carrying upstream's diagnostics when a pass fails. The passes run in
    ``mlir-opt`` processes: an assertion of upstream's (its build has them on) ends that
    process, not this one."""
    upstream.require()  # the missing extra named as such
    try:
        loops = upstream.mlir_opt(text, [f"--pass-pipeline={pipeline(lowering.to_memref)}"])
        return upstream.mlir_opt(widen_bools(expand_as_cast(loops)),
                                      [f"--pass-pipeline={pipeline(lowering.to_llvm)}"])
    except EmitError as e:
        raise ExecutionError(f"openmp backend: upstream MLIR cannot lower the parallel IR "
                             f"({lowering.name}): {_first(str(e))}") from None


def _first(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(lines)[:1500]


def max_threads() -> int:
    """The OpenMP runtime's default team size: ``OMP_NUM_THREADS`` where set, else the cores
    this process may run on.

    >>> max_threads() >= 1
    True
    """
    given = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if given.isascii() and given.isdigit() and int(given) > 0:  # '²' is a digit int() fails on
        return int(given)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def _libraries() -> list[str]:
    """What the compiled code links against: the runner library (``memrefCopy``), then the
    OpenMP runtime (``__kmpc_*``)."""
    omp = upstream.openmp_library()
    if omp is None:
        raise ExecutionError("openmp backend: no OpenMP runtime (libiomp5, the intel-openmp "
                             f"package of the '{upstream.EXTRA}' extra) is installed")
    return [str(upstream.runner_library("mlir_c_runner_utils")), str(omp)]


class Worker:
    """The process that holds the compiled modules (``backends.openmp.worker``: upstream MLIR's
    bindings cannot share a process with IREE's), started on first use and again after it
    ends. ``generation`` counts its starts: a module compiled by an earlier one is gone."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self.generation = 0
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        upstream.require()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - its stderr, kept while it runs
        # a worker that finished its share sleeps at once rather than spinning 200 ms: on a
        # machine of few cores a spinning thread takes the core the code between loops needs
        env = {"KMP_BLOCKTIME": "0", **os.environ}
        self._proc = subprocess.Popen(python_command("-m", "apportion.backends.openmp.worker"),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, env=env)
        self.generation += 1
        return self._proc

    def started(self) -> int:
        """The worker running (started again if it ended): its generation."""
        with self._lock:
            self._start()
            return self.generation

    def ask(self, *request: Any) -> tuple[Any, ...]:
        """Send one request and wait for its answer; an ExecutionError for a failed request
        or a worker that ended (its last words quoted)."""
        with self._lock:
            proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                pickle.dump(request, proc.stdin, protocol=5)
                proc.stdin.flush()
                answer = pickle.load(proc.stdout)
            except (EOFError, BrokenPipeError, pickle.UnpicklingError):
                code = proc.wait()
                self._log.seek(0)
                said = self._log.read().decode(errors="replace").strip().splitlines()
                self._proc = None
                raise ExecutionError(f"openmp backend: the JIT process ended (exit status "
                                     f"{code}) during {request[0]!r}: "
                                     f"{' '.join(said[-3:])[:1500]}") from None
        if answer[0] != "ok":
            raise ExecutionError(f"openmp backend: {request[0]} failed: {answer[1]}")
        return answer[1:]


#: the process's JIT worker
WORKER = Worker()


@dataclass(frozen=True)
class Call:
    """One call: the results (numpy arrays, bfloat16 in float32), seconds it took and CPU
    seconds its threads used meanwhile (``cpu_s / run_s``: the cores busy on average)."""

    outputs: list[np.ndarray]
    run_s: float
    cpu_s: float = 0.0


class Engine:
    """One function's module lowered (``lowering``) here and JIT-compiled at ``opt_level`` in
    the ``WORKER`` process; ``call`` runs it there. Lowering and compiling took ``compile_s``
    seconds."""

    def __init__(self, text: str, lowering: Lowering = PARALLEL, opt_level: int = 3) -> None:
        start = time.perf_counter()
        self._llvm = lower_llvm(text, lowering)
        self._opt_level = opt_level
        self._key = hashlib.sha256(self._llvm.encode()).hexdigest()
        self._generation = -1
        self._compile()
        self.compile_s = time.perf_counter() - start

    def _compile(self) -> None:
        WORKER.ask("compile", self._key, self._llvm, self._opt_level, _libraries())
        self._generation = WORKER.generation

    def call(self, function: str, args: Sequence[tuple[Any, str]],
             results: Sequence[tuple[Sequence[int], str]], threads: int | None = None) -> Call:
        """Call ``function`` with ``args`` (value, element type: ``f16``, ``bf16``, ... or
        ``index``) and give back its results, allocated at the shapes and element types
        ``results`` names; ``threads`` is the OpenMP team size (None: ``max_threads()``)."""
        if threads is not None and threads < 1:
            raise ExecutionError(f"openmp backend: threads must be at least 1, got {threads}")
        if self._generation != WORKER.started():
            self._compile()  # the worker was started again: its modules are gone
        sent = [(v if elt == "index" else _to_host(v, elt), elt) for v, elt in args]
        outs, seconds, cpu = WORKER.ask("call", self._key, function, sent,
                                        [(tuple(shape), elt) for shape, elt in results],
                                        threads if threads is not None else max_threads())
        return Call([_from_host(a, elt) for a, (_, elt) in zip(outs, results, strict=True)],
                    seconds, cpu)

    def drop(self) -> None:
        """Free the module in the worker (a worker started since holds none of it)."""
        if self._generation == WORKER.generation:
            with contextlib.suppress(ExecutionError):  # the worker ended: nothing held
                WORKER.ask("drop", self._key)


def _to_host(value: Any, elt: str) -> np.ndarray:
    if elt not in HOST:
        raise ExecutionError(f"openmp backend: no numpy storage for element type {elt!r}")
    if elt == "bf16":
        bits = np.asarray(value, dtype=np.float32, order="C").view(np.uint32) >> 16
        return np.ascontiguousarray(bits.astype(np.uint16))
    # order="C" keeps a rank-0 array rank 0 (ascontiguousarray makes it rank 1)
    return np.array(value, dtype=HOST[elt], order="C", copy=True)


def _from_host(a: np.ndarray, elt: str) -> np.ndarray:
    if elt == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


class EngineCache:
    """Compiled engines by the sha256 of their text and passes, the ``size`` most recently used
    kept (a JIT-compiled module holds its code in this process)."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str, lowering: Lowering = PARALLEL) -> tuple[Engine, bool]:
        """The engine of ``text`` lowered by ``lowering``, and whether it was cached."""
        key = hashlib.sha256("\0".join((text, *lowering.to_memref, *lowering.to_llvm)
                                       ).encode()).hexdigest()
        with self._lock:
            found = self._engines.get(key)
            if found is not None:
                self._engines.move_to_end(key)
                return found, True
        engine = Engine(text, lowering)
        with self._lock:
            self._engines[key] = engine
            while len(self._engines) > self.size:
                self._engines.popitem(last=False)[1].drop()
        return engine, False


#: the process's engines
ENGINES = EngineCache()
