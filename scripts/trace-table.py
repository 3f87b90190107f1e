#!/usr/bin/env python3
"""Prints one markdown table of ExDyna's density control and load balance on
recorded gradient traces, from the JSON outputs of

    sparsecomm bench sparsifiers --trace DIR --format json ...

found in a results directory (every *.json file in it, each a JSON array of
scheme rows). The model comes from the row's "source" (the trace's
`--model X`), n from "workers", c from "density". The bench's JSON does not
record --opt values, so a variant of ExDyna is told by its file name: a
name containing "previous" holds the previous default (--opt
controller=histogram --opt balancer=counts), one containing "quota" ExDyna
with --opt controller=quota; their exdyna rows are labelled as such.

Targets: imbalance <= max(0.10, floor + 0.05); density |mean K/k - 1| <= 0.02
and p95 |K/k - 1| <= 0.10.

Usage: scripts/trace-table.py RESULTS_DIR   (standard library only)
"""

import json
import math
import re
import sys
from pathlib import Path

# File-name tag -> the label of the exdyna rows in that file.
VARIANTS = {
    "previous": "exdyna (previous: histogram + counts)",
    "quota": "exdyna (controller=quota)",
}
MODEL_ORDER = {"cnn": 0, "mlp": 1, "char-lstm": 2}
SCHEME_ORDER = {"micro": 0, "exdyna": 1, VARIANTS["quota"]: 2, VARIANTS["previous"]: 3,
                "exdyna-faithful": 4}


def model_of(row, path):
    source = row.get("source") or ""
    match = re.search(r"--model (\S+?)[,)\s]", source + " ")
    if match:
        return match.group(1)
    for name in sorted(MODEL_ORDER, key=len, reverse=True):
        if name in path.name:
            return name
    return "?"


def number(value, digits):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def yes_no(ok):
    return "-" if ok is None else ("yes" if ok else "no")


def table_rows(results):
    rows = []
    for path in sorted(results.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            print(f"trace-table: skipping {path}: {error}", file=sys.stderr)
            continue
        if isinstance(data, dict):
            data = [data]
        variant = next((label for tag, label in VARIANTS.items() if tag in path.name), None)
        for row in data:
            scheme = row.get("scheme", "?")
            if variant and scheme == "exdyna":
                scheme = variant
            rows.append((model_of(row, path), row.get("workers"), row.get("density"), scheme,
                         row, path.name))
    rows.sort(key=lambda r: (MODEL_ORDER.get(r[0], 99), r[0], r[1] or 0, -(r[2] or 0),
                             SCHEME_ORDER.get(r[3], 99), r[3]))
    return rows


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr if len(argv) != 2 else sys.stdout)
        return 0 if len(argv) == 2 else 2
    results = Path(argv[1])
    if not results.is_dir():
        print(f"trace-table: {results} is not a directory", file=sys.stderr)
        return 2
    rows = table_rows(results)
    if not rows:
        print(f"trace-table: no *.json results in {results}", file=sys.stderr)
        return 1
    header = ["model", "n", "c", "scheme", "mean K/k", "p95 \\|K/k-1\\|", "imbalance",
              "imbalance floor", "imbalance target", "meets imbalance target",
              "meets density target", "selection collectives / step", "rescan share",
              "read share (x d/n)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i < 4 else "---:" for i in range(len(header))) + "|")
    seen = set()
    for model, n, c, scheme, row, name in rows:
        key = (model, n, c, scheme)
        if key in seen:
            print(f"trace-table: {name} repeats {key}", file=sys.stderr)
        seen.add(key)
        if row.get("skipped"):
            cells = [model, str(n), f"{c:g}", scheme, f"not measured: {row['skipped']}"]
            cells += [""] * (len(header) - len(cells))
            print("| " + " | ".join(cells) + " |")
            continue
        mean = row.get("density_ratio_mean")
        p95 = row.get("density_error_p95")
        imbalance = row.get("imbalance_mean")
        floor = row.get("imbalance_floor")
        target = max(0.10, floor + 0.05) if floor is not None else None
        meets_imbalance = (imbalance <= target) if None not in (imbalance, target) else None
        meets_density = ((abs(mean - 1.0) <= 0.02 and p95 <= 0.10)
                         if None not in (mean, p95) else None)
        cells = [model, str(n), f"{c:g}", scheme, number(mean, 3), number(p95, 3),
                 number(imbalance, 3), number(floor, 3), number(target, 3),
                 yes_no(meets_imbalance), yes_no(meets_density),
                 number(row.get("selection_collectives_mean"), 2),
                 number(row.get("rescan_share"), 2), number(row.get("read_share"), 2)]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
