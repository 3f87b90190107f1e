#!/usr/bin/python3
"""Accuracy per byte: trains cells (a name and `sparsecomm train` flags) over
seeds, then tabulates each cell's final held-out loss and accuracy (mean and
spread over seeds) beside its bytes per rank per step as a share of the
first cell's (dense's).

    scripts/accuracy-table.py run OUT CELLS [--seeds "42 1 2"] [--common "FLAGS"] [--only "NAME..."] [--save FILE]
    scripts/accuracy-table.py table OUT CELLS [--seeds "42 1 2"] [--only "NAME..."] [--save FILE]
    scripts/accuracy-table.py show FILE

CELLS is a file of lines `NAME FLAGS...` (# starts a comment); the first
cell is the reference. Each run goes to OUT/NAME/seedS; a run whose
summary.json exists is skipped, so `run` resumes. --common holds flags for
every cell (the model, steps, batch); --only keeps the named cells of
CELLS, in its order. SPARSECOMM_BIN names another binary
than build/sparsecomm (the table reads the runs through its `report
--format json`: scripts/run_dirs.py). The cells of the pages of
docs/benchmarks/ are in scripts/accuracy-cells/.

--save FILE writes what the table is computed from (each cell's flags and,
per seed, the final held-out loss, test accuracy, bytes per rank per step,
K/k and the ranks' mean exchange seconds per step, or that the run has no
summary) as a small JSON file: the file
docs/data keeps for a table instead of its runs. `show FILE` prints the
table from it, the same table `table` printed.
"""

import argparse
import json
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


def collect(out, cells, seeds):
    """What the table is computed from: per cell its flags and per seed the
    run's figures, "no summary" for a run started without one (failed,
    diverged or still running), or nothing for a run never started."""
    runs = {run["dir"]: run for run in run_dirs.load_runs(
        d for d in (os.path.join(out, name, f"seed{seed}") for name, _ in cells for seed in seeds)
        if run_dirs.finished(d))}
    collected = []
    for name, flags in cells:
        results = {}
        for seed in seeds:
            run_dir = os.path.join(out, name, f"seed{seed}")
            if run_dir not in runs:
                if os.path.exists(run_dir + ".log"):
                    results[str(seed)] = "no summary"
                continue
            summary = runs[run_dir]["summary"]
            last = runs[run_dir]["evals"][-1] if runs[run_dir]["evals"] else None
            exchange = summary.get("per_worker_mean_s", {}).get("exchange")
            results[str(seed)] = {
                "test_loss": last["test_loss"] if last else None,
                "test_accuracy": summary["test_accuracy"],
                "bytes_per_rank_per_step": summary["bytes_per_rank_per_step"],
                "density_ratio": summary.get("density_ratio_mean"),
                "exchange_s_per_step": statistics.fmean(exchange) if exchange else None}
        collected.append({"cell": name, "flags": flags, "seeds": results})
    return collected


def optional_mean(results, key, scale=1.0, digits=2):
    """The mean of `key` over the seeds' results that hold it, or ""."""
    values = [r[key] for r in results if isinstance(r, dict) and r.get(key) is not None]
    return f"{scale * statistics.fmean(values):.{digits}f}" if values else ""


def table(collected):
    # Files saved before K/k and the exchange time were kept lack them: those
    # columns appear when some cell has them.
    extra = any(isinstance(r, dict) and r.get("density_ratio") is not None
                for cell in collected for r in cell["seeds"].values())
    rows = []
    for cell in collected:
        losses, accuracies, byte_counts, diverged, found = [], [], [], 0, []
        for seed, result in cell["seeds"].items():
            if result == "no summary":
                diverged += 1
                continue
            found.append(seed)
            loss = result["test_loss"] if result["test_loss"] is not None else float("nan")
            if not math.isfinite(loss):
                diverged += 1
                continue
            losses.append(loss)
            accuracies.append(100.0 * result["test_accuracy"])
            byte_counts.append(result["bytes_per_rank_per_step"])
        rows.append((cell["cell"], cell["flags"], losses, accuracies, byte_counts, diverged,
                     found, list(cell["seeds"].values())))
    reference = rows[0]
    ref_loss = statistics.fmean(reference[2]) if reference[2] else float("nan")
    ref_bytes = statistics.fmean(reference[4]) if reference[4] else float("nan")
    ref_accuracy = statistics.fmean(reference[3]) if reference[3] else float("nan")
    print(f"| cell | flags | seeds | held-out loss | vs {reference[0]} | test acc % | "
          f"points vs {reference[0]} | bytes/rank/step | share of {reference[0]}'s |"
          + (" K/k | exchange ms/step |" if extra else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|---|" if extra else ""))
    for name, flags, losses, accuracies, byte_counts, diverged, found, results in rows:
        if not losses:
            print(f"| {name} | `{shlex.join(flags)}` | {len(found)} | "
                  f"{'no summary (failed, diverged or running)' if diverged else 'not run'} "
                  f"| | | | | |" + (" | |" if extra else ""))
            continue
        more = (f" {optional_mean(results, 'density_ratio')} | "
                f"{optional_mean(results, 'exchange_s_per_step', 1e3, 1)} |") if extra else ""
        mean_loss = statistics.fmean(losses)
        mean_bytes = statistics.fmean(byte_counts)
        note = f" ({diverged} without a summary: failed, diverged or running)" if diverged else ""
        print(f"| {name} | `{shlex.join(flags)}` | {len(losses)}{note} | {spread(losses)} | "
              f"{100.0 * (mean_loss / ref_loss - 1.0):+.1f}% | "
              f"{spread(accuracies, 2)} | {statistics.fmean(accuracies) - ref_accuracy:+.2f} | "
              f"{mean_bytes / 1024:.1f} KiB | "
              f"{100.0 * mean_bytes / ref_bytes:.2f}% |" + more)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("run", "table", "show"))
    parser.add_argument("out", help="the runs' folder (show: a file --save wrote)")
    parser.add_argument("cells", nargs="?")
    parser.add_argument("--seeds", default="42 1 2")
    parser.add_argument("--common", default="")
    parser.add_argument("--only", default="", help="names of the cells to keep")
    parser.add_argument("--save", help="also write what the table is computed from to FILE")
    args = parser.parse_args()
    if args.action == "show":
        if args.cells or args.save:
            sys.exit("show takes only the FILE that --save wrote")
        try:
            with open(args.out) as f:
                table(json.load(f)["cells"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"show: {args.out} is not a file accuracy-table.py --save wrote ({e})")
        return
    if not args.cells:
        sys.exit(f"{args.action} needs OUT and CELLS (a file of lines 'NAME FLAGS...')")
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
    collected = collect(args.out, cells, seeds)
    if args.save:
        with open(args.save, "w") as f:
            json.dump({"cells": collected}, f, indent=1)
            f.write("\n")
    table(collected)


if __name__ == "__main__":
    main()
