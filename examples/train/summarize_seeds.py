#!/usr/bin/env python3
"""Summarise several runs of `train` (one per seed) into one table and plot.

Each argument is a folder written by `train --out-dir DIR` (or its
summary.csv).  For every configuration the script reports the mean test
accuracy over the runs that have it, its spread (min..max), the gap to the
baseline's mean, the whole-run ratio and the bytes per worker and step, and
draws accuracy against bytes per step (log scale) so that codecs can be
compared at equal bytes: the "equal-bytes" panel of docs/results.md.

    python3 examples/train/summarize_seeds.py seed1 seed2 seed3 \
        --extra docs/results/full-summary.csv --png equal-bytes.png

--extra adds single runs of other configurations (drawn, marked n=1, never
averaged with the seeds).  Only the standard library and, for the PNG,
gnuplot (Debian gnuplot-nox) are needed.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field


@dataclass
class config_runs:
    name: str
    accuracy: list[float] = field(default_factory=list)
    bytes_per_step: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    target_ratio: list[float] = field(default_factory=list)
    target: str = ""
    wall_seconds: list[float] = field(default_factory=list)
    extra: bool = False  # from --extra: single runs shown beside the seeds


REQUIRED = ("config", "test_accuracy", "sent_bytes_per_worker_step", "ratio", "target_ratio", "target")


def summary_path(arg: str) -> str:
    path = os.path.join(arg, "summary.csv") if os.path.isdir(arg) else arg
    if not os.path.isfile(path):
        raise SystemExit(f"summarize_seeds: {arg}: no summary.csv (run train --out-dir {arg} first)")
    return path


def read_runs(paths: list[str], runs: dict[str, config_runs], extra: bool) -> None:
    for arg in paths:
        path = summary_path(arg)
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise SystemExit(f"summarize_seeds: {path}: not a train summary (missing columns {', '.join(missing)})")
            for row in reader:
                name = row["config"]
                if extra and name in runs and not runs[name].extra:
                    continue  # the seeded runs of a configuration take precedence
                r = runs.setdefault(name, config_runs(name, extra=extra))
                try:
                    r.accuracy.append(float(row["test_accuracy"]))
                    r.bytes_per_step.append(float(row["sent_bytes_per_worker_step"]))
                    r.ratio.append(float(row["ratio"]))
                    r.target_ratio.append(float(row["target_ratio"]))
                    r.wall_seconds.append(float(row.get("wall_seconds") or "nan"))
                except ValueError as e:
                    raise SystemExit(f"summarize_seeds: {path}: bad number in the row of {name}: {e}")
                r.target = row["target"]


def mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def table(runs: dict[str, config_runs]) -> str:
    base = runs.get("baseline")
    base_mean = mean(base.accuracy) if base and not base.extra else None
    lines = [
        "| config | runs | test % mean | spread (min..max) | vs baseline | sent / worker / step | ratio (whole run) | ratio (target layers) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs.values():
        m = mean(r.accuracy)
        spread = f"{min(r.accuracy):.2f}..{max(r.accuracy):.2f}" if len(r.accuracy) > 1 else "-"
        gap = f"{m - base_mean:+.2f}" if base_mean is not None and r.name != "baseline" else "-"
        kib = mean(r.bytes_per_step) / 1024.0
        n = f"{len(r.accuracy)}" + (" (single run)" if r.extra else "")
        target = f"{mean(r.target_ratio):.2f}x ({r.target})" if r.target and r.target != "none" else "-"
        lines.append(f"| {r.name} | {n} | **{m:.2f}** | {spread} | {gap} | {kib:.1f} KiB | {mean(r.ratio):.2f}x | {target} |")
    return "\n".join(lines)


def result_lines(runs: dict[str, config_runs]) -> str:
    out = []
    for r in runs.values():
        if r.extra:
            continue
        out.append(f"RESULT {r.name}_accuracy_mean {mean(r.accuracy):.2f} %")
        if len(r.accuracy) > 1:
            out.append(f"RESULT {r.name}_accuracy_spread {max(r.accuracy) - min(r.accuracy):.2f} points")
        out.append(f"RESULT {r.name}_ratio_mean {mean(r.ratio):.2f} x")
    return "\n".join(out)


def plot(runs: dict[str, config_runs], png: str) -> str:
    if not shutil.which("gnuplot"):
        return "gnuplot not found on PATH (Debian package gnuplot-nox)"
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "points.dat")
        shown = [r for r in runs.values() if mean(r.bytes_per_step) > 0]  # a single worker sends nothing
        with open(data, "w") as d:
            for r in shown:  # one block per configuration (gnuplot's `index`), so each gets its own key entry
                d.write(f"{mean(r.bytes_per_step) / 1024.0} {mean(r.accuracy)} {min(r.accuracy)} {max(r.accuracy)}\n\n\n")
        if not shown:
            return "no configuration sent bytes"
        script = os.path.join(tmp, "plot.gp")
        with open(script, "w") as g:
            g.write(
                "set terminal pngcairo size 1000,600 font ',10'\n"
                f"set output '{png}'\n"
                "set termoption noenhanced\nset grid\nset logscale x\n"
                "set key outside right top\n"
                "set offsets graph 0.02, graph 0.1, graph 0.06, graph 0.04\n"
                "set title 'Final test accuracy against bytes sent per worker and step (mean, min..max over seeds)'\n"
                "set xlabel 'KiB sent per worker and step (whole run, log scale)'\n"
                "set ylabel 'test accuracy (%)'\n"
                "plot " + ", \\\n     ".join(
                    f"'{data}' index {i} using 1:2:3:4 with yerrorbars pt {i % 13 + 1} ps 1.5 lw 1.5 lc {i + 1} "
                    f"title '{r.name}{' (n=1)' if r.extra else f' (n={len(r.accuracy)})'}'"
                    for i, r in enumerate(shown)) + "\n")
        p = subprocess.run(["gnuplot", script], capture_output=True, text=True)
        if p.returncode != 0:
            return "gnuplot failed: " + p.stderr.strip()
    return ""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="folders written by train --out-dir (one per seed), or their summary.csv")
    ap.add_argument("--extra", nargs="*", default=[], help="summary.csv files of single runs to show beside them")
    ap.add_argument("--png", help="write the accuracy-against-bytes plot here")
    ap.add_argument("--csv", help="write the per-configuration means here")
    a = ap.parse_args(argv)

    runs: dict[str, config_runs] = {}
    read_runs(a.runs, runs, extra=False)
    read_runs(a.extra, runs, extra=True)
    if not runs:
        raise SystemExit("summarize_seeds: the summaries hold no runs")
    print(table(runs))
    print()
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["config", "runs", "single_run", "test_accuracy_mean", "test_accuracy_min", "test_accuracy_max",
                        "sent_bytes_per_worker_step_mean", "ratio_mean", "target_ratio_mean", "target"])
            for r in runs.values():
                w.writerow([r.name, len(r.accuracy), int(r.extra), f"{mean(r.accuracy):.4f}", min(r.accuracy),
                            max(r.accuracy), f"{mean(r.bytes_per_step):.1f}", f"{mean(r.ratio):.4f}",
                            f"{mean(r.target_ratio):.4f}", r.target])
        print(f"csv:  {a.csv}")
    if a.png:
        why = plot(runs, os.path.abspath(a.png))
        print(f"plot: {a.png}" if not why else f"plot: not written: {why}")
    print()
    print(result_lines(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
