"""`apportion calibrate`: fit the cost model's coefficients to measured kernel times, from a
measurements file or kernels timed on this machine (``--measure``), and print the coefficients,
the records, the ranks and each shape left out; the measuring, ranking and leaving out are
``apportion.workflows.calibration``'s, the fit ``apportion.cost.calibrate``'s."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from apportion.cost import noise
from apportion.cost.calibrate import (
    Calibration,
    Measurement,
    by_shape,
    default_fit,
    dumps_measurements,
    fit,
    split_text,
    target_toml,
)
from apportion.errors import CalibrationError
from apportion.target.presets import PRESETS
from apportion.target.target import Target
from apportion.workflows import calibration


def parse_fit(text: str | None, target: Target) -> tuple[str, ...]:
    """``--fit a,b,c`` as names (checked when fitting), or the target's default."""
    if text is None:
        return default_fit(target)
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise CalibrationError(f"--fit {text!r}: expected comma-separated coefficient names, "
                               "such as --fit mac_rate,mem_bandwidth,overlap")
    from apportion.cost.calibrate import check_fit_names

    return check_fit_names(names)


def _num(value: float) -> str:
    return f"{value:.4g}"


def coefficient_table(cal: Calibration) -> Table:
    t = Table(title=f"coefficients of {cal.base.name}", title_justify="left")
    for col in ("coefficient", "before", "after", "change", "bounds", "note"):
        t.add_column(col, justify="left" if col in ("coefficient", "note") else "right")
    for c in cal.coefficients:
        change = f"{c.after / c.before - 1:+.1%}" if c.before else "-"
        note = [] if c.determined else ["no record depends on it"]
        if c.tied:
            note.append(f"only its combination with {', '.join(c.tied)} is fitted")
        if c.at_bound:
            note.append(f"at its {c.at_bound} bound")
        t.add_row(c.name, _num(c.before), _num(c.after), change,
                  f"[{_num(c.low)}, {_num(c.high)}]", "; ".join(note))
    return t


def record_table(cal: Calibration) -> Table:
    t = Table(title="records: predicted vs measured", title_justify="left")
    for col in ("#", "shape", "cores", "splits", "measured us", "before us", "fitted us",
                "error"):
        t.add_column(col, justify="left" if col in ("shape", "splits") else "right")
    for i, r in enumerate(cal.records):
        m = r.measurement
        t.add_row(str(i), m.shape + (" (best)" if m.best else ""), str(m.cores), m.split_text,
                  f"{m.time_us:.1f}", f"{r.before_us:.1f}", f"{r.predicted_us:.1f}",
                  f"{r.rel_error:+.1%}")
    return t


def rank_lines(target: Target, measurements: Sequence[Measurement]) -> list[str]:
    lines = []
    for m in measurements:
        if not m.best:
            continue
        r = calibration.rank_split(target, m)
        verdict = "first" if r.first else f"NOT first (balanced picks {split_text(r.pick)} at " \
            f"{r.pick_us:.1f} us{f'; {r.tied} tied, counted against it' if r.tied else ''})"
        lines.append(f"{m.shape} on {m.cores} cores: measured-best {m.split_text} ranks "
                     f"{r.rank} of {r.candidates} candidate splits ({r.predicted_us:.1f} us): "
                     f"{verdict}")
    return lines


def command(measurements_path: str | None, target: Target, preset: str | None,
            fit_text: str | None, out: Path | None, save: Path | None, cores: int | None,
            console: Console) -> int:
    """``apportion calibrate``: every input checked (by the caller: the output paths) before the
    fit; prints the coefficients, the records and the ranks; writes the TOML target."""
    names = parse_fit(fit_text, target)
    why = ""
    if measurements_path is not None:
        measurements = calibration.load(measurements_path)
        source = measurements_path
    else:
        n = cores or os.cpu_count() or 1
        console.print(f"timing every split of {len(calibration.KERNELS)} kernels on this "
                      f"machine, on 1 to {n} core(s), one thread per core, until each is "
                      "settled", highlight=False)
        records, kernels_measured = calibration.measure(target, [n], console)
        measurements = tuple(records)
        console.print(noise.summary(kernels_measured, "kernel"), highlight=False)
        why = calibration.untrusted(calibration.KERNELS, kernels_measured)
        source = "this machine"
        if target.host:  # the host's split-K table (the cpu preset's), measured here too
            from apportion.workflows.host_splitk import measure_table_again

            measure_table_again(console)
        if save is not None:
            _write(save, "--save", dumps_measurements(measurements))
            console.print(f"wrote {save} ({len(measurements)} measurements)", highlight=False)
    predict = calibration.predictor()
    for i, m in enumerate(measurements):  # every record fits the target before any fitting
        try:
            calibration.record_target(target, m)
        except CalibrationError as e:
            raise CalibrationError(f"{source}: record {i}: {e}") from None
    cal = fit(measurements, target, predict, names)
    console.print(f"fitted {', '.join(names)} of {target.name} to {len(measurements)} "
                  f"measurements ({source})", highlight=False)
    console.print(coefficient_table(cal))
    console.print(record_table(cal))
    console.print(f"RMS log error {cal.base_rms_log_error:.3f} -> {cal.rms_log_error:.3f}; "
                  f"worst record {max(abs(r.rel_error) for r in cal.records):.1%} off",
                  highlight=False)
    for line in rank_lines(cal.target, measurements):
        console.print(line, highlight=False)
    if len(by_shape(measurements)) > 1:
        checks = calibration.shape_checks(measurements, cal.target, target, names, console)
        goal = calibration.LOO_ERROR_GOAL
        console.print(calibration.check_table(checks, f"each shape left out: {', '.join(names)} "
                                              "fitted to the other shapes' records", goal))
        console.print(f"left out: the fastest split picked on "
                      f"{sum(c.rank == 1 for c in checks)} of {len(checks)} shapes, time within "
                      f"{goal:.0%} on {sum(abs(c.loo_error) <= goal for c in checks)}",
                      highlight=False)
    if why:  # a fit of noise is no target: shown above, written nowhere
        verdict = f"{out} not written, the fit above is of noise" if out is not None else \
            "the fit above is of noise"
        kept = f" (the measurements are in {save}, their noise with them)" if save else ""
        print(f"apportion: calibrate --measure: {why}: {verdict}; rerun on a quieter machine"
              f"{kept}", file=sys.stderr)
        return calibration.INCONCLUSIVE
    if out is not None:
        comment = [f"fitted by apportion calibrate to {len(measurements)} measurements "
                   f"({source}); RMS log error {cal.rms_log_error:.3f}"]
        _write(out, "-o", target_toml(cal, preset if preset in PRESETS else None, comment))
        console.print(f"wrote {out}", highlight=False)
    return 0


def _write(path: Path, option: str, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise CalibrationError(f"{option} {str(path)!r}: cannot write: {e.strerror or e}"
                               ) from None
