"""Compile, here, the GPU split-K sweep of issue 20 (item 3) for an NVIDIA H100/H200.

For each shape ``[M, N, K]`` (the models file's ``split_k_shapes_MNK`` with skinny outputs,
K kept whole, and the issue's 128 x 134 x 16,800,000), and each factor of K among the powers
of two up to 2048 that cut K into whole slices (plus the ``gpu`` resolver's own pick where it
is no power of two), this plans the float32 matmul ``y = x @ w`` with K split that many ways
(pinned, on the stock ``cpu`` target: the same plan and IR ``apportion bench splitk`` compiles
for the CPU, partial matmuls plus the combine sum; factor 1 is the unsplit plan) and compiles
the emitted IR with IREE's CUDA backend (``--iree-hal-target-device=cuda``) into ``.vmfb``
files under ``out/gpu_splitk/`` (git-ignored), with
``manifest.json`` naming each file's shape, factor, function and the ``gpu`` resolver's pick.
``tools/gpu_splitk_run.py`` times them on a GPU machine without IREE (see its docstring).

The target is ``--iree-cuda-target=sm_80``: IREE 3.13 knows no sm_90 target (``sm_90`` fails
with "missing GPU target in #hal.executable.target", iree-org/iree#22147; ``hopper`` and
``h100`` crash the compiler). The module embeds PTX, which the H100's driver compiles for
sm_90 when it is loaded (PTX runs on later architectures).

    .venv/bin/python tools/gpu_splitk_compile.py              # every shape
    .venv/bin/python tools/gpu_splitk_compile.py --shapes 32x32x40960 128x134x16800000

Before it is carried, put the IREE runtime wheel for the GPU machine's Python 3.12 and its
``ml_dtypes`` dependency beside the modules (the folder must stay under 60 MiB; the script
reports its size)::

    .venv/bin/pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux_2_28_x86_64 iree-base-runtime==3.13.0 ml_dtypes -d out/gpu_splitk
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from apportion.backends.iree.runtime import lower_forall
from apportion.errors import ApportionError
from apportion.frontend.models import load_models
from apportion.mlir.builder import symbol_name
from apportion.mlir.forall import forall_mlir
from apportion.planned import plan
from apportion.target.presets import gpu
from apportion.target.split_k import ReductionShape, gpu_slices
from apportion.workflows.host_splitk import SKINNY_OUTPUT, factor_target, matmul_program, split_of

OUT = Path("out/gpu_splitk")
FLAGS = ("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80",
         "--iree-opt-const-expr-hoisting=false", "--iree-input-demote-f64-to-f32=false")
#: the factors swept: powers of two up to IREE's largest limit (2048 slices)
POWERS = tuple(1 << i for i in range(12))
#: the issue's shape: IREE cuts K into 2000 partitions (more than the 304 compute units)
ISSUE_SHAPE = (128, 134, 16_800_000)
#: a slice keeps at least this many elements of K (smaller slices only measure overhead)
LEAST_SLICE = 32


def shapes() -> list[tuple[int, int, int]]:
    """The skinny shapes of the models file, K whole, then the issue's shape."""
    rows = [tuple(r) for r in load_models()["split_k_shapes_MNK"]]
    return [(m, n, k) for m, n, k in rows if m * n <= SKINNY_OUTPUT] + [ISSUE_SHAPE]


def gpu_pick(m: int, n: int, k: int) -> int:
    """The ``gpu`` resolver's slices of K for the matmul (1: left whole)."""
    return gpu_slices(ReductionShape(1, m, n, k)) or 1


def factors(m: int, n: int, k: int) -> list[int]:
    """The factors swept for a shape: whole slices of at least ``LEAST_SLICE``, and the pick."""
    chosen = {f for f in POWERS if f == 1 or (k % f == 0 and k // f >= LEAST_SLICE)}
    return sorted(chosen | {gpu_pick(m, n, k)})


def expanded_text(m: int, n: int, k: int, factor: int) -> str:
    """The plan's partial and combine ops with K read through ``tensor.expand_shape`` (``[M,
    K]`` as ``[M, f, K/f]``): the same two ops, in the form IREE's CUDA codegen takes (it
    cannot pack a reduction dim read only inside ``K/f * s + k``: "failed to pack reduction
    dimensions for partial reduction"). IREE distributes it over the GPU itself.

    >>> "tensor<32x4x10240xf32>" in expanded_text(32, 32, 40960, 4)
    True
    """
    t = k // factor
    x, w, y = f"tensor<{m}x{k}xf32>", f"tensor<{k}x{n}xf32>", f"tensor<{m}x{n}xf32>"
    xe, we, p = (f"tensor<{m}x{factor}x{t}xf32>", f"tensor<{factor}x{t}x{n}xf32>",
                 f"tensor<{factor}x{m}x{n}xf32>")
    body = ("    ^bb0(%a: f32, %b: f32, %acc: f32):\n      %mul = arith.mulf %a, %b : f32\n"
            "      %add = arith.addf %acc, %mul : f32\n      linalg.yield %add : f32\n")
    return (
        f"func.func @mm(%x: {x}, %w: {w}) -> {y} {{\n"
        f"  %zero = arith.constant 0.0 : f32\n"
        f"  %xe = tensor.expand_shape %x [[0], [1, 2]] output_shape [{m}, {factor}, {t}] : "
        f"{x} into {xe}\n"
        f"  %we = tensor.expand_shape %w [[0, 1], [2]] output_shape [{factor}, {t}, {n}] : "
        f"{w} into {we}\n"
        f"  %pe = tensor.empty() : {p}\n"
        f"  %pi = linalg.fill ins(%zero : f32) outs(%pe : {p}) -> {p}\n"
        f"  %p = linalg.generic {{indexing_maps = [affine_map<(s, i, j, r) -> (i, s, r)>, "
        f"affine_map<(s, i, j, r) -> (s, r, j)>, affine_map<(s, i, j, r) -> (s, i, j)>], "
        f"iterator_types = [\"parallel\", \"parallel\", \"parallel\", \"reduction\"]}} "
        f"ins(%xe, %we : {xe}, {we}) outs(%pi : {p}) {{\n{body}  }} -> {p}\n"
        f"  %ye = tensor.empty() : {y}\n"
        f"  %yi = linalg.fill ins(%zero : f32) outs(%ye : {y}) -> {y}\n"
        f"  %y = linalg.generic {{indexing_maps = [affine_map<(i, j, s) -> (s, i, j)>, "
        f"affine_map<(i, j, s) -> (i, j)>], iterator_types = [\"parallel\", \"parallel\", "
        f"\"reduction\"]}} ins(%p : {p}) outs(%yi : {y}) {{\n"
        f"    ^bb0(%a: f32, %acc: f32):\n      %add = arith.addf %acc, %a : f32\n"
        f"      linalg.yield %add : f32\n  }} -> {y}\n"
        f"  return %y : {y}\n}}\n")


def compile_one(m: int, n: int, k: int, factor: int) -> dict[str, object]:
    """Plan, emit and compile one factor (the plan's IR, else its expanded form); its manifest
    entry (``form``: which was compiled)."""
    import iree.compiler as compiler

    program = matmul_program(m, n, k, "float32", factor)  # 1: pinned whole
    target = factor_target()
    result = plan(program, target)
    got, cores = split_of(result.plan)
    if got != factor:
        raise ApportionError(f"{m}x{n}x{k}: split_k {factor} planned as {got} slices")
    planned = result.program
    text = lower_forall(forall_mlir(result.lowered))
    start = time.perf_counter()
    form, function = "plan", symbol_name(planned.name)
    try:
        vmfb = compiler.compile_str(text, extra_args=list(FLAGS))
    except compiler.CompilerToolError as e:
        if factor == 1:
            raise
        why = next((line for line in str(e).splitlines() if "error:" in line), "")
        print(f"  the plan's IR fails in IREE's CUDA codegen ({why.strip()[:120]}); "
              "compiling its expanded form", flush=True)
        vmfb = compiler.compile_str(expanded_text(m, n, k, factor), extra_args=list(FLAGS))
        form, function = "expanded", "mm"
    name = f"mm_{m}x{n}x{k}_f{factor}.vmfb"
    (OUT / name).write_bytes(bytes(vmfb))
    return {"m": m, "n": n, "k": k, "factor": factor, "file": name, "form": form,
            "function": function, "inputs": list(program.inputs),
            "compile_s": round(time.perf_counter() - start, 2), "planned_cores": cores}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", help="MxNxK shapes (default: see the docstring)")
    args = ap.parse_args(argv)
    todo = ([tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes
            else shapes())
    OUT.mkdir(parents=True, exist_ok=True)
    entries = []
    for m, n, k in todo:
        pick = gpu_pick(m, n, k)
        for f in factors(m, n, k):
            entry = compile_one(m, n, k, f)
            entry["gpu_pick"] = pick
            entries.append(entry)
            print(f"{m}x{n}x{k} factor {f}: {entry['file']} ({entry['compile_s']} s)",
                  flush=True)
    manifest = {"format": "apportion.gpu-splitk-sweep/1", "flags": list(FLAGS),
                "target": gpu().name, "entries": entries}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"{len(entries)} modules in {OUT} ({size / 2**20:.1f} MiB with the wheel if present; "
          "keep it under 60 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
