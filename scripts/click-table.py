#!/usr/bin/python3
"""The click model's exchanges on an emulated cluster (scripts/click-cluster.sh OUT):
per exchange, the tables' bytes per rank and step against the exchange's own
lower bound and against the dense all-reduce of the tables, the wire bytes
per host and step (NIC counters), and the step time against the run's own
compute + update time.

Lower bounds, per rank and step, for rows of w values (4w bytes, 2w in bf16
or fp16; indices not counted): allgather (n - 1) m 4w received (m: the ranks' mean touched
rows; every rank must receive every other rank's rows); sparse-allreduce
(n - 1) / n (m + U) 4w received (U: the union; the owner of 1/n of the row
space receives the other ranks' rows of it, then every rank the other
owners' sums of the union); sharded 2 (n - 1) / n m 4w received (the rows
of its batch that other ranks own, pulled, and the other ranks' gradient
rows of its own range, pushed to it), for the mean rank: the ranges are
contiguous in stacked ids and the hot IDs of each table are its first rows,
so some ranks own more of the hot rows and receive less than others; the
sharded row's ratio is therefore the NIC bytes per host (the mean rank's,
all traffic included) over that bound, marked "(NIC)"; dense 2 (n - 1) / n
R 4w (R: all rows of the tables; the ring's reduce-scatter and
allgather).

  scripts/click-table.py OUT [--skip 3]
"""
import argparse
import pathlib
import statistics

import run_dirs


def read_counters(path):
    counters = {}
    for line in path.read_text().split("\n"):
        if line.strip():
            host, tx, rx = line.split()
            counters[int(host)] = (int(tx), int(rx))
    return counters


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--skip", type=int, default=3, help="warm-up steps left out of times")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    rows = []
    dirs = sorted(p.parent for p in out.glob("*/summary.json"))
    for run, data in zip(dirs, run_dirs.load_runs(dirs)):
        name = run.name
        config, summary, steps = data["config"], data["summary"], data["steps"]
        exchange = config["embedding_exchange"]
        e = summary["embedding"]
        n = summary["workers"]
        row_bytes = 4 * e["width"]
        m = statistics.mean(s["embedding"]["touched_rows"] for s in steps)
        union = statistics.mean(s["embedding"]["union_rows"] for s in steps)
        received = statistics.mean(s["embedding"]["bytes_received"] for s in steps)
        sent = statistics.mean(s["embedding"]["bytes_sent"] for s in steps)
        values = config.get("embedding_values", "fp32")
        row_bytes = (4 if values == "fp32" else 2) * e["width"]
        if exchange == "allgather":
            bound = (n - 1) * m * row_bytes
        elif exchange == "dense":
            bound = 2 * (n - 1) / n * e["rows"] * row_bytes
        elif exchange == "sharded":
            bound = 2 * (n - 1) / n * m * row_bytes
        else:
            bound = (n - 1) / n * (m + union) * row_bytes
        timed = steps[args.skip:] if len(steps) > args.skip + 1 else steps
        walls = [b["wall_s"] - a["wall_s"] for a, b in zip(steps, steps[1:])][max(0, args.skip - 1):]
        step_s = statistics.mean(walls) if walls else float("nan")
        compute_update = statistics.mean(s["compute_s"] + s["update_s"] for s in timed)
        wire = float("nan")
        before, after = out / f"{name}.counters-before", out / f"{name}.counters-after"
        if before.exists() and after.exists():
            b, a = read_counters(before), read_counters(after)
            wire = statistics.mean(a[h][0] - b[h][0] for h in a) / len(steps)
        rows.append((name, n, len(steps), m, union, sent, received, bound,
                     e["dense_allreduce_bytes"], wire, step_s, compute_update,
                     summary.get("peak_resident_bytes", 0)))
    print("| run | ranks | steps | touched rows/rank | union rows | table bytes sent / received "
          "per rank | lower bound | received / bound | dense all-reduce / sent | wire bytes/host "
          "(NIC) | step ms | compute + update ms | step / (compute + update) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (exchange, n, count, m, union, sent, received, bound, dense, wire, step_s, cu,
         peak) in rows:
        ratio = f"{received / bound:.2f}"
        if exchange.startswith("sharded") and wire == wire:  # not NaN
            ratio = f"{wire / bound:.2f} (NIC)"
        print(f"| {exchange} | {n} | {count} | {m:.0f} | {union:.0f} | {sent / 1e3:.1f} / "
              f"{received / 1e3:.1f} kB | {bound / 1e3:.1f} kB | {ratio} | "
              f"{dense / sent:.0f}x | {wire / 1e3:.1f} kB | {step_s * 1e3:.1f} | {cu * 1e3:.1f} | "
              f"{step_s / cu:.2f} |")


if __name__ == "__main__":
    main()
