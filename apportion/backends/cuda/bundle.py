"""A plan's parallel IR built for an NVIDIA GPU as a bundle a GPU machine runs, and checked
against the reference executor.

``build_bundle`` emits the plan's ``scf.forall`` IR (``backends.iree.forall``, the function
IREE compiles and the openmp backend runs; for the ``gpu`` target each forall carries
``#gpu.block`` mappings), lowers it with upstream MLIR (``lowering.lower_nvvm``: each forall a
kernel, a core of the plan a block), links the host library (``lowering.link``) and writes a
folder a GPU machine runs with Python, numpy and the NVIDIA driver alone
(``device_main.py``):

* ``module.so``: the host code and the kernels' PTX; ``libmlir_cuda_runtime.so``: MLIR's CUDA
  runtime wrappers it calls; ``libLLVM.so``: an empty stand-in for the library those wrappers
  name but never call (a GPU machine need not have upstream LLVM installed);
* ``manifest.json``: the function's C interface name, its arguments (tensors by name and
  element type, ``index`` values: loop counts, run-time sizes) and results;
* ``inputs.npz``: the inputs (random, ``seed``); ``reference.json``: the unplanned program the
  outputs are checked against (``check_bundle``); ``forall.mlir``: the IR it was built from.

>>> import apportion as ap, tempfile
>>> from pathlib import Path
>>> from apportion.runtime import upstream_mlir
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.gpu(cores=8))
>>> if upstream_mlir.available():
...     with tempfile.TemporaryDirectory() as tmp:
...         b = build_bundle(planned.program, planned.plan, planned.target, Path(tmp) / "fused")
...         assert (b.path / "module.so").exists() and b.kernels == 2
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from apportion.backends.cuda import device_main
from apportion.backends.cuda.lowering import AMPERE, GpuArch, link, linker, lower_nvvm
from apportion.backends.iree.forall import symbol_name
from apportion.backends.iree.run import (
    bind_run,
    check_gathers,
    one_module_ir,
    reference_at,
)
from apportion.errors import ExecutionError
from apportion.frontend.json_format import dumps, load
from apportion.ir.program import Program
from apportion.plans.plan import Plan
from apportion.runtime import upstream_mlir
from apportion.runtime.reference import (
    OutputCheck,
    bind_inputs,
    compare,
    random_inputs,
    run_unplanned,
)
from apportion.target.target import Target


@dataclass(frozen=True)
class Bundle:
    """A built bundle: its folder, the program's name, the kernels (one per forall), the
    threads per block, how many kernels split their block's work over them, and seconds
    lowering and linking took."""

    path: Path
    program: str
    kernels: int
    threads: int
    threaded: int
    build_s: float


def _storage(value: np.ndarray, elt: str) -> np.ndarray:
    """An input as the function reads it (``device_main.STORAGE``): bfloat16 as its bits."""
    if elt == "bf16":
        bits = np.asarray(value, dtype=np.float32, order="C").view(np.uint32) >> 16
        return bits.astype(np.uint16)
    return np.array(value, dtype=device_main.STORAGE[elt], order="C", copy=True)


def _from_storage(value: np.ndarray, elt: str) -> np.ndarray:
    if elt == "bf16":
        return (value.astype(np.uint32) << 16).view(np.float32)
    if elt == "i1":
        return value.astype(np.bool_)
    return value


def build_bundle(program: Program, plan: Plan, target: Target, out: Path, seed: int = 0,
                 params: Mapping[str, int] | None = None, symbolic: Program | None = None,
                 arch: GpuArch = AMPERE, threads: int = 1) -> Bundle:
    """Build ``plan`` for the GPU into the folder ``out`` (made; an existing one is replaced),
    with random inputs (``seed``) at the sizes and loop counts ``params`` names (``symbolic``:
    the program as given, where it has run-time sizes). Refuses, naming the op and the limit,
    what the parallel IR has no construction for, and a target whose foralls carry no GPU
    mapping. ``threads``: per block, each block's work split over them where that is safe
    (``threads.thread_tiles``; 1: a block's work runs as loops on one thread)."""
    start = time.perf_counter()
    upstream_mlir.require()
    reference = reference_at(program, symbolic, params)
    inputs = random_inputs(reference, seed)
    b = bind_run(program, plan, target, inputs, params, symbolic, None)
    schedule, text = one_module_ir(b.program, plan, target, "cuda", b.symbolic)
    env = bind_inputs(b.bound.program, inputs)
    check_gathers(b.bound.program, env)
    lowered = lower_nvvm(text, arch, threads)
    llvm = lowered.llvm
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "forall.mlir").write_text(text)
    link(llvm, out / "module.so")
    shutil.copy(upstream_mlir.runner_library("mlir_cuda_runtime"),
                out / "libmlir_cuda_runtime.so")
    _stand_in(out / "libLLVM.so")
    args: list[dict[str, object]] = []
    stored: dict[str, np.ndarray] = {}
    for name, value, elt in b.arguments(env, schedule):
        if elt == "index":
            args.append({"kind": "index", "name": name, "value": value})
        else:
            args.append({"kind": "memref", "name": name, "type": elt})
            stored[name] = _storage(np.asarray(value), elt)
    results = [{"name": n, "shape": list(shape), "type": elt} for n, shape, elt in b.results()]
    kernels = llvm.count("gpu.binary @")
    manifest = {"program": program.name, "function": f"_mlir_ciface_{symbol_name(program.name)}",
                "args": args, "results": results, "outputs": list(b.given_outputs),
                "blocks": target.cores, "kernels": kernels, "threads": threads,
                "threaded": lowered.threaded, "chip": arch.chip}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    np.savez(out / "inputs.npz", **stored)
    (out / "reference.json").write_text(dumps(reference))
    return Bundle(out, program.name, kernels, threads, lowered.threaded,
                  time.perf_counter() - start)


def _stand_in(path: Path) -> None:
    """An empty shared library named ``libLLVM.so`` (see the module's docstring)."""
    done = subprocess.run([linker(), "-shared", "-x", "c", "-", "-o", str(path),
                           "-Wl,-soname,libLLVM.so"], input="", capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise ExecutionError(f"cuda backend: building the libLLVM.so stand-in failed: "
                             f"{' '.join(done.stderr.split())[-500:]}")


def run_bundle(bundle: Path, out: Path, repeat: int = 1) -> dict[str, object]:
    """Run ``bundle`` on this machine's GPU (``device_main`` in a child process: a fault in a
    kernel ends that process, not this one); its ``run.json`` record. An ExecutionError when
    it cannot run (no NVIDIA driver, a CUDA error)."""
    done = subprocess.run([sys.executable, str(Path(device_main.__file__)), str(bundle),
                           str(out), "--repeat", str(repeat)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        said = " ".join(done.stderr.split())[-1500:]
        raise ExecutionError(f"cuda backend: running {bundle.name} failed (exit status "
                             f"{done.returncode}): {said}")
    return json.loads((out / "run.json").read_text())


def check_bundle(bundle: Path, results: Path) -> list[OutputCheck]:
    """The outputs a run of ``bundle`` wrote under ``results`` (``outputs.npz``) checked
    against the reference executor's run of the unplanned program on the same inputs."""
    try:
        manifest = device_main.read_manifest(bundle)
        stored = device_main.read_arrays(bundle / "inputs.npz")
        if not (results / "outputs.npz").exists():
            raise ExecutionError(f"cuda backend: {results} holds no outputs.npz (run the "
                                 "bundle first: apportion cuda run)")
        outputs = device_main.read_arrays(results / "outputs.npz")
    except device_main.BundleError as e:
        raise ExecutionError(f"cuda backend: {e}") from None
    reference = load(bundle / "reference.json")
    types = {a["name"]: a["type"] for a in manifest["args"] if a["kind"] == "memref"}
    inputs = {k: _from_storage(v, types[k]) for k, v in stored.items()}
    got = {}
    for r in manifest["results"]:
        value = outputs.get(r["name"])
        if value is None or list(value.shape) != list(r["shape"]):
            said = "is missing" if value is None else f"has shape {list(value.shape)}"
            raise ExecutionError(f"cuda backend: output {r['name']!r} in {results}/outputs.npz "
                                 f"{said}; the bundle's function returns {r['shape']}")
        got[r["name"]] = _from_storage(value, r["type"])
    want = run_unplanned(reference, inputs)
    kept = {k: v for k, v in got.items() if k in manifest["outputs"]}
    return compare(want, {**inputs, **kept}, reference)
