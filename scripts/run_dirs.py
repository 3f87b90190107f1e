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
