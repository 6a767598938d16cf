"""The parallel IR on tensors lowered by upstream MLIR 22 to a host library that launches one
CUDA kernel per ``scf.forall``.

``lower_nvvm`` takes the text of one ``func.func`` (the iree emitter's ``scf.forall`` IR
planned for the ``gpu`` target, whose foralls carry ``#gpu.block`` mappings) through
upstream passes (the text rewrites between them from ``mlir.gpu`` and ``mlir.gpu_threads``):

1. one-shot bufferization across the function boundary (results made out-parameters the
   caller allocates), each ``scf.forall`` (now without results) to ``scf.parallel``
   (``--scf-forall-to-parallel``), keeping its mapping;
2. each mapping said as the loop-to-processor map ``--convert-parallel-loops-to-gpu`` reads
   (``#gpu.block<x>`` -> ``#gpu.loop_dim_map<processor = block_x, ...>``; a fourth and later
   grid dim, ``#gpu.block<linear_dim_3>`` and on, runs as a loop in each block), every
   ``memref.copy`` a ``linalg.copy`` (a kernel has no ``memrefCopy`` library to call), each
   ``linalg`` op to loops, buffers freed by ownership-based deallocation, each mapped
   parallel loop a ``gpu.launch`` and its body outlined as a kernel: a core of the plan is a
   block, its work the block's loops;
3. every buffer of the host code allocated as CUDA managed memory (``gpu.alloc
   host_shared``): the host code between launches (fills, copies of slices, loops of a tiled
   loop group) and the kernels read the same buffers; a buffer a kernel allocates for itself comes
   from the device heap;
4. the kernels compiled to PTX for ``arch`` (the driver JIT-compiles it for the GPU at hand;
   ``sm_80`` runs on Ampere and later), the host code to the LLVM dialect calling MLIR's CUDA
   runtime wrappers (``libmlir_cuda_runtime``: ``mgpuLaunchKernel``, ``mgpuMemAlloc`` ...).

``link`` turns that module into a shared library with upstream's ``mlir-translate`` and
``llc`` and the system's C compiler driver as linker.

>>> text = '''func.func @twice(%x: tensor<4xf32>) -> tensor<4xf32> {
...   %e = tensor.empty() : tensor<4xf32>
...   %r = scf.forall (%i) in (4) shared_outs(%o = %e) -> (tensor<4xf32>) {
...     %v = tensor.extract %x[%i] : tensor<4xf32>
...     %w = arith.addf %v, %v : f32
...     %t = tensor.from_elements %w : tensor<1xf32>
...     scf.forall.in_parallel {
...       tensor.parallel_insert_slice %t into %o[%i] [1] [1] : tensor<1xf32> into tensor<4xf32>
...     }
...   } {mapping = [#gpu.block<x>]}
...   return %r : tensor<4xf32>
... }'''
>>> from apportion.mlir import upstream
>>> if upstream.available():
...     lowered = lower_nvvm(text).llvm
...     assert "gpu.binary" in lowered and "gpu.launch_func" in lowered
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from apportion.errors import EmitError, ExecutionError
from apportion.limits import cite
from apportion.mlir import upstream
from apportion.mlir.gpu import block_mapped, block_maps, copies_as_linalg, host_shared
from apportion.mlir.gpu_threads import (
    barriers,
    shared_by_threads,
    thread_maps,
    thread_tiles,
)
from apportion.mlir.upstream import expand_as_cast, pipeline, widen_bools


@dataclass(frozen=True)
class GpuArch:
    """The GPU the kernels are compiled for: its chip (``sm_80``) and PTX version feature
    (``+ptx70``). PTX of an older chip runs on every newer one (the driver compiles it)."""

    chip: str = "sm_80"
    features: str = "+ptx70"


#: the default: PTX for Ampere (``sm_80``), which the driver compiles for Hopper and later too
AMPERE = GpuArch()


#: to memrefs, results as the caller's out-parameters, each forall an ``scf.parallel``
_TO_PARALLEL = ("func.func(llvm-request-c-wrappers)",
                "one-shot-bufferize{bufferize-function-boundaries=1 "
                "function-boundary-type-conversion=identity-layout-map}",
                "buffer-results-to-out-params{hoist-static-allocs=1 modify-public-functions=1}",
                "cse", "canonicalize", "func.func(scf-forall-to-parallel)")
#: linalg to loops and buffers freed (the deallocation passes know no ``gpu.launch_func``, so
#: they run first), then (barriers after the thread loops) each mapped parallel loop a kernel
_TO_LOOPS = ("func.func(convert-linalg-to-loops)", "ownership-based-buffer-deallocation",
             "canonicalize", "buffer-deallocation-simplification",
             "bufferization-lower-deallocations", "cse", "canonicalize")
_TO_KERNELS = ("func.func(convert-parallel-loops-to-gpu)", "gpu-kernel-outlining")


def _nvvm(arch: GpuArch) -> tuple[str, ...]:
    return (f"gpu-lower-to-nvvm-pipeline{{cubin-chip={arch.chip} "
            f"cubin-features={arch.features} cubin-format=isa}}",)


def _unmapped(text: str) -> None:
    """Refuse a forall without a GPU mapping: it would run as host loops, not kernels."""
    n_forall, n_mapped = block_mapped(text)
    if n_forall > n_mapped:
        raise ExecutionError(f"cuda backend: {n_forall - n_mapped} of the {n_forall} scf.forall "
                             "ops carry no #gpu.block mapping (the plan's target gives none): "
                             "plan for the 'gpu' target (--target gpu) "
                             f"{cite('cuda-needs-gpu-target')}")


#: upstream's assertion on an expand_shape group of two run-time sizes
_TWO_DYNAMIC = "There must be at most one dynamic size per group"


@dataclass(frozen=True)
class Lowered:
    """``lower_nvvm``'s module (the LLVM dialect, kernels as PTX), the threads per block and
    how many of the block foralls split their work over them (the others run one thread)."""

    llvm: str
    threads: int
    blocks: int
    threaded: int


#: the most threads a CUDA block holds
MAX_THREADS = 1024


@cache
def nvptx_names() -> tuple[frozenset[str], frozenset[str]]:
    """The GPUs (``sm_80`` ...) and PTX features (``+ptx70`` ...) upstream LLVM's NVPTX
    back end knows, as ``llc -mcpu=help`` lists them."""
    llc = _llc()
    done = subprocess.run([str(llc), "-mtriple=nvptx64", "-mcpu=help"], capture_output=True,
                          text=True, check=False)
    said = done.stdout + done.stderr
    return (frozenset(re.findall(r"^\s+(sm_\w+)\s+- ", said, re.M)),
            frozenset(re.findall(r"^\s+(ptx\d+)\s+- ", said, re.M)))


def check_arch(arch: GpuArch) -> None:
    """An ExecutionError naming a chip or PTX feature upstream LLVM does not know (it would
    otherwise compile for a default GPU without a word)."""
    chips, ptx = nvptx_names()

    def number(name: str) -> int:
        return int(re.sub(r"\D", "", name) or 0)

    if arch.chip not in chips:
        known = sorted(chips, key=lambda c: (number(c), c))
        raise ExecutionError(f"cuda backend: unknown GPU {arch.chip!r}: upstream LLVM's NVPTX "
                             f"back end knows {known[0]} ... {known[-1]} (sm_80, sm_90, ...)")
    if not arch.features.startswith("+") or arch.features[1:] not in ptx:
        known = sorted(ptx, key=number)
        raise ExecutionError(f"cuda backend: unknown PTX feature {arch.features!r}: expected "
                             f"+ptxNN from +{known[0]} to +{known[-1]}")


def lower_nvvm(text: str, arch: GpuArch = AMPERE, threads: int = 1) -> Lowered:
    """``text`` (one ``func.func`` on tensors, foralls mapped to GPU blocks) lowered to the
    LLVM dialect with its kernels as PTX; each block's work split over ``threads`` threads
    where that is safe (``mlir.gpu_threads.thread_tiles``). An ExecutionError carrying
    upstream's diagnostics when a pass fails, or for a forall without a mapping."""
    upstream.require()  # the missing extra named as such
    if not 1 <= threads <= MAX_THREADS:
        raise ExecutionError(f"cuda backend: threads per block must be in 1..{MAX_THREADS}, "
                             f"got {threads}")
    check_arch(arch)
    _unmapped(text)
    try:
        keep: frozenset[int] = frozenset()
        while True:
            split = thread_tiles(text, threads, keep) if threads > 1 else None
            loops = upstream.mlir_opt(split.text if split else text,
                                           [f"--pass-pipeline={pipeline(_TO_PARALLEL)}"])
            shared = shared_by_threads(loops) - keep if split else set()
            if not shared:
                blocks, threaded = (split.blocks, split.threaded) if split else (0, 0)
                break
            keep |= shared  # those blocks keep one thread; the others are split again
        mapped = thread_maps(copies_as_linalg(block_maps(expand_as_cast(loops))))
        freed = upstream.mlir_opt(mapped, [f"--pass-pipeline={pipeline(_TO_LOOPS)}"])
        kernels = upstream.mlir_opt(barriers(freed),
                                         [f"--pass-pipeline={pipeline(_TO_KERNELS)}"])
        llvm = upstream.mlir_opt(widen_bools(host_shared(kernels)),
                                      [f"--pass-pipeline={pipeline(_nvvm(arch))}"])
        return Lowered(llvm, threads, blocks, threaded)
    except EmitError as e:
        said = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        if _TWO_DYNAMIC in said:
            raise ExecutionError(
                "cuda backend: upstream MLIR 22.1.8 cannot lower a memref.expand_shape with "
                "two run-time sizes in one group (expand-strided-metadata asserts: "
                f"'{_TWO_DYNAMIC}'); the parallel IR reshapes a run-time K into run-time "
                "slices of a run-time step (a split reduction of a run-time size)") from None
        raise ExecutionError("cuda backend: upstream MLIR cannot lower the parallel IR to "
                             f"NVVM: {said[:1500]}") from None


def _run(args: list[str], what: str, timeout_s: float = 300.0) -> None:
    done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=timeout_s)
    if done.returncode != 0:
        said = " ".join(done.stderr.split())[-1500:]
        raise ExecutionError(f"cuda backend: {what} failed (exit status {done.returncode}): "
                             f"{said}")


def linker() -> str:
    """The C compiler driver that links the shared library (``cc``, ``gcc`` or ``clang``)."""
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    raise ExecutionError("cuda backend: no C compiler driver (cc, gcc or clang) on PATH to "
                         "link the kernels' host library")


def _llc() -> Path:
    llc = upstream.require().parent / "llvm" / "bin" / "llc"
    if not llc.exists():
        raise ExecutionError("cuda backend: upstream LLVM's llc is not installed (the "
                             f"'{upstream.EXTRA}' extra)")
    return llc


def link(llvm_dialect: str, out: Path) -> Path:
    """The LLVM-dialect module ``llvm_dialect`` (``lower_nvvm``'s output) as a shared library
    at ``out`` that needs ``libmlir_cuda_runtime.so`` from its own folder (``$ORIGIN``)."""
    llc = _llc()
    runtime = upstream.runner_library("mlir_cuda_runtime")
    with tempfile.TemporaryDirectory() as tmp:
        place = Path(tmp)
        (place / "module.mlir").write_text(llvm_dialect)
        _run([str(upstream.tool("mlir-translate")), "--mlir-to-llvmir",
              str(place / "module.mlir"), "-o", str(place / "module.ll")],
             "mlir-translate --mlir-to-llvmir")
        _run([str(llc), "-O2", "-filetype=obj", "-relocation-model=pic",
              str(place / "module.ll"), "-o", str(place / "module.o")], "llc")
        _run([linker(), "-shared", str(place / "module.o"), "-o", str(out),
              f"-L{runtime.parent}", "-lmlir_cuda_runtime", "-Wl,-rpath,$ORIGIN"],
             "linking the host library")
    return out
