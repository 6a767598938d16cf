"""Compiling and running MLIR text with IREE (``iree.compiler``, ``iree.runtime``) on the CPU.

The parallel IR's function-level ``scf.forall`` crashes IREE 3.13's compiler as it is
(iree-org/iree#24775), so ``lower_forall`` first runs IREE's ``iree-codegen-forall-to-for``
pass over it with the compiler's MLIR bindings (a forall runs correctly in any order, so a
sequential loop is a valid schedule). ``compile_mlir`` then builds a ``.vmfb`` for the
``llvm-cpu`` backend (``--iree-llvmcpu-target-cpu=host``; constant-expression hoisting and
indirect command buffers off: see ``FLAGS``), cached under the sha256 of the text, the flags,
the compiler version and the host CPU in a cache folder (default
``~/.cache/apportion/iree``, outside any repository), and ``run_vmfb`` calls one function of it
with numpy arrays; the compile time is a field of the result and an INFO log line.

Each cached module ``KEY.vmfb`` has its sha256 beside it in ``KEY.vmfb.sha256``, both written
atomically (a temporary file renamed over the name). A module is taken from the cache only when
its bytes hash to that digest; a missing or different digest (a module copied over the key, a
torn or foreign file) means compile again and replace both, never run the file found.

Element types at the boundary (what ``iree.runtime`` accepts and gives back):

* ``f16``, ``f32``, ``i8``, ``i32``, ``i64``: numpy arrays of the same type;
* ``bf16``: numpy has none; apportion keeps bfloat16 in float32 arrays rounded to bfloat16
  (``kernels.round_bf16``), so the high 16 bits of each float32 are the exact bfloat16 bit
  pattern: they go in as a ``BFLOAT_16`` buffer view made from ``uint16`` bits, and come back
  (IREE gives an ``ml_dtypes.bfloat16`` array) viewed as ``uint16`` and shifted back into
  float32;
* ``i1`` (bool): numpy ``bool`` arrays, one byte per element (IREE's ``BOOL_8``), both ways;
* ``index`` arguments (symbolic loop counts, run-time sizes no input has): Python ints.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from apportion.errors import ExecutionError
from apportion.target.host import host_cpu

log = logging.getLogger(__name__)

#: compile flags beside the target backend. Constant-expression hoisting and indirect command
#: buffers are off: with either on, IREE 3.13 records copies of the initial values of
#: loop-carried tensors (a loop group carrying several outputs, or results and partials) into
#: command buffers whose indirect bindings it then rejects at run time (``OUT_OF_RANGE: indirect
#: buffer reference slot 0 is out range of the declared binding capacity`` in
#: ``hal.command_buffer.copy_buffer``); the emitter starts such values from fills, not
#: ``tensor.empty``, for the same reason. IREE demotes f64 to f32 by default; the emitter's f64
#: (integers meeting floats, constants, float32 sums and means, the reference's float64) must stay
#: f64, or a float32 row mean loses the digits the reference keeps
FLAGS: tuple[str, ...] = ("--iree-llvmcpu-target-cpu=host", "--iree-opt-const-expr-hoisting=false",
                          "--iree-hal-indirect-command-buffers=false",
                          "--iree-input-demote-f64-to-f32=false")
BACKEND = "llvm-cpu"
LOWERING = "builtin.module(func.func(iree-codegen-forall-to-for))"


def default_cache_dir() -> Path:
    """``~/.cache/apportion/iree``: compiled modules, keyed by the hash of text and flags."""
    return Path.home() / ".cache" / "apportion" / "iree"


@dataclass(frozen=True)
class Compiled:
    """A compiled module: its bytes, seconds the compile took (0.0 when cached) and where the
    cache holds it."""

    vmfb: bytes
    compile_s: float
    cached: bool
    path: Path | None


def _bindings() -> tuple[Any, Any]:
    try:
        from iree.compiler import ir, passmanager
    except ImportError as e:  # a dependency; this guards broken installs
        raise ExecutionError(f"IREE backend: iree-base-compiler is missing ({e})") from None
    return ir, passmanager


#: a forall's GPU mapping (``} {mapping = [#gpu.block<x>]}``, the gpu target's)
_MAPPING = re.compile(r"^(\s*\}) \{mapping = \[[^\]]*\]\}$", re.M)


def lower_forall(text: str) -> str:
    """``text`` with every ``scf.forall`` lowered to ``scf.for`` (IREE's pass), as text. A
    forall's GPU mapping is dropped first: IREE compiles for the CPU here, and its pass leaves
    mapped foralls alone (for GPU distribution), which its compiler then crashes on."""
    ir, passmanager = _bindings()
    ctx = ir.Context()
    try:
        module = ir.Module.parse(_MAPPING.sub(r"\1", text), ctx)
        passmanager.PassManager.parse(LOWERING, ctx).run(module.operation)
        _tie_loop_shapes(ir, ctx, module)
        module.operation.verify()
    except ir.MLIRError as e:
        raise ExecutionError(f"IREE backend: cannot lower scf.forall: {e}") from None
    return str(module)


def _loops(op: Any) -> list[Any]:
    """Every ``scf.for`` nested in ``op``, outer loops first."""
    found = []
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                if inner.operation.name == "scf.for":
                    found.append(inner.operation)
                found.extend(_loops(inner.operation))
    return found


def _tie_loop_shapes(ir: Any, ctx: Any, module: Any) -> None:
    """Tie each dynamically shaped tensor a ``scf.for`` carries (its block argument and its
    result) to the sizes of its initial value with ``flow.tensor.tie_shape``. A loop keeps a
    carried tensor's shape (the emitter only inserts slices into it), but IREE cannot see that
    through nested loops (a loop group over a run-time size) and stops with "'tensor.dim' op
    unexpected during shape cleanup"."""
    with ctx, ir.Location.unknown(ctx):
        index = ir.IndexType.get()
        for loop in _loops(module.operation):
            body = loop.regions[0].blocks[0]
            carried = list(body.arguments)[1:]
            inits = list(loop.operands)[3:]
            siblings = list(loop.block.operations)
            after = next(i for i, o in enumerate(siblings) if o.operation == loop) + 1
            for n, (init, arg) in enumerate(zip(inits, carried, strict=True)):
                if "tensor<" not in str(arg.type) or "?" not in str(arg.type):
                    continue
                shape = ir.RankedTensorType(arg.type)
                dims = []
                for d in range(shape.rank):
                    if shape.is_dynamic_dim(d):
                        c = ir.Operation.create("arith.constant", results=[index], attributes={
                            "value": ir.IntegerAttr.get(index, d)}, ip=ir.InsertionPoint(loop))
                        dims.append(ir.Operation.create(
                            "tensor.dim", results=[index], operands=[init, c.result],
                            ip=ir.InsertionPoint(loop)).result)
                tied = ir.Operation.create("flow.tensor.tie_shape", results=[arg.type],
                                           operands=[arg, *dims],
                                           ip=ir.InsertionPoint(body.operations[0]))
                arg.replace_all_uses_except(tied.result, tied)
                result = loop.results[n]
                tied_out = ir.Operation.create(
                    "flow.tensor.tie_shape", results=[arg.type], operands=[result, *dims],
                    ip=ir.InsertionPoint(siblings[after]))
                result.replace_all_uses_except(tied_out.result, tied_out)


def compiler_version() -> str:
    try:
        from importlib.metadata import version

        return version("iree-base-compiler")
    except Exception:  # noqa: BLE001 - no metadata: the key then ignores the version
        return "unknown"


def cache_key(text: str, flags: Sequence[str]) -> str:
    """sha256 of the text, the backend, the flags, the compiler version and the host CPU."""
    h = hashlib.sha256()
    for part in (text, BACKEND, *flags, compiler_version(), host_cpu()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_mlir(text: str, cache_dir: str | os.PathLike[str] | None = None,
                 flags: Sequence[str] = FLAGS, lower: bool = True) -> Compiled:
    """Compile MLIR text (``lower``: after ``lower_forall``) to a ``.vmfb`` for the CPU.

    A module already in ``cache_dir`` (default ``default_cache_dir()``) is read back instead;
    compile errors (the compiler runs as a subprocess, so a crash too) raise ExecutionError.
    """
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = cache_key(text, [*flags, f"lower={lower}"])
    path = folder / f"{key}.vmfb"
    cached = _read_cached(path)
    if cached is not None:
        log.info("IREE module %s from the cache", key[:12])
        return Compiled(cached, 0.0, True, path)
    try:
        import iree.compiler as compiler
    except ImportError as e:
        raise ExecutionError(f"IREE backend: iree-base-compiler is missing ({e})") from None
    start = time.perf_counter()
    source = lower_forall(text) if lower else text
    try:
        vmfb = compiler.compile_str(source, target_backends=[BACKEND], extra_args=list(flags))
    except compiler.CompilerToolError as e:
        first = "; ".join(_short(line) for line in str(e).splitlines()
                          if "error:" in line)[:2000]
        raise ExecutionError(f"IREE backend: iree-compile failed: {first or e}") from None
    seconds = time.perf_counter() - start
    log.info("IREE module %s compiled in %.2f s", key[:12], seconds)
    stored: Path | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # the module first, then its digest: a reader between the two renames sees a digest
        # that does not match (or none) and compiles again, never a module taken on trust
        _write_atomic(path, bytes(vmfb))
        _write_atomic(digest_path(path), _sha256(bytes(vmfb)).encode())
        stored = path
    except OSError as e:  # an unwritable cache only costs the next compile
        log.warning("IREE module cache %s is not writable: %s", folder, e)
    return Compiled(bytes(vmfb), seconds, False, stored)


def digest_path(path: Path) -> Path:
    """Where the sha256 of the cached module ``path`` is kept: ``KEY.vmfb.sha256``."""
    return path.with_name(path.name + ".sha256")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_cached(path: Path) -> bytes | None:
    """The cached module's bytes when they hash to the digest beside them; None (compile
    again) when either file is missing or unreadable or the digest differs."""
    try:
        data = path.read_bytes()
        digest = digest_path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if _sha256(data) != digest:
        log.warning("IREE module cache: %s does not match its digest; compiling it again",
                    path.name)
        return None
    return data


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` as ``path``: a temporary file in the same folder renamed over it, so that a
    concurrent reader sees the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _short(line: str) -> str:
    """One compiler diagnostic without the target attributes it may print (kilobytes)."""
    line = re.sub(r"#hal\.executable\.target<.*", "#hal.executable.target<...>", line.strip())
    return line if len(line) <= 400 else line[:400] + "..."


# --- running --------------------------------------------------------------------------------

def _runtime() -> Any:
    try:
        import iree.runtime as rt
    except ImportError as e:
        raise ExecutionError(f"IREE backend: iree-base-runtime is missing ({e})") from None
    return rt


def _to_device(rt: Any, device: Any, value: Any, elt: str) -> Any:
    if elt == "index":
        return int(value)
    a = np.asarray(value)
    # np.asarray(order="C"), not ascontiguousarray, which makes a rank-0 array rank 1
    if elt == "bf16":
        bits = (np.asarray(a, dtype=np.float32, order="C").view(np.uint32) >> 16).astype(
            np.uint16)
        return device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
            device=device, buffer=bits, element_type=rt.HalElementType.BFLOAT_16)
    host = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i8": np.int8,
            "i32": np.int32, "i64": np.int64, "i1": np.bool_}[elt]
    return np.asarray(a, dtype=host, order="C")


def _from_device(value: Any, elt: str) -> np.ndarray:
    # a copy: the host view may map device memory that dies with the call's context (a
    # result that is an argument returned as is aliases that argument's buffer)
    host = value.to_host() if hasattr(value, "to_host") else value
    a = np.array(host, copy=True)
    if elt == "bf16":
        bits = np.asarray(a, order="C").view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    if elt == "i1":
        return a.astype(np.bool_, copy=False)
    return a


@dataclass(frozen=True)
class RunResult:
    """The function's results (numpy arrays, bfloat16 in float32) and seconds the call took."""

    outputs: list[np.ndarray]
    run_s: float


def run_vmfb(vmfb: bytes, function: str, args: Sequence[tuple[Any, str]],
             results: Sequence[str], driver: str = "local-task") -> RunResult:
    """Call ``function`` of a compiled module with ``args`` (value, element type: ``f16``,
    ``bf16``, ... or ``index``) and return its results as arrays of ``results``' types."""
    rt = _runtime()
    try:
        config = rt.Config(driver)
        ctx = rt.SystemContext(config=config)
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
        fn = ctx.modules.module[function]
        device = config.device
        values = [_to_device(rt, device, v, elt) for v, elt in args]
        start = time.perf_counter()
        out = fn(*values)
        seconds = time.perf_counter() - start
        outs = list(out) if isinstance(out, tuple | list) else [out]
        if len(outs) != len(results):
            raise ExecutionError(f"IREE backend: {function!r} returned {len(outs)} results, "
                                 f"expected {len(results)}")
        # copied while the arguments and the context are alive
        arrays = [_from_device(o, elt) for o, elt in zip(outs, results, strict=True)]
    except ExecutionError:
        raise
    except Exception as e:  # noqa: BLE001 - IREE maps each status code to its own Python type
        # (OUT_OF_RANGE: IndexError, INVALID_ARGUMENT: ValueError, others: RuntimeError)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExecutionError(f"IREE backend: running {function!r} failed "
                             f"({type(e).__name__}): {first}") from None
    return RunResult(arrays, seconds)
