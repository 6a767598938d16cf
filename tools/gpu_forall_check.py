"""Check, here, the GPU run of the parallel IR (issue 21, item 3): every output a GPU machine
wrote for the builds ``tools/gpu_forall_build.py`` built, against the reference executor on
the same inputs (``backends.cuda.build.check_build``), into one record.

    .venv/bin/python tools/gpu_forall_check.py RESULTS [--out docs/measurements/FILE.json]

``RESULTS`` holds one folder per build (``outputs.npz``, ``run.json``) and ``gpu.txt``; the
record lists per build the program, blocks, kernels, whether every output matched (with the
largest errors), the least of the timed calls, and the refusals of the build. Exit 1 when an
output that ran differs from the reference.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from apportion.backends.cuda.build import check_build

ROOT = Path(__file__).resolve().parent.parent
BUILDS = ROOT / "build" / "gpu_forall"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="write the record here")
    args = parser.parse_args()
    index = json.loads((BUILDS / "index.json").read_text())
    rows: list[dict[str, object]] = []
    bad = 0
    for entry in index:
        row = dict(entry)
        name = str(entry["build"])
        if "refused" not in entry:
            got = args.results / name
            if not (got / "run.json").exists():
                row["ran"] = False
            else:
                run = json.loads((got / "run.json").read_text())
                checks = check_build(BUILDS / name, got)
                row.update(ran=True, device=run["device"],
                           best_ms=round(min(run["run_s"]) * 1e3, 3),
                           ok=all(c.ok for c in checks),
                           outputs={c.tensor: {"ok": c.ok, "max_abs_err": float(c.max_abs_err),
                                               "max_rel_err": float(c.max_rel_err)}
                                    for c in checks})
                bad += not row["ok"]
        row.pop("bytes", None)
        rows.append(row)
        print(f"{name:24} {row.get('ok', row.get('refused', 'not run'))!s:.100}")
    ran = [r for r in rows if r.get("ran")]
    said = (args.results / "gpu.txt").read_text() if (args.results / "gpu.txt").exists() else ""
    # the GPU's name and driver, not its serial number
    gpu = " ".join(re.sub(r"\s*\(UUID:[^)]*\)", "", said).split())
    summary = {"gpu": gpu, "built": len([r for r in rows if "refused" not in r]),
               "refused": len([r for r in rows if "refused" in r]), "ran": len(ran),
               "matched": len([r for r in ran if r["ok"]])}
    print(json.dumps(summary))
    if args.out is not None:
        args.out.write_text(json.dumps({"summary": summary, "builds": rows}, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
