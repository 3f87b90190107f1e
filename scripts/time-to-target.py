#!/usr/bin/python3
"""Time to a target measured on emulated clusters (scripts/time-to-target.sh)
beside `sparsecomm plan`'s prediction from a convergence profile.

    scripts/time-to-target.py OUT --convergence PROFILE.json
        (--target-accuracy P | --target-loss X)

For each cluster OUT/<rate>-h<hosts>, each run's steps and training seconds
to the target (the first evaluation that meets it, interpolated linearly
from the one before), its mean step, bytes per rank per step, and `plan`'s
predicted seconds (the profile's steps to the target times the model's step
on the cluster's calibrated profile, with the compute per step and its
spread the run measured: on a real cluster they do not depend on the
method, but emulated hosts share the machine's cores, and a dense
exchange's busy waiting slows their compute). A
run stopped short (time-to-target.sh --short) is composed: the steps to
the target of the same cell's full run on the same hosts at another rate
(a --deterministic trajectory does not depend on the network) times its own
mean step; the table marks it. Where no such run exists (dense on the wide
MLP would take hours on these links), --pilots DIR composes it from the
pilot run of the same cell and seed on thread ranks, DIR/<cell>/seed<S>
(scripts/accuracy-table.py's layout), when its model, method, density,
batch, ranks, schedule and --deterministic match. SPARSECOMM_BIN names
another binary than build/sparsecomm.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

import run_dirs

def meets(record, target):
    kind, value = target
    if kind == "accuracy":
        return record["test_accuracy"] is not None and 100.0 * record["test_accuracy"] >= value
    return record["test_loss"] is not None and record["test_loss"] <= value


def to_target(run, target):
    """(steps, seconds) to the target, interpolated; None when not reached."""
    kind, value = target
    previous = None
    for record in run["evals"]:
        if meets(record, target):
            if previous is None:
                return record["step"], record["wall_s"]
            metric = (lambda r: 100.0 * r["test_accuracy"]) if kind == "accuracy" else (
                lambda r: r["test_loss"])
            span = metric(record) - metric(previous)
            share = (value - metric(previous)) / span if span != 0 else 1.0
            share = min(max(share, 0.0), 1.0)
            lerp = lambda key: previous[key] + share * (record[key] - previous[key])
            return lerp("step"), lerp("wall_s")
        previous = record
    return None


def is_short(run):
    return bool(run["config"].get("stop_at_step", 0))


# What must match for a pilot's trajectory to be the short run's.
TRAJECTORY_KEYS = ("model", "method", "density", "batch", "epochs", "max_steps", "seed",
                   "deterministic", "lr", "optimizer", "method_options", "local_steps")


def pilot_steps(pilots, name, run, target):
    """(steps to the target, None) from the pilot of cell `name`, or
    (None, why not)."""
    config = run["config"]
    pilot_dir = os.path.join(pilots, name, f"seed{config.get('seed')}")
    if not run_dirs.finished(pilot_dir):
        return None, f"no pilot {pilot_dir}"
    pilot = run_dirs.load_run(pilot_dir)
    ranks = lambda r: r["summary"].get("workers")
    differs = [k for k in TRAJECTORY_KEYS if pilot["config"].get(k) != config.get(k)]
    if ranks(pilot) != ranks(run):
        differs.append("workers")
    if differs:
        return None, f"pilot differs in {', '.join(differs)}"
    found = to_target(pilot, target)
    return (found[0], None) if found else (None, "not reached")


def plan_prediction(binary, cluster_dir, model, hosts, reference, args):
    """plan's time to the target of each configuration of the profile, on
    this cluster with the compute per step of the run `reference`."""
    workers = reference["summary"]["per_worker_mean_s"]["compute"]
    command = [binary, "plan", "--model", model, "-n", str(hosts), "--profile",
               os.path.join(cluster_dir, "profile.json"), "--compute-ms",
               repr(1e3 * statistics.fmean(workers)), "--compute-spread-ms",
               repr(1e3 * reference["summary"].get("compute_spread_s", 0.0)), "--convergence",
               args.convergence, "--format", "json"]
    if args.target_accuracy is not None:
        command += ["--target-accuracy", repr(args.target_accuracy)]
    else:
        command += ["--target-loss", repr(args.target_loss)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"plan failed: {' '.join(command)}\n{result.stderr}")
    rows = json.loads(result.stdout)["time_to_target"]["per_ranks"]
    return rows[0]["configurations"]


def run_options(binary, run):
    """The run's configuration options as a profile labels them ("rank=8",
    "values=int8"; "" for the defaults), by `sparsecomm convergence
    --describe`, which reads config.json alone."""
    result = subprocess.run([binary, "convergence", "--describe", run["dir"]],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"convergence --describe failed on {run['dir']}:\n{result.stderr}")
    return json.loads(result.stdout)["options"]


def matching(configurations, run, options):
    summary, config = run["summary"], run["config"]
    for c in configurations:
        if (c["method"] != summary["method"] or c["local_steps"] != config.get("local_steps", 0)
                or c["options"] != options):
            continue
        if c["method"] == "dense" or abs(c["density"] - summary["density"]) < 1e-12:
            return c
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--convergence", required=True)
    parser.add_argument("--pilots", help="compose short runs without a full run on the hosts "
                        "from the pilot runs here (DIR/<cell>/seed<S>)")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--target-accuracy", type=float)
    group.add_argument("--target-loss", type=float)
    args = parser.parse_args()
    target = (("accuracy", args.target_accuracy) if args.target_accuracy is not None else
              ("loss", args.target_loss))
    binary = run_dirs.binary()
    if not os.access(binary, os.X_OK):
        sys.exit(f"time-to-target: {binary} is not an executable: build first, or name the "
                 "binary in SPARSECOMM_BIN")
    cells_file = os.path.join(args.out, "cells.txt")
    lines = [line.split("#", 1)[0].split() for line in open(cells_file)]
    names = [words[0] for words in lines if words]
    # Cells that choose their configuration (--density auto): compared with
    # the best fixed cell, not among them.
    auto_cells = {words[0] for words in lines if words and "auto" in words[1:]}

    clusters = sorted(d for d in glob.glob(os.path.join(args.out, "*-h*")) if os.path.isdir(d))
    found = [(c, n) for c in clusters for n in names if run_dirs.finished(os.path.join(c, n))]
    runs = dict(zip(found, run_dirs.load_runs(os.path.join(c, n) for c, n in found)))

    errors = []  # |plan - measured| / measured over every cell of every cluster
    what = (f"test accuracy >= {args.target_accuracy}%" if target[0] == "accuracy" else
            f"test loss <= {args.target_loss}")
    print(f"target: {what}; predictions: {args.convergence}")
    for cluster_dir in clusters:
        rate, hosts = os.path.basename(cluster_dir).rsplit("-h", 1)
        present = [n for n in names if (cluster_dir, n) in runs]
        if not present:
            continue
        model = runs[(cluster_dir, present[0])]["summary"]["model"]
        print(f"\n{hosts} hosts at {rate}, {model}\n")
        print("| cell | chose | steps to target | s to target | step ms | bytes/rank/step "
              "| plan: steps | step ms | s | error |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        measured = {}
        options = {}
        for name in present:
            run = runs[(cluster_dir, name)]
            step_s = run_dirs.mean_step_s(run)
            composed = False
            reached = to_target(run, target)
            if is_short(run):
                composed = True
                reached = None
                missing = "no full run to compose from"
                for other in clusters:
                    full = runs.get((other, name))
                    if other.endswith(f"-h{hosts}") and full and not is_short(full):
                        found = to_target(full, target)
                        if found:
                            reached = (found[0], found[0] * step_s)
                        missing = "not reached"
                        break
                if missing == "no full run to compose from" and args.pilots:
                    steps_found, missing = pilot_steps(args.pilots, name, run, target)
                    if steps_found is not None:
                        reached = (steps_found, steps_found * step_s)
                        composed = "pilot"
            options[name] = run_options(binary, run)
            configurations = plan_prediction(binary, cluster_dir, model, int(hosts), run, args)
            c = matching(configurations, run, options[name])
            chose = c["configuration"] if c else run["summary"]["method"]
            predicted = c["time_to_target_s"] if c else None
            if reached:
                measured[name] = reached[1]
                error = (f"{100.0 * (predicted - reached[1]) / reached[1]:+.0f}%"
                         if predicted else "-")
                seconds = f"{reached[1]:.1f}" + (
                    " (composed from the pilot)" if composed == "pilot" else
                    " (composed)" if composed else "")
                steps = f"{reached[0]:.0f}"
            else:
                error, seconds, steps = "-", missing if composed else "not reached", "-"
            bytes_kib = run["summary"]["bytes_per_rank_per_step"] / 1024.0
            plan_steps = f"{c['steps_to_target']:.0f}" if c and c["steps_to_target"] else "-"
            plan_step = f"{1e3 * c['step_s']:.1f}" if c else "-"
            plan_s = f"{predicted:.1f}" if predicted else "-"
            print(f"| {name} | {chose} | {steps} | {seconds} | {1e3 * step_s:.1f} "
                  f"| {bytes_kib:.1f} KiB | {plan_steps} | {plan_step} | {plan_s} | {error} |")
            if reached and predicted:
                errors.append(abs(predicted - reached[1]) / reached[1])
        if measured:
            fixed = {n: t for n, t in measured.items() if n not in auto_cells}
            best = min(fixed, key=fixed.get) if fixed else None
            ranked = [c for c in configurations if c["time_to_target_s"] is not None]
            pick = min(ranked, key=lambda c: c["time_to_target_s"]) if ranked else None
            # (ranked with the last run's compute: the pick does not change
            # with a compute common to every configuration)
            line = f"\nmeasured first (fixed): {best} ({fixed[best]:.1f} s)" if best else "\n"
            if pick:
                picked = [n for n in present if n in fixed and
                          matching([pick], runs[(cluster_dir, n)], options[n])]
                ratio = (f", {measured[picked[0]] / fixed[best]:.2f}x the best" if picked and best
                         else "")
                line += f"; plan's pick: {pick['configuration']}{ratio}"
            for name in (n for n in present if n in auto_cells and n in measured and best):
                line += f"; {name}: {measured[name] / fixed[best]:.2f}x the best"
            print(line)
    if errors:
        print(f"\nplan's time to the target against the measured, {len(errors)} runs: median "
              f"|error| {100 * statistics.median(errors):.0f}%, worst {100 * max(errors):.0f}%")


if __name__ == "__main__":
    main()
