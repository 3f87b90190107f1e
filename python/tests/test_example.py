"""examples/ddp_fashion_mnist/train.py runs end to end (a short run)."""

import json
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "ddp_fashion_mnist" / "train.py"


def test_the_ddp_example_trains_and_writes_its_metrics(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--processes", "2", "--hook", "exdyna", "--epochs", "1",
         "--limit", "4096", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["hook"] == "exdyna"
    assert summary["final_test_accuracy"] > 30.0  # 32 steps; chance is 10%
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if line["kind"] == "step"]
    assert len(steps) == 4096 // (64 * 2)
    assert steps[-1]["sync"]["density_ratio"] > 0.5  # ExDyna's K/k, from the hook
    assert [line["epoch"] for line in lines if line["kind"] == "eval"] == [1]
