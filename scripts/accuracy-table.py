#!/usr/bin/python3
"""Accuracy per byte: trains cells (a name and `sparsecomm train` flags) over
seeds, then tabulates each cell's final held-out loss and accuracy (mean and
spread over seeds) beside its bytes per rank per step as a share of the
first cell's (dense's).

    scripts/accuracy-table.py run OUT CELLS [--seeds "42 1 2"] [--common "FLAGS"] [--only "NAME..."]
    scripts/accuracy-table.py table OUT CELLS [--seeds "42 1 2"] [--only "NAME..."]

CELLS is a file of lines `NAME FLAGS...` (# starts a comment); the first
cell is the reference. Each run goes to OUT/NAME/seedS; a run whose
summary.json exists is skipped, so `run` resumes. --common holds flags for
every cell (the model, steps, batch); --only keeps the named cells of
CELLS, in its order. SPARSECOMM_BIN names another binary
than build/sparsecomm (the table reads the runs through its `report
--format json`: scripts/run_dirs.py). The cells of the pages of
docs/benchmarks/ are in scripts/accuracy-cells/.
"""

import argparse
import math
import os
import shlex
import statistics
import subprocess
import sys

import run_dirs


def read_cells(path):
    cells = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, flags = line.partition(" ")
            if "/" in name or name in (c[0] for c in cells):
                sys.exit(f"{path}:{number}: cell name '{name}' is not a new plain name")
            cells.append((name, shlex.split(flags)))
    if not cells:
        sys.exit(f"{path}: no cell (lines 'NAME FLAGS...')")
    return cells


def run_cells(out, cells, seeds, common):
    binary = run_dirs.binary()
    for name, flags in cells:
        for seed in seeds:
            run_dir = os.path.join(out, name, f"seed{seed}")
            if run_dirs.finished(run_dir):
                continue
            if os.path.exists(run_dir):
                sys.exit(f"{run_dir} holds an unfinished run: delete it to run it again")
            command = [binary, "train", *common, *flags, "--seed", str(seed), "--no-plots",
                       "--out", run_dir]
            print("+", shlex.join(command), flush=True)
            log = run_dir + ".log"
            os.makedirs(os.path.dirname(run_dir), exist_ok=True)
            with open(log, "w") as f:
                code = subprocess.call(command, stdout=f, stderr=subprocess.STDOUT)
            if code != 0:
                print(f"  failed (exit {code}); see {log}", flush=True)


def spread(values, digits=4):
    """Mean ± sample standard deviation (the mean alone for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(out, cells, seeds):
    runs = {run["dir"]: run for run in run_dirs.load_runs(
        d for d in (os.path.join(out, name, f"seed{seed}") for name, _ in cells for seed in seeds)
        if run_dirs.finished(d))}
    rows = []
    for name, flags in cells:
        losses, accuracies, byte_counts, diverged, found = [], [], [], 0, []
        for seed in seeds:
            run_dir = os.path.join(out, name, f"seed{seed}")
            if run_dir not in runs:
                if os.path.exists(run_dir + ".log"):
                    # started without a summary: failed, diverged, or still running
                    diverged += 1
                continue
            summary = runs[run_dir]["summary"]
            last = runs[run_dir]["evals"][-1] if runs[run_dir]["evals"] else None
            found.append(seed)
            loss = last["test_loss"] if last and last["test_loss"] is not None else float("nan")
            if not math.isfinite(loss):
                diverged += 1
                continue
            losses.append(loss)
            accuracies.append(100.0 * summary["test_accuracy"])
            byte_counts.append(summary["bytes_per_rank_per_step"])
        rows.append((name, flags, losses, accuracies, byte_counts, diverged, found))
    reference = rows[0]
    ref_loss = statistics.fmean(reference[2]) if reference[2] else float("nan")
    ref_bytes = statistics.fmean(reference[4]) if reference[4] else float("nan")
    ref_accuracy = statistics.fmean(reference[3]) if reference[3] else float("nan")
    print(f"| cell | flags | seeds | held-out loss | vs {reference[0]} | test acc % | "
          f"points vs {reference[0]} | bytes/rank/step | share of {reference[0]}'s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, flags, losses, accuracies, byte_counts, diverged, found in rows:
        if not losses:
            print(f"| {name} | `{shlex.join(flags)}` | {len(found)} | "
                  f"{'no summary (failed, diverged or running)' if diverged else 'not run'} "
                  f"| | | | | |")
            continue
        mean_loss = statistics.fmean(losses)
        mean_bytes = statistics.fmean(byte_counts)
        note = f" ({diverged} without a summary: failed, diverged or running)" if diverged else ""
        print(f"| {name} | `{shlex.join(flags)}` | {len(losses)}{note} | {spread(losses)} | "
              f"{100.0 * (mean_loss / ref_loss - 1.0):+.1f}% | "
              f"{spread(accuracies, 2)} | {statistics.fmean(accuracies) - ref_accuracy:+.2f} | "
              f"{mean_bytes / 1024:.1f} KiB | "
              f"{100.0 * mean_bytes / ref_bytes:.2f}% |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "table"))
    parser.add_argument("out")
    parser.add_argument("cells")
    parser.add_argument("--seeds", default="42 1 2")
    parser.add_argument("--common", default="")
    parser.add_argument("--only", default="", help="names of the cells to keep")
    args = parser.parse_args()
    cells = read_cells(args.cells)
    if args.only:
        names = args.only.split()
        unknown = [n for n in names if n not in (c[0] for c in cells)]
        if unknown:
            sys.exit(f"--only names {', '.join(unknown)}, not cells of {args.cells} "
                     f"(it has {', '.join(c[0] for c in cells)})")
        cells = [c for c in cells if c[0] in names]
    try:
        seeds = [int(s) for s in args.seeds.split()]
    except ValueError:
        sys.exit(f"--seeds takes integers separated by spaces, got '{args.seeds}'")
    if args.action == "run":
        run_cells(args.out, cells, seeds, shlex.split(args.common))
    table(args.out, cells, seeds)


if __name__ == "__main__":
    main()
