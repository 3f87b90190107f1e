#!/usr/bin/python3
"""The crossover tables of docs/benchmarks/performance-model.md ("What `plan`
predicts from 2 to 4,096 ranks"), from `sparsecomm plan --format json`.

    scripts/plan-table.py [--bucket-mb 25 | --no-host-costs]

For three model sizes with an assumed compute time per step (25M / 60 ms,
350M / 400 ms, 1.3B / 1,200 ms), density 1%, 5 us per message and links of
10, 25 and 100 Gbit/s, one row per model and link: for each method the
world sizes (2, 4, ..., 4,096) at which its predicted step is shorter than
dense's ("all", "never", "<= 128" for 2 up to 128, "4..1024", or several
such ranges), and the fastest method with its speedup at 64 and at 4,096
ranks. Extra arguments go to every `plan` call.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "sparsecomm")
MODELS = [("25M", 60, "25M, 60 ms"), ("350M", 400, "350M, 400 ms"),
          ("1.3B", 1200, "1.3B, 1200 ms")]
LINKS = [10, 25, 100]


def ranges(sizes, winning):
    """The winning sizes as contiguous ranges of the size list."""
    if all(winning):
        return "all"
    if not any(winning):
        return "never"
    spans, start = [], None
    for i, wins in enumerate(winning + [False]):
        if wins and start is None:
            start = i
        if not wins and start is not None:
            spans.append((sizes[start], sizes[i - 1]))
            start = None
    return ", ".join(f"<= {hi}" if lo == sizes[0] else (str(lo) if lo == hi else f"{lo}..{hi}")
                     for lo, hi in spans)


def best(row):
    m = max((m for m in row["methods"] if m["method"] != "dense"),
            key=lambda m: m["speedup_vs_dense"] or 0.0)
    return f"{m['method']} {m['speedup_vs_dense']:.2f}x"


def main():
    extra = sys.argv[1:]
    if not os.access(BIN, os.X_OK):
        sys.exit(f"plan-table: build first ({BIN} is missing)")
    methods = None
    lines = []
    for params, compute_ms, label in MODELS:
        for link in LINKS:
            out = subprocess.run(
                [BIN, "plan", "--params", params, "--compute-ms", str(compute_ms), "-n", "2-4096",
                 "--link-gbit", str(link), "--latency-us", "5", "-c", "0.01", "--format", "json"]
                + extra, check=True, capture_output=True, text=True).stdout
            rows = json.loads(out)["predictions"]
            sizes = [r["ranks"] for r in rows]
            names = [m["method"] for m in rows[0]["methods"] if m["method"] != "dense"]
            methods = methods or names
            cells = []
            for name in methods:
                winning = [next(m for m in r["methods"] if m["method"] == name)["speedup_vs_dense"]
                           > 1.0 for r in rows]
                cells.append(ranges(sizes, winning))
            at = {r["ranks"]: r for r in rows}
            lines.append(f"| {label} | {link} Gbit/s | " + " | ".join(cells)
                         + f" | {best(at[64])} / {best(at[4096])} |")
    print("| model, compute | link | " + " | ".join(methods) + " | best (speedup) at 64 / 4096 |")
    print("|---|---|" + "---|" * len(methods) + "---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
