"""Run a cuda build on this machine's NVIDIA GPU: ``python3 device_main.py BUILD OUT
[--repeat N]``.

This file needs only Python, numpy and an NVIDIA driver (``libcuda.so.1``): it imports
nothing of apportion, so a GPU machine without apportion's dependencies (upstream MLIR, IREE)
runs a build made elsewhere by ``apportion cuda build`` (``build.build``). It

1. makes the GPU's primary context current and sizes the device heap a kernel's own buffers
   come from (``HEAP_BYTES``; it must be set before the first kernel that allocates runs);
2. loads MLIR's CUDA runtime wrappers (``libmlir_cuda_runtime.so``, in the build) and the
   build's host library (``module.so``: its constructor loads the kernels' PTX, which the
   driver compiles for this GPU);
3. copies each input into CUDA managed memory (``mgpuMemAlloc``, host-shared: the host code
   between launches and the kernels read the same buffers), allocates the outputs there, and
   calls the function's C interface (``_mlir_ciface_NAME``: a pointer to a memref descriptor per
   tensor, an ``int64`` per ``index``) ``--repeat`` times, timing each call (every launch is
   synchronous);
4. writes the outputs (``outputs.npz``, by tensor name) and ``run.json`` (the GPU's name, each
   call's seconds) under OUT.

The runtime wrappers name ``libLLVM.so`` as a needed library but call nothing in it; a machine
without upstream LLVM installed loads the build's empty stand-in (``libLLVM.so``, part of
the build) so the loader is satisfied.

Exit status 2 with one line on stderr when the build is incomplete or no GPU is usable.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

#: numpy storage of each element type at the boundary (bf16 as its bits, i1 as a byte)
STORAGE: dict[str, Any] = {"f16": np.float16, "bf16": np.uint16, "f32": np.float32,
                           "f64": np.float64, "i8": np.int8, "i32": np.int32, "i64": np.int64,
                           "i1": np.uint8}
#: the device heap for buffers kernels allocate themselves (CUDA's default is 8 MiB)
HEAP_BYTES = 1 << 30
_CU_LIMIT_MALLOC_HEAP_SIZE = 2


class BuildError(Exception):
    """A build that cannot run here (missing file, no driver, a CUDA error)."""


def _check(code: int, what: str, cuda: ctypes.CDLL) -> None:
    if code != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(name))
        raise BuildError(f"{what} failed: {(name.value or b'?').decode()} ({code})")


def _context(cuda: ctypes.CDLL) -> str:
    """Initialise the driver, size the device heap in device 0's primary context (the one the
    runtime wrappers use) and give the device's name."""
    _check(cuda.cuInit(0), "cuInit", cuda)
    dev = ctypes.c_int()
    _check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet", cuda)
    ctx = ctypes.c_void_p()
    _check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain",
           cuda)
    _check(cuda.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent", cuda)
    _check(cuda.cuCtxSetLimit(_CU_LIMIT_MALLOC_HEAP_SIZE, ctypes.c_size_t(HEAP_BYTES)),
           "cuCtxSetLimit(malloc heap)", cuda)
    name = ctypes.create_string_buffer(256)
    _check(cuda.cuDeviceGetName(name, 256, dev), "cuDeviceGetName", cuda)
    return name.value.decode()


def _load(folder: Path) -> tuple[ctypes.CDLL, ctypes.CDLL]:
    runtime_path = folder / "libmlir_cuda_runtime.so"
    try:
        runtime = ctypes.CDLL(str(runtime_path), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        if "libLLVM" not in str(e):
            raise BuildError(f"cannot load {runtime_path.name}: {e}") from None
        ctypes.CDLL(str(folder / "libLLVM.so"), mode=ctypes.RTLD_GLOBAL)  # the stand-in
        runtime = ctypes.CDLL(str(runtime_path), mode=ctypes.RTLD_GLOBAL)
    runtime.mgpuMemAlloc.restype = ctypes.c_void_p
    runtime.mgpuMemAlloc.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_bool]
    runtime.mgpuMemFree.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return runtime, ctypes.CDLL(str(folder / "module.so"))


def _managed(runtime: ctypes.CDLL, shape: tuple[int, ...], storage: Any,
             held: list[int]) -> np.ndarray:
    """A zeroed array of ``shape`` in CUDA managed memory."""
    dtype = np.dtype(storage)
    nbytes = max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
    ptr = runtime.mgpuMemAlloc(nbytes, None, True)
    if not ptr:
        raise BuildError(f"managed allocation of {nbytes} bytes failed")
    held.append(ptr)
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
    raw[:] = 0
    count = int(np.prod(shape, dtype=np.int64))
    return raw[:count * dtype.itemsize].view(dtype).reshape(shape)


def _descriptor(a: np.ndarray, keep: list[Any]) -> Any:
    """A pointer to ``a``'s ranked memref descriptor (MLIR's C interface)."""
    rank = a.ndim
    fields: list[tuple[str, Any]] = [("allocated", ctypes.c_void_p),
                                     ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64)]
    if rank:
        fields += [("shape", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    desc = type(f"MemRef{rank}", (ctypes.Structure,), {"_fields_": fields})()
    desc.allocated = desc.aligned = a.ctypes.data
    desc.offset = 0
    if rank:
        desc.shape[:] = list(a.shape)
        desc.strides[:] = [s // a.itemsize for s in a.strides]
    keep += [a, desc]
    return ctypes.pointer(desc)


#: what a manifest holds
MANIFEST_KEYS = ("function", "args", "results", "outputs")


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest.json of the build in ``folder``; a BuildError naming the file where it is
    missing, not JSON, or lacks a key of ``MANIFEST_KEYS``."""
    path = folder / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise BuildError(f"{folder} holds no manifest.json: not a cuda build") from None
    except (ValueError, OSError) as e:  # JSON or UTF-8 errors are ValueErrors
        raise BuildError(f"{path} is not a build manifest: {e}") from None
    missing = [k for k in MANIFEST_KEYS if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise BuildError(f"{path} lacks {', '.join(missing)}: not a build manifest")
    fault = _manifest_fault(manifest)
    if fault:
        raise BuildError(f"{path}: {fault}: not a build manifest")
    return manifest


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no count


def _name_fault(where: str, entry: Any, fields: tuple[str, ...]) -> str | None:
    """What is wrong with an ``args`` or ``results`` entry's shape and name, if anything."""
    if not isinstance(entry, dict):
        return f"{where} is {type(entry).__name__}, not an object"
    lacking = [f for f in fields if f not in entry]
    if lacking:
        return f"{where} lacks {', '.join(lacking)}"
    if not isinstance(entry["name"], str) or not entry["name"]:
        return f"{where}'s name is {entry['name']!r}, not a tensor or size name"
    return None


def _type_fault(where: str, elt: Any) -> str | None:
    if not isinstance(elt, str) or elt not in STORAGE:
        return f"{where} has element type {elt!r}; known: {', '.join(STORAGE)}"
    return None


def _manifest_fault(m: dict[str, Any]) -> str | None:
    """What makes a manifest unrunnable (a field of the wrong type, an element type this
    runner has no storage for, a name given twice), named; None when it runs."""
    for key, kind in (("function", str), ("program", str), ("chip", str)):
        if key in m and not isinstance(m[key], kind):
            return f"{key} is {m[key]!r}, not a string"
    for key in ("blocks", "kernels", "threads", "threaded"):
        if key in m and not (_is_int(m[key]) and m[key] >= 0):
            return f"{key} is {m[key]!r}, not a count"
    for key in ("args", "results", "outputs"):
        if not isinstance(m[key], list):
            return f"{key} is {type(m[key]).__name__}, not a list"
    seen: set[str] = set()
    for i, arg in enumerate(m["args"]):
        where = f"args[{i}]"
        fault = _name_fault(where, arg, ("kind", "name"))
        if fault:
            return fault
        if arg["kind"] == "index":
            if not _is_int(arg.get("value")):
                return f"{where} ({arg['name']!r}) has index value {arg.get('value')!r}, not " \
                       "an integer"
        elif arg["kind"] == "memref":  # inputs.npz holds it by name
            fault = _type_fault(f"{where} ({arg['name']!r})", arg.get("type"))
            if fault:
                return fault
            if arg["name"] in seen:
                return f"args name tensor {arg['name']!r} twice"
            seen.add(arg["name"])
        else:
            return f"{where} ({arg['name']!r}) has kind {arg['kind']!r}; known: index, memref"
    results: list[str] = []
    for i, res in enumerate(m["results"]):
        where = f"results[{i}]"
        fault = _name_fault(where, res, ("name", "shape", "type")) or \
            _type_fault(f"{where} ({res['name']!r})", res["type"])
        if fault:
            return fault
        shape = res["shape"]
        if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
            return f"{where} ({res['name']!r}) has shape {shape!r}, not a list of sizes"
        if res["name"] in results:  # outputs.npz holds it by name
            return f"results name {res['name']!r} twice"
        results.append(res["name"])
    for name in m["outputs"]:
        if not isinstance(name, str) or name not in results:
            return f"outputs names {name!r}, not one of the results ({', '.join(results)})"
    return None


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file by name; a BuildError naming the file where it is
    missing or not an npz archive."""
    try:
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    except FileNotFoundError:
        raise BuildError(f"{path} is missing") from None
    except (ValueError, OSError, zipfile.BadZipFile) as e:  # not an archive, or a torn one
        raise BuildError(f"{path} is not an npz archive: {e}") from None


def read_inputs(folder: Path, manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    """The build's ``inputs.npz``: a BuildError naming the file and the tensor where it
    lacks a tensor argument of ``manifest``, holds one the manifest does not name, or stores
    one in another numpy type than its element type's (``STORAGE``)."""
    path = folder / "inputs.npz"
    given = read_arrays(path)
    types = {a["name"]: a["type"] for a in manifest["args"] if a["kind"] == "memref"}
    for name, elt in types.items():
        if name not in given:
            raise BuildError(f"{path} lacks input {name!r}, which the manifest names")
        if given[name].dtype != np.dtype(STORAGE[elt]):
            raise BuildError(f"{path}: input {name!r} is stored as {given[name].dtype}; its "
                              f"element type {elt} is stored as {np.dtype(STORAGE[elt])}")
    extra = [n for n in given if n not in types]
    if extra:
        raise BuildError(f"{path} holds {extra[0]!r}, which the manifest names no input")
    return given


def run_build(folder: Path, out: Path, repeat: int = 1) -> dict[str, Any]:
    """Run the build in ``folder`` ``repeat`` times; write ``outputs.npz`` and ``run.json``
    under ``out`` and give ``run.json``'s record."""
    manifest = read_manifest(folder)
    given = read_inputs(folder, manifest)
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise BuildError("no NVIDIA driver (libcuda.so.1) on this machine") from None
    device = _context(cuda)
    runtime, module = _load(folder)
    held: list[int] = []
    try:
        keep: list[Any] = []
        call_args: list[Any] = []
        for arg in manifest["args"]:
            if arg["kind"] == "index":
                call_args.append(ctypes.c_int64(arg["value"]))
                continue
            value = given[arg["name"]]
            buf = _managed(runtime, tuple(value.shape), STORAGE[arg["type"]], held)
            buf[...] = value
            call_args.append(_descriptor(buf, keep))
        outputs = {}
        for res in manifest["results"]:
            buf = _managed(runtime, tuple(res["shape"]), STORAGE[res["type"]], held)
            outputs[res["name"]] = buf
            call_args.append(_descriptor(buf, keep))
        function = getattr(module, manifest["function"])
        function.restype = None
        seconds = []
        for _ in range(max(1, repeat)):
            start = time.perf_counter()
            function(*call_args)
            seconds.append(time.perf_counter() - start)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "outputs.npz", **{k: np.array(v) for k, v in outputs.items()})
    finally:
        for ptr in held:
            runtime.mgpuMemFree(ptr, None)
    record = {"device": device, "function": manifest["function"], "run_s": seconds,
              "blocks": manifest.get("blocks"), "threads": manifest.get("threads")}
    (out / "run.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        record = run_build(args.build, args.out, args.repeat)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.build.name}: ran on {record['device']}, best of {len(record['run_s'])} "
          f"{min(record['run_s']) * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the library destructors: at exit the runtime wrappers unload the kernels' module
    # after the driver has released the context, which only prints CUDA errors
    os._exit(code)
