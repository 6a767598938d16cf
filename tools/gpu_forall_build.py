"""Build, here, the GPU run of the parallel IR (issue 21, item 3): cuda builds of the example
programs and of random programs, planned for the ``gpu`` target, for an NVIDIA GPU machine.

Each build (``backends.cuda.build.build``) is the plan's ``scf.forall`` IR lowered
by upstream MLIR to one CUDA kernel per forall (a core of the plan a block) and a host
library, with random inputs. The examples are planned on 8 and 132 blocks (the H100's and
H200's streaming multiprocessors), the random programs (``frontend.random_programs.case``,
the conformance cases) on their case's core count (up to the ``gpu`` preset's 304); a
program the emitter or the lowering refuses is listed with its reason. Each block's work is
split over ``--threads`` threads where that is safe. Written under ``build/gpu_forall/``
(git-ignored), with
``index.json`` naming every build; the folder must stay under the 64 MiB a device run
carries, so examples whose inputs are large are left out (``SKIP``).

    .venv/bin/python tools/gpu_forall_build.py [--random 40]

On the GPU machine (Python 3, numpy and the driver; nothing of apportion installed)::

    for b in build/gpu_forall/*/; do
        python3 apportion/backends/cuda/device_main.py "$b" "$OUT/$(basename "$b")"; done

then ``tools/gpu_forall_check.py RESULTS`` checks every output here against the reference.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import apportion as ap
from apportion.backends.cuda.build import build
from apportion.errors import ApportionError
from apportion.frontend.random_programs import case

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "gpu_forall"
#: examples whose inputs and outputs take over 20 MB (the carry limit), or which need a value
#: for a symbolic loop count
SKIP = {"big", "lm_head_prime_vocab", "fused"}
CORES = (132, 8)
#: an example whose build takes more is built on the first core count only
ONCE_ABOVE = 4 << 20


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=40, help="random programs (seeds 0..N-1)")
    parser.add_argument("--threads", type=int, default=128, help="threads per block (default 128)")
    parser.add_argument("--only", nargs="+", default=None, metavar="EXAMPLE",
                        help="these examples only, on the first core count (a timing set)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the folder (default {OUT})")
    args = parser.parse_args()
    out = args.out
    if out.exists() and any(out.iterdir()) and not (out / "index.json").is_file():
        # replacing is for a set of builds this tool wrote, never a folder of the user's
        raise SystemExit(f"gpu_forall_build: {out} holds no index.json, so this tool did not "
                         "write it; give a new or empty folder with --out")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    index: list[dict[str, object]] = []

    def build_one(name: str, program: ap.Program, cores: int, strategy: str = "balanced",
                  params: dict[str, int] | None = None) -> int:
        entry: dict[str, object] = {"build": name, "program": program.name, "cores": cores}
        try:
            planned = ap.plan(program, ap.targets.gpu(cores=cores), strategy)
            sizes = {k: v for k, v in (params or {}).items() if k in planned.symbols}
            counts = {k: v for k, v in (params or {}).items() if k not in sizes}
            b = build(planned.schedule(sizes, counts), out / name,
                      threads=args.threads)
            entry.update(kernels=b.kernels, threads=b.threads, threaded=b.threaded,
                         bytes=_size(b.path))
        except ApportionError as e:
            entry["refused"] = str(e)[:400]
        index.append(entry)
        print(name, entry.get("kernels", entry.get("refused")))
        return int(entry.get("bytes", 0))  # type: ignore[call-overload]

    for path in sorted((ROOT / "examples").glob("*.json")):
        if path.stem in SKIP or (args.only is not None and path.stem not in args.only):
            continue
        program = ap.load(path)
        # a symbolic loop count, a run-time K at a size that keeps the inputs small
        params = {"softmax_symbolic": {"T": 8}, "dynamic_k": {"K": 8192}}.get(path.stem)
        for cores in CORES:
            if build_one(f"{path.stem}_c{cores}", program, cores, params=params) > ONCE_ABOVE or (
                    args.only is not None):
                break
    for seed in range(0 if args.only is not None else args.random):
        c = case(seed)
        params = dict(c.sizes) or None
        build_one(f"random{seed:03d}", c.program, min(c.target.cores, 304), c.strategy, params)
    (out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    total = _size(out)
    print(f"{sum('kernels' in e for e in index)} builds, {total / 2**20:.1f} MiB in {out}")


if __name__ == "__main__":
    main()
