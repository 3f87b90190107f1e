#!/usr/bin/python3
"""The table of scripts/validate-model.sh: measured against predicted.

    scripts/validate-model.py OUT [--measured-stats] [--no-spread | --rms-spread] [--clusters GLOB]

For every cell OUT/<rate>-h<hosts>[-delay<us>]/<model>-<method>[-<options>]/result.json
it asks `sparsecomm plan` (with the cluster's calibrated profile, the
model's parameter count and the cell's measured compute time) for the
method's exchange time, step time and bytes per rank, and prints them beside
the measured ones with the relative errors, then the median and worst error
of each quantity over all cells. SPARSECOMM_BIN names another binary than
build/sparsecomm.

--measured-stats gives `plan` each cell's own sparsification statistics (its
K/k, mean per-rank selection, imbalance: `plan --stats`) instead of the
built-in ones of the synthetic stream, so the errors are those of the cost
model alone; without it they also hold the statistics' error.

The prediction includes the arrival wait (`plan --compute-spread-ms`) with
the cell's own spread: the spread across ranks within a step (summary.json's
compute_spread_s) where the cell recorded it, else the standard deviation
of rank 0's compute time over its timed steps, standing in for it. The
spread across ranks is the mean over steps of their standard deviation
(summary.json since 2026-11-27, evening); --rms-spread takes its root mean
square over steps instead (the input before; in older cells
compute_spread_s was the RMS, so both read the same there). --no-spread
leaves the wait out (the model before 2026-11-26's revision). --clusters
takes only the clusters whose directory matches GLOB (e.g. '*-h4-q50').

Cells that recorded every worker's times (validate-model.sh since the
evening of 2026-11-26) are measured as the model predicts: compute and
exchange are means over the workers and the timed steps, and "exchange less
the wait" takes the measured arrival wait (summary.json's arrival_wait_s)
out of the measured exchange and the predicted wait out of the prediction.
Older cells use rank 0's medians, as below.

Cells from before agreement_s existed timed the exchange without the
agreement, so their prediction leaves it out too. Cells that recorded agreement_s (the sparse step's first collective, which
also absorbs the wait for the slowest rank to arrive from its compute) get
one more comparison, "exchange less the wait": the measured exchange with
its agreement replaced by the predicted agreement, against the prediction.
"""
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

import run_dirs

BIN = run_dirs.binary()  # SPARSECOMM_BIN, else build/sparsecomm


STATISTICS_SCHEMES = {"topk", "dgc", "gaussiank", "micro", "exdyna", "deft"}


def stats_file(result, directory):
    """The cell's statistics as one `bench sparsifiers --format json` row."""
    path = os.path.join(directory, "stats.json")
    with open(path, "w") as f:
        # The scheme ran on the tensors not sent densely beside it.
        numel = result["numel"] - result.get("dense_numel", 0)
        json.dump([{"scheme": result["method"], "numel": numel, "density": 0.01,
                    "workers": result["workers"],
                    "density_ratio_mean": result["density_ratio"],
                    "selected_mean": result["selected"], "imbalance_mean": result["imbalance"],
                    "read_share": None,
                    "selection_collectives_mean": result["selection_collectives"]}], f)
    return path


def compute_spread(result, cell, rms=False):
    """The spread across ranks within a step when the cell has it (runs since
    summary.json reported it; over the timed steps alone in cells with
    steps_skipped, since the untimed first steps spread far more), else the standard deviation of rank 0's
    compute time over the timed steps: result.json's, or from the cell's
    metrics for cells measured before validate-model.sh recorded it (0 when
    neither is there)."""
    if rms and result.get("compute_spread_rms_s") is not None:
        return result["compute_spread_rms_s"]
    if result.get("compute_spread_across_ranks_s") is not None:
        return result["compute_spread_across_ranks_s"]
    if "compute_spread_s" in result:
        return result["compute_spread_s"]
    run_dir = os.path.join(cell, "long")
    if not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        return 0.0
    times = [r["compute_s"] for r in run_dirs.load_run(run_dir)["steps"] if r["step"] >= 3]
    return statistics.stdev(times) if len(times) >= 2 else 0.0


def mean_over_workers(result):
    """Cells since 2026-11-26 (evening) recorded every worker's times: the
    compute and exchange means over the workers and timed steps replace
    rank 0's medians (the model predicts the mean over ranks; a rank that
    computes longer waits less), and the exchange less the measured wait
    is the transfer alone. Older cells keep rank 0's figures."""
    if result.get("exchange_over_workers_s") is None:
        return result
    r = dict(result)
    r["compute_s"] = result["compute_over_workers_s"]
    r["exchange_s"] = result["exchange_over_workers_s"]
    if result.get("arrival_wait_s") is not None:
        r["transfer_s"] = result["exchange_over_workers_s"] - result["arrival_wait_s"]
    return r


def predict(profile, result, measured_stats, spread_s):
    method = result["method"]
    ranks = result["workers"]
    # PowerSGD's cost depends on the tensors' shapes: the model names them.
    size = (["--model", result["model"]] if method == "powersgd"
            else ["--params", str(result["numel"])])
    args = [BIN, "plan", "--profile", profile, *size,
            "--compute-ms", repr(result["compute_s"] * 1e3),
            "--compute-spread-ms", repr(spread_s * 1e3), "-n", str(ranks), "-c", "0.01",
            "--methods", method, "--format", "json"]
    if method == "ps":
        args += ["--servers", str(result["servers"])]
    for option in filter(None, result.get("options", "").split(",")):  # METHOD:KEY=VALUE cells
        key, _, value = option.partition("=")
        if key == "rank":
            args += ["--powersgd-rank", value]
        elif key == "values":
            args += ["--values", value]
        else:
            sys.exit(f"validate-model.py: plan has no flag for the option {option!r}")
    if result.get("dense_numel", 0) > 0:  # validate-model.sh --min-numel
        args += ["--dense-params", str(result["dense_numel"])]
    # Two levels (validate-model.sh --hosts HxR): plan's METHOD/hostR row, the
    # link inside a host from the cluster's host-profile.json.
    levels = result.get("ranks_per_host", 1)
    if levels > 1:
        host_profile = os.path.join(os.path.dirname(profile), "host-profile.json")
        args += ["--ranks-per-host", str(levels), "--host-profile", host_profile]
    row = f"{method}/host{levels}" if levels > 1 else method

    def pick(plan_json):
        return next(p for p in json.loads(plan_json)["predictions"][0]["methods"]
                    if p["method"] == row)
    if measured_stats and method in STATISTICS_SCHEMES:
        if "density_ratio" not in result:
            sys.exit(f"the {method} cell has no statistics; rerun validate-model.sh")
        with tempfile.TemporaryDirectory() as directory:
            out = subprocess.run(args + ["--stats", stats_file(result, directory)], check=True,
                                 capture_output=True, text=True).stdout
        return pick(out)
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return pick(out)


def error(predicted, measured):
    return predicted / measured - 1.0 if measured > 0 else float("nan")


def main():
    args = sys.argv[1:]
    measured_stats = "--measured-stats" in args
    no_spread = "--no-spread" in args
    rms_spread = "--rms-spread" in args
    args = [a for a in args if a not in ("--measured-stats", "--no-spread", "--rms-spread")]
    clusters = "*"
    if "--clusters" in args and args.index("--clusters") + 1 < len(args):
        at = args.index("--clusters")
        clusters = args[at + 1]
        del args[at:at + 2]
    if len(args) != 1 or not os.path.isdir(args[0]):
        sys.exit("usage: validate-model.py OUT [--measured-stats] [--no-spread | --rms-spread] "
                 "[--clusters GLOB]")
    out_dir = args[0]
    rows = []
    for path in sorted(glob.glob(os.path.join(out_dir, clusters, "*", "result.json"))):
        cluster = os.path.basename(os.path.dirname(os.path.dirname(path)))
        profile = os.path.join(os.path.dirname(os.path.dirname(path)), "profile.json")
        result = mean_over_workers(json.load(open(path)))
        spread = 0.0 if no_spread else compute_spread(result, os.path.dirname(path), rms_spread)
        p = predict(profile, result, measured_stats, spread)
        rows.append((cluster, result, p))
    if not rows:
        sys.exit(f"no cells with result.json under {out_dir}")
    print("| cluster | model | method | exchange ms meas / pred | err | step ms meas / pred | err "
          "| wire bytes/host meas / pred | err |")
    print("|---|---|---|---|---|---|---|---|---|")
    errors = {"exchange": [], "step": [], "bytes": [], "exchange less the wait": []}
    by_method = {}
    for cluster, r, p in rows:
        if "agreement_s" not in r:
            # Runs from before 2026-11-26 timed the exchange without the
            # sparse step's agreement: compare like with like.
            p["exchange_s"] -= p.get("agreement_s", 0.0)
        e_x = error(p["exchange_s"], r["exchange_s"])
        e_s = error(p["step_s"], r["step_s"])
        wire = r.get("wire_bytes_per_host")  # None on threads: no wire
        # The payload with the profile's framing (plan before 2026-11-27: payload alone).
        predicted_wire = p.get("wire_bytes_sent_per_rank", p["bytes_sent_per_rank"])
        e_b = error(predicted_wire, wire) if wire else float("nan")
        errors["exchange"].append(abs(e_x))
        errors["step"].append(abs(e_s))
        errors["bytes"].append(abs(e_b))
        e_w = float("nan")
        if r.get("transfer_s") is not None:
            e_w = error(p["exchange_s"] - p.get("arrival_wait_s", 0.0), r["transfer_s"])
        elif r.get("agreement_s") is not None and p.get("agreement_s", 0) > 0:
            e_w = error(p["exchange_s"] - p.get("arrival_wait_s", 0.0),
                        r["exchange_s"] - r["agreement_s"] + p["agreement_s"])
        errors["exchange less the wait"].append(abs(e_w))
        # Cells of validate-model.sh --min-numel name their dense part.
        label = (r["method"] + (f":{r['options']}" if r.get("options") else "")
                 + (f"/host{r['ranks_per_host']}" if r.get("ranks_per_host", 1) > 1 else "")
                 + (f" ({r['dense_numel']} dense)" if r.get("dense_numel") else ""))
        by_method.setdefault(label, []).append((abs(e_x), abs(e_s), abs(e_b), abs(e_w)))
        print(f"| {cluster} | {r['model']} | {label} "
              f"| {r['exchange_s'] * 1e3:.1f} / {p['exchange_s'] * 1e3:.1f} | {e_x:+.0%} "
              f"| {r['step_s'] * 1e3:.1f} / {p['step_s'] * 1e3:.1f} | {e_s:+.0%} "
              + (f"| {wire:.4g} / {predicted_wire:.4g} | {e_b:+.0%} |" if wire
                 else f"| - / {predicted_wire:.4g} | |"))
    print()
    for name, values in errors.items():
        values = [v for v in values if v == v]
        if not values:
            continue
        print(f"{name}: {len(values)} cells, median |error| {statistics.median(values):.1%}, "
              f"worst {max(values):.1%}")
    print()
    print("| method | cells | exchange: median / worst abs error | step | wire bytes "
          "| exchange less the wait |")
    print("|---|---|---|---|---|---|")
    for method, errs in by_method.items():
        cols = []
        for i in range(4):
            values = [e[i] for e in errs if e[i] == e[i]]
            cols.append(f"{statistics.median(values):.0%} / {max(values):.0%}" if values else "-")
        print(f"| {method} | {len(errs)} | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main()
