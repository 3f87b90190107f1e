#!/usr/bin/python3
"""Turns `bench sparsifiers --format json` runs at several world sizes into
the built-in scaling table of the performance model
(src/sparsecomm/perf/builtin_scaling.cc).

    scripts/scaling-table.py DIR    # DIR holds c<density>-n<ranks>.json files

Per scheme and density it prints one SchemeScaling initializer: for each n
the mean K/k, the mean per-rank selection over its share of k, the mean
imbalance, the median rank's read share of d/n and the selection's own
collectives per step. The per-rank selection of the allgather schemes is
their selected_mean, or for runs from before that field, recovered from
their bytes: each rank sends n-1 blocks of m (index bytes + 4) plus n-1
headers of 24 bytes. `sparsecomm plan --stats FILES` reads the same files
directly.
"""
import glob
import json
import os
import re
import sys

# Who selects, as the schemes' registry traits say (sparsify/registry.h).
INDEPENDENT = {"topk", "dgc", "gaussiank"}
PARTITIONED = {"micro", "exdyna", "exdyna-faithful", "deft"}


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: scaling-table.py DIR (with c<density>-n<ranks>.json from bench sparsifiers)")
    rows = {}
    for path in glob.glob(os.path.join(sys.argv[1], "c*-n*.json")):
        match = re.search(r"c([0-9.]+)-n([0-9]+)\.json$", path)
        if not match:
            continue
        with open(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}: not JSON ({e}); rerun that bench")
        for row in data:
            scheme = row["scheme"]
            if scheme not in INDEPENDENT | PARTITIONED:
                continue
            n = row["workers"]
            k = row["density"] * row["numel"]
            ratio = row["density_ratio_mean"]
            if scheme in INDEPENDENT and row.get("selected_mean") is not None:
                selected = row["selected_mean"] / k
            elif scheme in INDEPENDENT:  # runs from before selected_mean: from the bytes
                index_bytes = 4 * (1 - (row["index_bytes_saved"] or 0))
                selected = (row["bytes_per_rank"] / (n - 1) - 24) / (index_bytes + 4) / k
            else:
                selected = ratio  # disjoint selections: K = sum of m_r
            rows.setdefault((scheme, row["density"], k), []).append(
                (n, ratio, selected, row["imbalance_mean"], row["read_share"] or n,
                 row["selection_collectives_mean"]))
    for (scheme, density, k), points in sorted(rows.items()):
        points.sort()
        independent = "true" if scheme in INDEPENDENT else "false"
        print(f'    {{"{scheme}", {density:g}, {independent}, {k:.0f},')
        print("     {", end="")
        print(",\n      ".join(
            f"{{{n}, {r:.4g}, {s:.4g}, {i:.4g}, {rs:.4g}, {c:.3g}}}" for n, r, s, i, rs, c in points), end="")
        print("}},")


if __name__ == "__main__":
    main()
