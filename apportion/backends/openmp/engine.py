"""Parallel IR on tensors lowered by upstream MLIR 22 to OpenMP and LLVM, and run in this process.

``lower_llvm`` takes the text of one ``func.func`` (the iree emitter's ``scf.forall`` IR, no
dialect of IREE's own) through upstream passes: one-shot bufferization across the function
boundary (identity layouts, results made out-parameters the caller allocates: the static ones
are written in place, a run-time-sized one copied into them), each ``scf.forall`` (now without
results) to ``scf.parallel`` (``--scf-forall-to-parallel``) and that to an OpenMP parallel
work-sharing loop (``--convert-scf-to-openmp``), each ``linalg`` op to sequential loops inside
it, the buffers freed by ownership-based deallocation, then everything to the LLVM dialect
(bf16 conversions expanded to integer code, math to intrinsics or libm). ``SEQUENTIAL`` lowers
each forall to ``scf.for`` instead (``--scf-forall-to-for``): the same IR run as one loop.

``Engine`` JIT-compiles that module with MLIR's execution engine, linking the runner library
(``memrefCopy``) and the OpenMP runtime (``libiomp5``: the ``__kmpc_*`` entry points the
OpenMP lowering calls), and calls the function with numpy arrays through its C interface
(``_mlir_ciface_NAME``: a pointer to a memref descriptor per tensor, an ``int64`` per
``index``). The OpenMP team size is set per call (``omp_set_num_threads``), so one compiled
module runs on one thread or on many.

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
>>> from apportion.runtime import upstream_mlir
>>> if upstream_mlir.available():
...     out = Engine(text).call("twice", [(np.arange(4, dtype=np.float32), "f32")],
...                             [((4,), "f32")], threads=2)
...     assert out.outputs[0].tolist() == [0.0, 2.0, 4.0, 6.0]
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from apportion.errors import EmitError, ExecutionError
from apportion.runtime import upstream_mlir

#: bufferize the tensor function: its results become out-parameters of the caller's arrays
_BUFFERIZE = ("one-shot-bufferize{bufferize-function-boundaries=1 "
              "function-boundary-type-conversion=identity-layout-map}",
              "buffer-results-to-out-params{hoist-static-allocs=1 modify-public-functions=1}")
#: after the foralls are loops: linalg to loops, buffers freed, the OpenMP loops made, the
#: strided memref metadata expanded (its affine maps lowered before the memrefs that use them)
_TO_MEMREF = ("convert-linalg-to-loops", "ownership-based-buffer-deallocation", "canonicalize",
              "buffer-deallocation-simplification", "bufferization-lower-deallocations",
              "convert-scf-to-openmp", "expand-strided-metadata", "lower-affine")
#: then (bool memrefs widened to bytes: ``widen_bools``) everything to LLVM. Memref ops
#: become LLVM before scf does: the OpenMP lowering wraps each iteration in a
#: ``memref.alloca_scope`` whose region must stay one block until it is lowered; the OpenMP
#: dialect is converted last, once the index arithmetic in its regions is LLVM's.
_TO_LLVM = ("finalize-memref-to-llvm", "convert-scf-to-cf", "arith-expand{include-bf16=1}",
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

#: numpy storage of each element type at the boundary
_HOST: dict[str, Any] = {"f16": np.float16, "bf16": np.uint16, "f32": np.float32,
                         "f64": np.float64, "i8": np.int8, "i32": np.int32, "i64": np.int64,
                         "i1": np.bool_}


def pipeline(passes: Sequence[str]) -> str:
    """A pass pipeline's text (``mlir-opt --pass-pipeline=...``).

    >>> pipeline(("canonicalize",))
    'builtin.module(canonicalize)'
    """
    return f"builtin.module({', '.join(passes)})"


def _mlir() -> tuple[Any, Any]:
    upstream_mlir.require()
    from mlir import ir
    from mlir.execution_engine import ExecutionEngine

    return ir, ExecutionEngine


#: a bool memref type (``memref<8x96xi1, strided<...>>``, ``memref<i1>``) up to its element
_BOOL_MEMREF = re.compile(r"(memref<(?:[0-9?]+x)*)i1\b")
_BOOL_LOAD = re.compile(r"^(\s*)(%[\w.$-]+) = memref\.load ")
_BOOL_STORE = re.compile(r"^(\s*)memref\.store (%[\w.$#-]+), ")


def widen_bools(text: str) -> str:
    """Loops on memrefs (``Lowering.to_memref``'s output) with every bool memref held in
    bytes: upstream MLIR 22.1's memref-to-LLVM lowering asserts on ``i1`` loads and stores
    (``integralElementType.getWidth() >= 8``), so a load of a bool reads a byte and truncates
    it, and a store extends its bool to a byte (0 or 1, as numpy stores ``bool``).

    >>> print(widen_bools("  %v = memref.load %m[%i] : memref<8xi1>"), end="")
      %bool_byte0 = memref.load %m[%i] : memref<8xi8>
      %v = arith.trunci %bool_byte0 : i8 to i1
    """
    out: list[str] = []
    for line in text.splitlines():
        wide = _BOOL_MEMREF.sub(r"\1i8", line)
        load, store = _BOOL_LOAD.match(line), _BOOL_STORE.match(line)
        if wide != line and load:
            pad, ssa = load.groups()
            byte = f"%bool_byte{len(out)}"  # a name mlir-opt's printer never gives
            out.append(wide.replace(f"{ssa} =", f"{byte} =", 1))
            out.append(f"{pad}{ssa} = arith.trunci {byte} : i8 to i1")
        elif wide != line and store:
            pad, ssa = store.groups()
            byte = f"%bool_byte{len(out)}"
            out.append(f"{pad}{byte} = arith.extui {ssa} : i1 to i8")
            out.append(wide.replace(f"memref.store {ssa},", f"memref.store {byte},", 1))
        else:
            out.append(wide)
    return "\n".join(out) + "\n"


def lower_llvm(text: str, lowering: Lowering = PARALLEL) -> str:
    """``text`` (one or more ``func.func`` on tensors) lowered to the LLVM dialect, as text;
    an ExecutionError carrying upstream's diagnostics when a pass fails. The passes run in
    ``mlir-opt`` processes: an assertion of upstream's (its build has them on) ends that
    process, not this one."""
    try:
        loops = upstream_mlir.mlir_opt(text, [f"--pass-pipeline={pipeline(lowering.to_memref)}"])
        return upstream_mlir.mlir_opt(widen_bools(loops),
                                      [f"--pass-pipeline={pipeline(lowering.to_llvm)}"])
    except EmitError as e:
        raise ExecutionError(f"openmp backend: upstream MLIR cannot lower the parallel IR "
                             f"({lowering.name}): {_first(str(e))}") from None


def _first(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(lines)[:1500]


@cache
def _openmp() -> ctypes.CDLL:
    path = upstream_mlir.openmp_library()
    if path is None:
        raise ExecutionError("openmp backend: no OpenMP runtime (libiomp5, the intel-openmp "
                             f"package of the '{upstream_mlir.EXTRA}' extra) is installed")
    # global: the JIT-compiled module resolves __kmpc_* in the process's symbols
    return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def max_threads() -> int:
    """The OpenMP runtime's default team size (``OMP_NUM_THREADS``, else the cores)."""
    return int(_openmp().omp_get_max_threads())


@dataclass(frozen=True)
class Call:
    """One call: the results (numpy arrays, bfloat16 in float32) and seconds it took."""

    outputs: list[np.ndarray]
    run_s: float


class Engine:
    """One function's module lowered (``lowering``) and JIT-compiled at ``opt_level``; ``call``
    runs it. Compiling takes ``compile_s`` seconds."""

    def __init__(self, text: str, lowering: Lowering = PARALLEL, opt_level: int = 3) -> None:
        ir, execution_engine = _mlir()
        omp = _openmp()
        runner = upstream_mlir.runner_library("mlir_c_runner_utils")
        start = time.perf_counter()
        llvm = lower_llvm(text, lowering)
        self._context = ir.Context()  # kept: the engine's module lives in it
        with self._context:
            try:
                module = ir.Module.parse(llvm)
                self._engine = execution_engine(module, opt_level=opt_level,
                                                shared_libs=[str(runner), omp._name])
            except (RuntimeError, ir.MLIRError) as e:
                raise ExecutionError("openmp backend: the LLVM JIT failed: "
                                     f"{_first(str(e))}") from None
        self.compile_s = time.perf_counter() - start
        self._omp = omp
        self._lock = threading.Lock()  # the team size is the calling thread's, set per call

    def call(self, function: str, args: Sequence[tuple[Any, str]],
             results: Sequence[tuple[Sequence[int], str]], threads: int | None = None) -> Call:
        """Call ``function`` with ``args`` (value, element type: ``f16``, ``bf16``, ... or
        ``index``) and give back its results, allocated here at the shapes and element types
        ``results`` names; ``threads`` is the OpenMP team size (None: the runtime's default)."""
        if threads is not None and threads < 1:
            raise ExecutionError(f"openmp backend: threads must be at least 1, got {threads}")
        keep: list[Any] = []
        pointers: list[Any] = []
        for value, elt in args:
            if elt == "index":
                scalar = ctypes.c_int64(int(value))
                keep.append(scalar)
                pointers.append(ctypes.pointer(scalar))
            else:
                pointers.append(_descriptor(_to_host(value, elt), keep))
        outs = [np.zeros(tuple(shape), dtype=_HOST[elt]) for shape, elt in results]
        pointers += [_descriptor(a, keep) for a in outs]
        with self._lock:
            self._omp.omp_set_num_threads(threads if threads is not None else max_threads())
            start = time.perf_counter()
            try:
                self._engine.invoke(function, *pointers)
            except (RuntimeError, ValueError) as e:
                raise ExecutionError(f"openmp backend: calling {function!r} failed: {e}") from None
            seconds = time.perf_counter() - start
        return Call([_from_host(a, elt) for a, (_, elt) in zip(outs, results, strict=True)],
                    seconds)


def _to_host(value: Any, elt: str) -> np.ndarray:
    if elt not in _HOST:
        raise ExecutionError(f"openmp backend: no numpy storage for element type {elt!r}")
    if elt == "bf16":
        bits = np.asarray(value, dtype=np.float32, order="C").view(np.uint32) >> 16
        return np.ascontiguousarray(bits.astype(np.uint16))
    # order="C" keeps a rank-0 array rank 0 (ascontiguousarray makes it rank 1)
    return np.array(value, dtype=_HOST[elt], order="C", copy=True)


def _from_host(a: np.ndarray, elt: str) -> np.ndarray:
    if elt == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def _descriptor(a: np.ndarray, keep: list[Any]) -> Any:
    """A pointer to a pointer to ``a``'s ranked memref descriptor (what ``invoke`` passes to
    the C interface), kept alive in ``keep``."""
    rank = a.ndim
    fields: list[tuple[str, Any]] = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p),
                                     ("offset", ctypes.c_int64)]
    if rank:
        fields += [("shape", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    desc_type = type(f"MemRef{rank}", (ctypes.Structure,), {"_fields_": fields})
    d = desc_type()
    d.allocated = d.aligned = a.ctypes.data
    d.offset = 0
    if rank:
        d.shape[:] = list(a.shape)
        d.strides[:] = [s // a.itemsize for s in a.strides]
    p = ctypes.pointer(d)
    keep += [a, d, p]
    return ctypes.pointer(p)


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
                self._engines.popitem(last=False)
        return engine, False


#: the process's engines
ENGINES = EngineCache()
