#!/usr/bin/python3
"""ctest scripts.slim_timing_only: scripts/slim-run-data.py --timing-only on a
copy of a stored run keeps what time-to-target.py reads of it (the mean
step time, every evaluation, the summary's step count) and changes nothing
when run again.

    slim_timing_check.py RUN_DIR SCRATCH   (SPARSECOMM_BIN: the CLI)
"""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import run_dirs  # noqa: E402


def slim(run_dir):
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "slim-run-data.py"),
                    "--timing-only", run_dir], check=True, capture_output=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return f.read()


def main():
    source, scratch = sys.argv[1], sys.argv[2]
    run_dir = os.path.join(scratch, "run")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(source, run_dir)
    before = run_dirs.load_run(run_dir)
    once = slim(run_dir)
    after = run_dirs.load_run(run_dir)
    checks = {
        "two step records": len(after["steps"]) == 2 < len(before["steps"]),
        "the same mean step": run_dirs.mean_step_s(after) == run_dirs.mean_step_s(before),
        "every evaluation": after["evals"] == before["evals"],
        "the summary's steps": after["summary"]["steps"] == before["summary"]["steps"],
        "a second run changes nothing": slim(run_dir) == once,
    }
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        sys.exit("slim --timing-only lost: " + ", ".join(failed))
    print("slim-timing-ok")


if __name__ == "__main__":
    main()
