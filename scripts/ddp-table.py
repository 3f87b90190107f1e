#!/usr/bin/python3
"""The table of a scripts/ddp-cluster.sh sitting: per hook, the median step
time over the steps after the first WARMUP (rank 0's clock), the step time
relative to DDP's default hook, the bytes rank 0's NIC sent per step
(median), and for sparsecomm hooks their own K/k, exchange time and the
fraction of the exchanges' time spent while backward still ran. A hook
that did not finish is listed with the last line of its log.

    scripts/ddp-table.py OUT [--warmup 5]
"""

import argparse
import json
import pathlib
import statistics
import sys


def steps_of(run):
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    with path.open() as lines:
        return [line for line in map(json.loads, lines) if line.get("kind") == "step"]


def last_error(log):
    if not log.exists():
        return "no log"
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    # The most telling line: the root failure (gloo's enforce, a C++
    # exception's what()), else the last error line.
    for marks in (("enforce fail", "what():"), ("Error:", "error:", "Aborted")):
        for line in lines:
            if any(mark in line for mark in marks):
                return line[-200:]
    return lines[-1][-200:] if lines else "no output (hung, and ended by the timeout?)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    args = parser.parse_args()
    if not args.out.is_dir():
        sys.exit(f"ddp-table: {args.out} is not a directory; give the OUT of scripts/ddp-cluster.sh")
    cluster = (args.out / "cluster.txt").read_text().strip() if (args.out / "cluster.txt").exists() else ""
    rows = {}
    for run in sorted(p for p in args.out.iterdir() if p.is_dir()):
        steps = steps_of(run)[args.warmup:]
        if not (run / "summary.json").exists() or not steps:
            rows[run.name] = None
            continue
        row = {"steps": len(steps), "step_s": statistics.median(s["step_s"] for s in steps)}
        sent = [s["nic_bytes_sent"] for s in steps if "nic_bytes_sent" in s]
        row["nic_bytes"] = statistics.median(sent) if sent else None
        syncs = [s["sync"] for s in steps if "sync" in s]
        if syncs:
            row["density_ratio"] = statistics.mean(s["density_ratio"] for s in syncs)
            row["exchange_s"] = statistics.median(s["exchange_s"] for s in syncs)
            if all("overlap_fraction" in s for s in syncs):
                row["overlap"] = statistics.median(s["overlap_fraction"] for s in syncs)
        rows[run.name] = row
    if not rows:
        sys.exit(f"ddp-table: no runs under {args.out}")
    base = rows.get("default")
    print(f"# {cluster}" if cluster else f"# {args.out}")
    print("| hook | steps timed | step (median) | vs default | NIC bytes sent per step (rank 0) "
          "| K/k (mean) | sparsecomm exchange (median) | beside backward (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        if row is None:
            print(f"| {name} | failed: {last_error(args.out / (name + '.log'))} | | | | | | |")
            continue
        ratio = f"{row['step_s'] / base['step_s']:.2f}" if base else ""
        nic = f"{row['nic_bytes'] / 1e6:.2f} MB" if row["nic_bytes"] is not None else ""
        kk = f"{row['density_ratio']:.3f}" if "density_ratio" in row else ""
        exchange = f"{row['exchange_s'] * 1e3:.1f} ms" if "exchange_s" in row else ""
        overlap = f"{row['overlap']:.0%}" if "overlap" in row else ""
        print(f"| {name} | {row['steps']} | {row['step_s'] * 1e3:.0f} ms | {ratio} | {nic} | {kk} "
              f"| {exchange} | {overlap} |")


if __name__ == "__main__":
    main()
