"""Time the GPU split-K sweep (issue 20, item 3) on an NVIDIA GPU: per shape, the fastest factor
of K, the ``gpu`` resolver's pick and fastest / pick.

Runs on a machine with Python 3 and numpy but no IREE and no apportion: it reads only the
folder ``tools/gpu_splitk_compile.py`` filled (``out/gpu_splitk``: ``manifest.json``, the
``.vmfb`` modules and the ``iree_base_runtime`` and ``ml_dtypes`` wheels for that machine's
Python), unpacks the wheels into ``<folder>/site`` when ``iree.runtime`` is missing, and runs
every module on the
``cuda`` driver:

    python3 tools/gpu_splitk_run.py out/gpu_splitk [--budget-s 400]

Each shape's inputs are random float32 arrays uploaded once; each factor's module is checked
once against numpy's ``x @ w`` (a mismatch is reported, and its time is no candidate) and timed
after warm-up calls, each call ending with the (M x N) result copied to the host, in
interleaved rounds until every factor has ``--repeats`` calls (least time kept); a module whose
checked call took over ``SLOW_S`` (the issue's 16.8M-long K barely split) is timed by that call
alone. Shapes run smallest first; a shape or module that would start past ``--budget-s`` is
skipped and said so. The tables go to stdout and, with ``$OUT`` set,
``$OUT/gpu_splitk_results.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

#: fastest / pick at least this is a good pick (issue 20's goal for the cpu target)
GOAL = 0.9
#: a module whose checked call takes longer than this is timed by that call alone
SLOW_S = 1.0


def runtime(folder: Path):  # noqa: ANN201 - the iree.runtime module, typed only where it exists
    """``iree.runtime``, installed from the carried wheel when missing."""
    try:
        import iree.runtime as rt
        return rt
    except ImportError:
        pass
    site = folder / "site"
    if not (site / "iree").exists():
        wheels = sorted(glob.glob(str(folder / "*.whl")))
        if not any(Path(w).name.startswith("iree_base_runtime-") for w in wheels):
            sys.exit(f"no iree.runtime and no iree_base_runtime wheel in {folder}")
        # a wheel is a zip of the installed files: unpacked as is, no pip needed (its bundled
        # libraries sit beside the package, found through their relative rpaths); the
        # runtime's ml_dtypes comes as a wheel too
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as whl:
                for info in whl.infolist():
                    path = Path(whl.extract(info, site))
                    mode = info.external_attr >> 16
                    if mode:
                        path.chmod(mode & 0o777)
    sys.path.insert(0, str(site))
    import iree.runtime as rt
    return rt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default="out/gpu_splitk")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=400.0)
    ap.add_argument("--driver", default="cuda", help="IREE driver (local-task: CPU modules)")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    rt = runtime(folder)
    config = rt.Config(args.driver)
    print(f"device: {args.driver} driver, {len(manifest['entries'])} modules, flags "
          f"{' '.join(manifest['flags'])}", flush=True)
    shapes: dict[tuple[int, int, int], list[dict]] = {}
    for e in manifest["entries"]:
        shapes.setdefault((e["m"], e["n"], e["k"]), []).append(e)
    start, results = time.perf_counter(), []
    rng = np.random.default_rng(0)
    for (m, n, k), entries in sorted(shapes.items(), key=lambda s: s[0][0] * s[0][1] * s[0][2]):
        if time.perf_counter() - start > args.budget_s:
            print(f"\n{m}x{n}x{k}: skipped (past the {args.budget_s:.0f} s budget)")
            results.append({"shape": [m, n, k], "skipped": True})
            continue
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        want = x @ w
        scale = float(np.abs(want).max()) or 1.0
        dx, dw = rt.asdevicearray(config.device, x), rt.asdevicearray(config.device, w)
        calls, rows = {}, []
        times: dict[int, list[float]] = {}
        for e in sorted(entries, key=lambda e: -e["factor"]):  # the slow unsplit ones last
            if time.perf_counter() - start > args.budget_s:
                rows.append({"factor": e["factor"], "form": e["form"], "rel_err": None,
                             "ok": False, "note": "skipped: past the budget"})
                continue
            ctx = rt.SystemContext(config=config)
            ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance,
                                                      (folder / e["file"]).read_bytes()))
            fn = ctx.modules.module[e["function"]]
            t0 = time.perf_counter()
            got = np.asarray(fn(dx, dw).to_host())
            first = time.perf_counter() - t0
            err = float(np.abs(got - want).max()) / scale
            ok = err <= 2e-3
            row = {"factor": e["factor"], "form": e["form"], "rel_err": err, "ok": ok,
                   "note": "" if ok else "MISMATCH"}
            rows.append(row)
            if ok and first > SLOW_S:
                # a call of seconds (a long K barely split) is timed by that one call: its
                # module load is noise beside it, and repeats would spend the GPU's time
                times[e["factor"]] = [first]
                row["note"] = "timed once"
            elif ok:
                calls[e["factor"]] = (ctx, fn)
                times[e["factor"]] = []
        for _ in range(args.warmup):
            for _f, (_ctx, fn) in calls.items():
                np.asarray(fn(dx, dw).to_host())
        for _ in range(args.repeats):  # interleaved: drift hits every factor alike
            for f, (_ctx, fn) in calls.items():
                t0 = time.perf_counter()
                np.asarray(fn(dx, dw).to_host())
                times[f].append(time.perf_counter() - t0)
        for row in rows:
            ts = times.get(row["factor"])
            row["least_ms"] = None if not ts else min(ts) * 1e3
            row["median_ms"] = None if not ts else float(np.median(ts)) * 1e3
        pick = entries[0]["gpu_pick"]
        timed = {r["factor"]: r["least_ms"] for r in rows if r["least_ms"] is not None}
        fastest = min(timed, key=timed.get) if timed else None
        ratio = (timed[fastest] / timed[pick]) if fastest is not None and pick in timed else None
        print(f"\n{m}x{n}x{k} (gpu pick {pick})")
        print(f"  {'factor':>7} {'form':>9} {'least ms':>10} {'median ms':>10} {'rel err':>9}")
        for r in sorted(rows, key=lambda r: r["factor"]):
            least = "-" if r["least_ms"] is None else f"{r['least_ms']:.3f}"
            median = "-" if r["median_ms"] is None else f"{r['median_ms']:.3f}"
            err = "-" if r["rel_err"] is None else f"{r['rel_err']:.2e}"
            print(f"  {r['factor']:>7} {r['form']:>9} {least:>10} {median:>10} {err:>9}  "
                  f"{r['note']}")
        results.append({"shape": [m, n, k], "gpu_pick": pick, "fastest": fastest,
                        "fastest_over_pick": ratio, "rows": rows})
        del dx, dw, calls
    print("\nshape                 fastest  gpu pick  fastest/pick")
    for r in results:
        shape = "x".join(map(str, r["shape"]))
        if r.get("skipped"):
            print(f"{shape:<21} skipped")
            continue
        ratio = "-" if r["fastest_over_pick"] is None else f"{r['fastest_over_pick']:.2f}"
        mark = "" if r["fastest_over_pick"] is None or r["fastest_over_pick"] >= GOAL else " <"
        print(f"{shape:<21} {r['fastest']!s:>7} {r['gpu_pick']:>9} {ratio:>13}{mark}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_splitk_results.json").write_text(json.dumps(
            {"format": "apportion.gpu-splitk-results/1", "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
