"""Run directories (`sparsecomm train --out DIR`) as the scripts read them:
through `sparsecomm report --format json`, the reader `report` itself uses
(src/sparsecomm/report/run_files.h), so that every script checks the files
the same way and reads the same records.

    import run_dirs
    run = run_dirs.load_run("runs/dense/seed1")
    run["config"], run["summary"], run["steps"], run["evals"], run["warnings"]

Each run is a dict: "dir", "config" (config.json), "summary" (summary.json
as written, else the figures derived from metrics.jsonl, with
"summary_derived" true), "failure" (failure.json's error or None),
"warnings", "steps" and "evals" (metrics.jsonl's lines as written, a last
line cut off by a killed run left out). SPARSECOMM_BIN names the binary
(default build/sparsecomm). A directory that is not a run directory ends the
script with report's message.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A run's first steps (allocation, the first threshold) are not its mean step.
WARMUP_STEPS = 10


def binary():
    return os.environ.get("SPARSECOMM_BIN", os.path.join(ROOT, "build", "sparsecomm"))


def load_runs(dirs):
    """The runs of `dirs`, in their order (one call of the binary)."""
    dirs = [str(d) for d in dirs]
    if not dirs:
        return []
    result = subprocess.run([binary(), "report", "--format", "json", *dirs],
                            capture_output=True, text=True)
    if result.returncode != 0:
        hint = ("\n(SPARSECOMM_BIN names a build without `report --format json`: point it at "
                "a newer one, e.g. build/sparsecomm)" if "--format" in result.stderr else "")
        sys.exit(f"{binary()} report --format json failed:\n{result.stderr.strip()}{hint}")
    return json.loads(result.stdout)


def load_run(run_dir):
    return load_runs([run_dir])[0]


def finished(run_dir):
    """Whether the run wrote its summary (it ended, whatever its outcome)."""
    return os.path.exists(os.path.join(str(run_dir), "summary.json"))


def timing_records(steps):
    """The two step records a run's mean step is measured between: the first
    after the warm-up and the last ([] with fewer than two after it)."""
    rows = [r for r in steps if r["step"] >= WARMUP_STEPS]
    return [rows[0], rows[-1]] if len(rows) >= 2 else []


def mean_step_s(run):
    """Mean wall time per step after the warm-up (rank 0's clock); the
    summary's mean over every step when the run has too few steps."""
    timed = timing_records(run["steps"])
    if not timed:
        return run["summary"]["wall_s"] / max(1, run["summary"]["steps"])
    first, last = timed
    return (last["wall_s"] - first["wall_s"]) / (last["step"] - first["step"])
