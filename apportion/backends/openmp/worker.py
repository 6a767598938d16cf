"""The process that JIT-compiles and calls the openmp backend's modules (``python -m
apportion.backends.openmp.worker``; ``engine.Worker`` starts it and talks to it).

Upstream MLIR's Python bindings cannot share a process with IREE's: both load a nanobind
library of the same name, and whichever comes second fails to import (``undefined symbol:
nanobind::detail::nb_module_free``). The execution engine and the OpenMP runtime live here
instead, so IREE and this backend run in one apportion process, and a crash of the JIT (an
upstream assertion, a fault in generated code) ends this process, not the caller's.

Requests and answers are pickled on stdin and stdout (the process's own prints go to stderr):

* ``("compile", key, llvm_text, opt_level, shared_libs)`` -> ``("ok", seconds)``;
* ``("call", key, function, args, results, threads)``, ``args`` a list of (numpy array or
  int, element type), ``results`` a list of (shape, element type) -> ``("ok", outputs,
  seconds, cpu_seconds)``, the seconds those of the call alone, the CPU seconds those of
  every thread of this process meanwhile (OpenMP's workers included);
* ``("drop", key)`` -> ``("ok",)``;

any failure -> ``("error", message)``. Element types are the emitter's (``f16``, ``bf16``,
``f32``, ``f64``, ``i8``, ``i32``, ``i64``, ``i1``, ``index``); bfloat16 travels as its
``uint16`` bits, bool as one byte per element.

>>> import numpy as np
>>> d = descriptor(np.zeros((2, 3), np.float32), [])
>>> d.contents.contents.shape[:], d.contents.contents.strides[:]
([2, 3], [3, 1])
"""

from __future__ import annotations

import ctypes
import os
import pickle
import sys
import time
from typing import Any, BinaryIO

import numpy as np

#: numpy storage of each element type at the boundary
HOST: dict[str, Any] = {"f16": np.float16, "bf16": np.uint16, "f32": np.float32,
                        "f64": np.float64, "i8": np.int8, "i32": np.int32, "i64": np.int64,
                        "i1": np.bool_}


def descriptor(a: np.ndarray, keep: list[Any]) -> Any:
    """A pointer to a pointer to ``a``'s ranked memref descriptor (what the execution engine's
    ``invoke`` passes to the C interface), its parts kept alive in ``keep``."""
    rank = a.ndim
    fields: list[tuple[str, Any]] = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p),
                                     ("offset", ctypes.c_int64)]
    if rank:
        fields += [("shape", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    desc = type(f"MemRef{rank}", (ctypes.Structure,), {"_fields_": fields})()
    desc.allocated = desc.aligned = a.ctypes.data
    desc.offset = 0
    if rank:
        desc.shape[:] = list(a.shape)
        desc.strides[:] = [s // a.itemsize for s in a.strides]
    p = ctypes.pointer(desc)
    keep += [a, desc, p]
    return ctypes.pointer(p)


class _Modules:
    """The compiled modules by key, the OpenMP runtime and the bindings (imported here only)."""

    def __init__(self) -> None:
        from mlir import ir
        from mlir.execution_engine import ExecutionEngine

        self.ir, self.engine_type = ir, ExecutionEngine
        self.engines: dict[str, tuple[Any, Any]] = {}
        self.omp: ctypes.CDLL | None = None

    def compile(self, key: str, llvm: str, opt_level: int, libs: list[str]) -> float:
        start = time.perf_counter()
        if self.omp is None:
            # global: the compiled code resolves __kmpc_* and memrefCopy in the process
            for lib in libs:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            self.omp = ctypes.CDLL(libs[-1], mode=ctypes.RTLD_GLOBAL)
        context = self.ir.Context()
        with context:
            module = self.ir.Module.parse(llvm)
            engine = self.engine_type(module, opt_level=opt_level, shared_libs=libs)
        self.engines[key] = (context, engine)
        return time.perf_counter() - start

    def call(self, key: str, function: str, args: list[tuple[Any, str]],
             results: list[tuple[tuple[int, ...], str]], threads: int
             ) -> tuple[list[np.ndarray], float, float]:
        _, engine = self.engines[key]
        keep: list[Any] = []
        pointers = []
        for value, elt in args:
            if elt == "index":
                scalar = ctypes.c_int64(int(value))
                keep.append(scalar)
                pointers.append(ctypes.pointer(scalar))
            else:
                pointers.append(descriptor(np.ascontiguousarray(value), keep))
        outs = [np.zeros(tuple(shape), dtype=HOST[elt]) for shape, elt in results]
        pointers += [descriptor(a, keep) for a in outs]
        assert self.omp is not None
        self.omp.omp_set_num_threads(threads)
        cpu = time.process_time()
        start = time.perf_counter()
        engine.invoke(function, *pointers)
        return outs, time.perf_counter() - start, time.process_time() - cpu


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """Answer requests until ``requests`` ends (module docstring)."""
    modules: _Modules | None = None
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        try:
            if modules is None:
                modules = _Modules()
            what = request[0]
            if what == "compile":
                answer: tuple[Any, ...] = ("ok", modules.compile(*request[1:]))
            elif what == "call":
                answer = ("ok", *modules.call(*request[1:]))
            elif what == "drop":
                modules.engines.pop(request[1], None)
                answer = ("ok",)
            else:
                answer = ("error", f"unknown request {what!r}")
        except Exception as e:  # noqa: BLE001 - every failure goes back to the caller
            answer = ("error", f"{type(e).__name__}: {e}")
        pickle.dump(answer, answers, protocol=5)
        answers.flush()


def main() -> None:
    """Serve on stdin and a copy of stdout; what anything else prints goes to stderr."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
