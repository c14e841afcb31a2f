"""`python -m rehearsal --benchmark`: the fleet benchmark's schedule on the simulated nodes.

.venv/bin/python -m pytest -m e2e tests/rehearsal/test_rehearsal_benchmark.py
"""

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_rehearsal_benchmark_prints_the_table_for_1_rank_1_node_and_2_nodes(tmp_path):
    workdir = tmp_path / "rehearsal"
    result = subprocess.run(
        [sys.executable, "-m", "rehearsal", "--benchmark", "--workdir", str(workdir)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-5000:] + result.stderr[-2000:]
    assert "CPU rehearsal, not GPU figures:" in out
    # The head prints each row as it completes: 1 rank, 1 node (2 ranks), 2 nodes (4 ranks).
    logged = re.findall(r"^\[head\] \S+ \[bootstrap\] \| (\d+) \| (\d+) \|", out, re.M)
    assert logged == [("1", "1"), ("2", "1"), ("4", "2")]
    run = workdir / "s3" / "runs" / "rehearsal"
    doc = json.loads((run / "benchmark.json").read_text())
    rows = doc["rows"]
    assert [(r["gpus"], r["nodes"]) for r in rows] == [(1, 1), (2, 1), (4, 2)]
    single = rows[0]["images_per_s"]
    for row in rows:
        # The figures come from the timed steps, and the efficiency from the figures.
        assert len(row["step_images_per_s"]) == doc["settings"]["timed_steps"]
        assert row["images_per_s"] == pytest.approx(
            statistics.fmean(row["step_images_per_s"]), 0.01
        )
        assert row["scaling_efficiency"] == pytest.approx(
            row["images_per_s"] / (single * row["gpus"]), abs=1e-4
        )
        assert f"| {row['gpus']} | {row['nodes']} | " in (run / "benchmark.md").read_text()
    # The allreduce check ran on the same ranks wherever there were two or more.
    assert rows[0]["allreduce_busbw_gbps"] is None
    assert all(r["allreduce_busbw_gbps"] > 0 for r in rows[1:])
    assert doc["image"]["tensorflow"] == "2.15.1"
    assert (run / "benchmark.png").read_bytes()[:4] == b"\x89PNG"
    done = json.loads((run / "DONE.json").read_text())
    assert done["status"] == "succeeded" and done["benchmark"] == "synthetic"
    assert done["images_per_s"] == rows[-1]["images_per_s"]
