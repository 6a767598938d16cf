"""A plan's parallel IR built for an NVIDIA GPU into a folder a GPU machine runs (a build),
and checked against the reference executor.

``build`` emits a schedule's ``scf.forall`` IR (``mlir.module``, the function
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
  outputs are checked against (``check_build``); ``forall.mlir``: the IR it was built from.

>>> import apportion as ap, tempfile
>>> from pathlib import Path
>>> from apportion.mlir import upstream
>>> planned = ap.plan(ap.load("examples/fused.json"), ap.targets.gpu(cores=8))
>>> if upstream.available():
...     with tempfile.TemporaryDirectory() as tmp:
...         b = build(planned.lowered, Path(tmp) / "fused")
...         assert (b.path / "module.so").exists() and b.kernels == 2
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from apportion.backends.cuda import device_main
from apportion.backends.cuda.lowering import AMPERE, GpuArch, link, linker, lower_nvvm
from apportion.errors import ExecutionError
from apportion.frontend.json_format import dumps, load
from apportion.ir.program import Program
from apportion.mlir import upstream
from apportion.mlir.module import call, one_module_ir, with_gather_indices
from apportion.runtime.check import expect
from apportion.runtime.isolated import python_command
from apportion.runtime.reference import OutputCheck, bind_inputs, check_gathers, random_inputs
from apportion.schedule.values import Schedule


@dataclass(frozen=True)
class Build:
    """A build: its folder, the program's name, the kernels (one per forall), the
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


def reference(schedule: Schedule) -> Program:
    """The unplanned program a run of ``schedule`` is checked against: the program as given
    bound at the schedule's sizes, where it has run-time sizes, else the schedule's."""
    if schedule.given is None:
        return schedule.program
    return schedule.given.bind(dict(schedule.sizes))


def build(schedule: Schedule, out: Path, seed: int = 0, arch: GpuArch = AMPERE,
          threads: int = 1, inputs: Mapping[str, np.ndarray] | None = None) -> Build:
    """Build ``schedule`` (a plan's, bound at the run's sizes and loop counts) for the GPU
    into the folder ``out``, with ``inputs`` (None: random ones, ``seed``). Refuses, naming the
    op and the limit, what the parallel IR has no construction for, and a target whose
    foralls carry no GPU mapping.
    ``threads``: per block, each block's work split over them where that is safe
    (``mlir.gpu_threads.thread_tiles``; 1: a block's work runs as loops on one thread).

    ``out`` may be new, empty or a build (replaced); anything else is refused before any
    work (``check_out``). The build is written into a folder beside ``out`` and renamed into
    place once complete: a build that fails or is interrupted (Ctrl-C, SIGTERM) leaves the
    build that was there, with its results, and nothing of its own."""
    start = time.perf_counter()
    check_out(out)
    upstream.require()
    unplanned = reference(schedule)
    given = random_inputs(unplanned, seed) if inputs is None else inputs
    s = with_gather_indices(schedule)
    text = one_module_ir(s, "cuda")
    env = bind_inputs(schedule.program, given)
    check_gathers(schedule.program, env)
    lowered = lower_nvvm(text, arch, threads)
    llvm = lowered.llvm
    args: list[dict[str, object]] = []
    stored: dict[str, np.ndarray] = {}
    c = call(s, env)
    for name, value, elt in c.arguments:
        if elt == "index":
            args.append({"kind": "index", "name": name, "value": value})
        else:
            args.append({"kind": "memref", "name": name, "type": elt})
            stored[name] = _storage(np.asarray(value), elt)
    results = [{"name": n, "shape": list(shape), "type": elt} for n, shape, elt in c.results]
    kernels = llvm.count("gpu.binary @")
    program = schedule.program
    manifest = {"program": program.name, "function": f"_mlir_ciface_{c.function}",
                "args": args, "results": results, "outputs": list(program.outputs),
                "blocks": schedule.cores, "kernels": kernels, "threads": threads,
                "threaded": lowered.threaded, "chip": arch.chip}

    def write(folder: Path) -> None:
        (folder / "forall.mlir").write_text(text)
        link(llvm, folder / "module.so")
        shutil.copy(upstream.runner_library("mlir_cuda_runtime"),
                    folder / "libmlir_cuda_runtime.so")
        _stand_in(folder / "libLLVM.so")
        np.savez(folder / "inputs.npz", **stored)
        (folder / "reference.json").write_text(dumps(unplanned))
        # last: a folder with a manifest is a build (``check_out``)
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")

    _write_in_place(out, write)
    return Build(out, program.name, kernels, threads, lowered.threaded,
                  time.perf_counter() - start)


#: what a build's folder holds: the files ``build`` writes, and ``results``, where
#: ``cuda run`` writes a run's outputs by default; a folder holding anything else is not
#: replaced
BUILD_ENTRIES = frozenset({"manifest.json", "module.so", "libmlir_cuda_runtime.so",
                            "libLLVM.so", "inputs.npz", "reference.json", "forall.mlir",
                            "results"})


def _protected(out: Path) -> str | None:
    """What ``out`` is when building there would replace a folder the user works in (the
    root, the home folder, the current folder or one above it); None otherwise."""
    try:
        real = out.resolve()
        here = Path.cwd().resolve()
    except (OSError, RuntimeError):  # the current folder was removed; a link loop
        return None
    if real == Path(real.anchor):
        return "the file system's root"
    if real == here:
        return "the current folder"
    if real in here.parents:
        return "a folder above the current one"
    try:
        if real == Path.home().resolve():
            return "the home folder"
    except (OSError, RuntimeError, KeyError):  # no home folder to protect
        pass
    return None


def check_out(out: Path) -> None:
    """Refuse ``out`` as a build's folder, naming it, where building there would lose what
    is not a build: the root, the home folder, the current folder or one above it, a
    symbolic link, a file, or a folder that holds anything but a build (a manifest the
    device runner reads and only ``BUILD_ENTRIES``). A new or empty folder is fine."""
    said = f"cuda backend: will not write the build into {str(out)!r}"
    what = _protected(out)
    if what is not None:
        raise ExecutionError(f"{said}, {what}: a build replaces its folder; give the build "
                             "a folder of its own")
    try:
        if out.is_symlink():
            raise ExecutionError(f"{said}: it is a symbolic link; give the folder itself or "
                                 "a new one")
        if not out.exists():
            return
        if not out.is_dir():
            raise ExecutionError(f"{said}: it is a file, not a folder; give a new folder or "
                                 "a build's")
        entries = sorted(p.name for p in out.iterdir())
    except OSError as e:
        raise ExecutionError(f"{said}: {e.strerror or e}") from None
    if not entries:
        return
    refuse = (f"{said}: it is not a cuda build ({{}}) and a build replaces its folder; give "
              "a new or empty folder, or move what it holds")
    foreign = [n for n in entries if n not in BUILD_ENTRIES]
    if foreign:
        raise ExecutionError(refuse.format(f"it holds {foreign[0]!r}"))
    try:
        device_main.read_manifest(out)
    except device_main.BuildError as e:
        raise ExecutionError(refuse.format(str(e))) from None


def _write_in_place(out: Path, write: Callable[[Path], None]) -> None:
    """``write`` a build into a new folder beside ``out``, then put it in ``out``'s place
    (the build there moved aside, then removed); on any failure or interrupt, the new folder
    is removed and ``out`` is as it was."""
    where = f"cuda backend: writing the build {str(out)!r}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.parent / f".{out.name[:64]}.partial-{secrets.token_hex(4)}"
        part.mkdir()
    except OSError as e:
        raise ExecutionError(f"{where}: {e.strerror or e}"
                             + (f" ({e.filename})" if e.filename else "")) from None
    try:
        with _terminate_as_interrupt():
            write(part)
            check_out(out)  # again: it may have changed while the build was written
            _swap(part, out)
    except OSError as e:
        raise ExecutionError(f"{where}: {e.strerror or e}"
                             + (f" ({e.filename})" if e.filename else "")) from None
    finally:
        if part.exists():  # the build did not finish: nothing of it stays
            shutil.rmtree(part, ignore_errors=True)


def _swap(part: Path, out: Path) -> None:
    """Rename the complete build ``part`` to ``out``. The build there is moved aside first,
    put back if the rename fails, removed once it succeeds; Ctrl-C and SIGTERM wait until
    this is done, so that ``out`` is never left missing nor the old build left aside."""
    old = out.parent / f".{out.name[:64]}.replaced-{secrets.token_hex(4)}"
    with _signals_deferred():
        if not out.exists():
            os.rename(part, out)
            return
        os.rename(out, old)
        try:
            os.rename(part, out)
        except OSError:
            os.rename(old, out)
            raise
        try:
            shutil.rmtree(old)
        except OSError as e:
            raise ExecutionError(f"cuda backend: built {str(out)!r}, but the build it "
                                 f"replaced, moved to {str(old)!r}, could not be removed: "
                                 f"{e.strerror or e}") from None


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM recorded instead of handled, then raised again once this ends (to
    the handlers there were). Python runs signal handlers in the main thread alone, whichever
    thread the signal reaches: elsewhere nothing is deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def defer(signum: int, frame: object) -> None:
        got.append(signum)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    kept = {s: h for s, h in previous.items() if h is not None}  # None: set outside Python
    for s in kept:
        signal.signal(s, defer)
    try:
        yield
    finally:
        for s, h in kept.items():
            signal.signal(s, h)
        if got:
            signal.raise_signal(got[0])


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a batch system's time limit, ``kill``) raised as KeyboardInterrupt, as Ctrl-C,
    while a build is written, so that the half-written folder is removed; left as it is
    where a handler is set already or this is not the main thread (which alone takes one)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stand_in(path: Path) -> None:
    """An empty shared library named ``libLLVM.so`` (see the module's docstring)."""
    done = subprocess.run([linker(), "-shared", "-x", "c", "-", "-o", str(path),
                           "-Wl,-soname,libLLVM.so"], input="", capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise ExecutionError(f"cuda backend: building the libLLVM.so stand-in failed: "
                             f"{' '.join(done.stderr.split())[-500:]}")


def run_build(folder: Path, out: Path, repeat: int = 1) -> dict[str, object]:
    """Run the build in ``folder`` on this machine's GPU (``device_main`` in a child process:
    a fault in a kernel ends that process, not this one); its ``run.json`` record. An
    ExecutionError when it cannot run (no NVIDIA driver, a CUDA error)."""
    done = subprocess.run(python_command(str(Path(device_main.__file__)), str(folder), str(out),
                                         "--repeat", str(repeat)), capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        said = " ".join(done.stderr.split())[-1500:]
        raise ExecutionError(f"cuda backend: running {folder.name} failed (exit status "
                             f"{done.returncode}): {said}")
    return json.loads((out / "run.json").read_text())


def read_run(folder: Path, results: Path) -> tuple[Program, dict[str, np.ndarray],
                                                    dict[str, np.ndarray]]:
    """What a run of the build in ``folder`` wrote under ``results`` (``outputs.npz``): the
    unplanned program it is checked against, the build's inputs and the function's results
    (the program's outputs, then the indices its gathers computed), as the reference
    executor's arrays. An ExecutionError names a missing or misshapen result."""
    try:
        manifest = device_main.read_manifest(folder)
        stored = device_main.read_inputs(folder, manifest)
        if not (results / "outputs.npz").exists():
            raise ExecutionError(f"cuda backend: {results} holds no outputs.npz (run the "
                                 "build first: apportion cuda run)")
        outputs = device_main.read_arrays(results / "outputs.npz")
    except device_main.BuildError as e:
        raise ExecutionError(f"cuda backend: {e}") from None
    unplanned = load(folder / "reference.json")
    types = {a["name"]: a["type"] for a in manifest["args"] if a["kind"] == "memref"}
    inputs = {k: _from_storage(v, types[k]) for k, v in stored.items()}
    got = {}
    for r in manifest["results"]:
        value = outputs.get(r["name"])
        if value is None or list(value.shape) != list(r["shape"]):
            said = "is missing" if value is None else f"has shape {list(value.shape)}"
            raise ExecutionError(f"cuda backend: output {r['name']!r} in {results}/outputs.npz "
                                 f"{said}; the build's function returns {r['shape']}")
        got[r["name"]] = _from_storage(value, r["type"])
    return unplanned, inputs, got


def check_build(folder: Path, results: Path) -> list[OutputCheck]:
    """The outputs a run of the build in ``folder`` wrote under ``results`` (``outputs.npz``)
    checked against the reference executor's run of the unplanned program on the same
    inputs."""
    unplanned, inputs, outputs = read_run(folder, results)
    want = expect(unplanned, inputs=inputs)
    return want.compare({**want.inputs, **outputs})
