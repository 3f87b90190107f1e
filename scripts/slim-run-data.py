#!/usr/bin/python3
"""Slim the per-step output of run directories kept under docs/data/.

    scripts/slim-run-data.py [--dry-run] [--timing-only] PATH...

PATH is a run directory (`sparsecomm train --out DIR`: config.json,
metrics.jsonl, summary.json) or any folder holding run directories; every
metrics.jsonl below it is rewritten in place. config.json and summary.json
are left whole (they are small, and every reader below reads them). Standard
library only; running it twice changes nothing the second time.

What a metrics.jsonl keeps. Every line stays, in order, so the number of
step records (`sparsecomm convergence` counts them as the run's steps) and
the evaluations are those of the run.

- {"kind":"eval"} lines: whole. They are a few dozen a run, and each field
  is read: "step", "wall_s", "test_accuracy", "test_loss" by
  scripts/time-to-target.py (steps and seconds to a target, interpolated
  between evaluations) and `sparsecomm convergence` (the profile's curve);
  "test_loss" by scripts/accuracy-table.py (the final held-out loss);
  "epoch" and "wall_s" by `sparsecomm report`'s table (seconds and epochs
  to the target), "train_loss", "test_auc" by its plots.
- {"kind":"step"} lines: only STEP_FIELDS, each for the readers named:
    kind      every reader tells step records from evaluations by it
              (src/sparsecomm/report/run_files.cc rejects a line without it)
    step      required by run_files.cc; scripts/time-to-target.py's mean
              step (from step 10 on) and scripts/validate-model.py's timed
              steps (from step 3) select by it
    wall_s    scripts/time-to-target.py's mean step time (rank 0's clock,
              first and last record after the warm-up)
    compute_s `sparsecomm convergence`'s compute per step (the median over
              every pilot step: the profile's "compute_s", which
              `plan --density auto` uses); scripts/validate-model.py's
              compute spread for cells that predate result.json's
- lines of any other kind: whole (no reader of docs/data knows them).

--timing-only goes further, for runs that only a table of time to a target
reads (the runs on emulated clusters, not the pilots a convergence profile
is made from): of the step records it keeps the two that
scripts/time-to-target.py's mean step is measured between (run_dirs.py's
timing_records: the first after the warm-up and the last), slimmed as
above; evaluations and other lines stay whole. The step count stays in
summary.json, which every reader of such a run takes it from. A run with
fewer than two steps after the warm-up keeps every step record.

The step fields left out are read by no script that tabulates docs/data and
by no part of `sparsecomm convergence` or `plan`: the phase times other
than compute, bytes, K/k, imbalance, residual and gradient norms, selection
counts, learning rate and loss of each step. `sparsecomm report` still
reads a slimmed run (run_files.cc takes an absent field as unknown), and its
comparison table takes its figures from summary.json, so it is unchanged;
only its per-step plots (K/k, bytes, overlap) have nothing to draw. The full
output of a run is made again by the commands in docs/benchmarks/.

Values are copied as the run wrote them: each kept field's text is cut from
the original line (no re-serialization, so numbers keep their digits), and
every rewritten line is checked to parse to the original's kept fields
before the file is replaced.
"""

import argparse
import json
import math
import os
import sys
import tempfile

import run_dirs

STEP_FIELDS = ("kind", "step", "wall_s", "compute_s")

_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"


def _skip(text, i):
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i


def raw_fields(line):
    """The fields of a JSON object line as (key, key's text, value's text),
    in order, the texts exactly as written. ValueError when it is not one."""
    i = _skip(line, 0)
    if line[i:i + 1] != "{":
        raise ValueError("not a JSON object")
    i = _skip(line, i + 1)
    fields = []
    if line[i:i + 1] == "}":
        i += 1
    else:
        while True:
            key, end = _DECODER.raw_decode(line, i)
            if not isinstance(key, str):
                raise ValueError("a key is not a string")
            key_text = line[i:end]
            i = _skip(line, end)
            if line[i:i + 1] != ":":
                raise ValueError("expected ':'")
            i = _skip(line, i + 1)
            _, end = _DECODER.raw_decode(line, i)
            fields.append((key, key_text, line[i:end]))
            i = _skip(line, end)
            if line[i:i + 1] == ",":
                i = _skip(line, i + 1)
                continue
            if line[i:i + 1] == "}":
                i += 1
                break
            raise ValueError("expected ',' or '}'")
    if _skip(line, i) != len(line):
        raise ValueError("text after the object")
    return fields


def same(a, b):
    """JSON values equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def slim_line(line, where):
    """The line with only STEP_FIELDS when it is a step record, else as is."""
    record = json.loads(line)
    if not isinstance(record, dict) or record.get("kind") != "step":
        return line
    kept = [(key_text, value_text) for key, key_text, value_text in raw_fields(line)
            if key in STEP_FIELDS]
    new = "{" + ",".join(f"{k}:{v}" for k, v in kept) + "}"
    check = json.loads(new)
    expected = {k: record[k] for k in STEP_FIELDS if k in record}
    if not same(check, expected):
        sys.exit(f"slim-run-data: {where}: the slimmed line does not parse to the original's "
                 f"fields; file left as it was")
    return new


def timing_only(lines):
    """`lines` (the file's, slimmed) without the step records the mean step
    is not measured between."""
    steps = {}
    for index, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # blank, or an incomplete last line: kept as is
        if isinstance(record, dict) and record.get("kind") == "step":
            steps[index] = record
    timed = run_dirs.timing_records(list(steps.values()))
    if not timed:
        return lines
    keep = {index for index, record in steps.items() if any(record is t for t in timed)}
    return [line for index, line in enumerate(lines) if index not in steps or index in keep]


def slim_file(path, dry_run, timing):
    """(bytes before, bytes after) of one metrics.jsonl."""
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    last = len(lines) - 1
    while last >= 0 and not lines[last].strip():
        last -= 1
    out = []
    for number, line in enumerate(lines, 1):
        body = line[:-1] if line.endswith("\r") else line
        if not body.strip():
            out.append(line)
            continue
        try:
            out.append(slim_line(body, f"{path} line {number}") + line[len(body):])
        except ValueError as e:  # json.JSONDecodeError too
            if number - 1 != last:
                sys.exit(f"slim-run-data: {path} line {number}: not valid JSON ({e})")
            # A run killed while writing its last line: kept as it is
            # (run_files.cc drops it with a warning).
            print(f"slim-run-data: {path} line {number}: incomplete last line kept as is",
                  file=sys.stderr)
            out.append(line)
    if timing:
        out = timing_only(out)
    new_text = "\n".join(out)
    if new_text != text and not dry_run:
        directory = os.path.dirname(path) or "."
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".metrics.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(new_text)
            os.chmod(temporary, os.stat(path).st_mode & 0o7777)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    return len(text.encode("utf-8")), len(new_text.encode("utf-8"))


def metrics_files(path):
    if os.path.isfile(path):
        return [path] if os.path.basename(path) == "metrics.jsonl" else []
    found = []
    for directory, folders, files in os.walk(path):
        folders.sort()
        if "metrics.jsonl" in files:
            found.append(os.path.join(directory, "metrics.jsonl"))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="PATH")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what each file would shrink to; change nothing")
    parser.add_argument("--timing-only", action="store_true",
                        help="keep only the step records the mean step is measured between "
                        "(runs that no convergence profile is made from)")
    args = parser.parse_args()
    before = after = count = 0
    for path in args.paths:
        if not os.path.exists(path):
            sys.exit(f"slim-run-data: {path} does not exist")
        files = metrics_files(path)
        if not files:
            print(f"slim-run-data: no metrics.jsonl under {path}", file=sys.stderr)
        for file in files:
            b, a = slim_file(file, args.dry_run, args.timing_only)
            before, after, count = before + b, after + a, count + 1
            print(f"{file}: {b} -> {a} bytes")
    verb = "would be" if args.dry_run else "are"
    print(f"{count} metrics.jsonl: {before} bytes {verb} {after}")


if __name__ == "__main__":
    main()
