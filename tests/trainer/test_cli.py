"""Every trainer command answers an unknown or malformed flag with one line and exit 2: the
process contract, one process per command. The commands that import TensorFlow before they parse
(the benchmarks) are checked in the slow tier."""

import subprocess
import sys

import pytest

COMMANDS = [
    ["trainer.preprocess", "--output", "/tmp/x", "--quality", "high"],
    ["trainer.train", "--epochs", "ten"],
    ["trainer.preprocess.sample", "--classes", "many"],
    ["trainer.preprocess.bench", "--images", "lots"],
]
BENCHMARKS = [
    ["trainer.bench_input", "--no-such-flag"],
    ["trainer.benchmark", "--model-dir", "/tmp/x", "--input", "disk"],
]


@pytest.mark.parametrize(
    "command",
    [*COMMANDS, *(pytest.param(c, marks=pytest.mark.slow) for c in BENCHMARKS)],
    ids=[c[0] for c in [*COMMANDS, *BENCHMARKS]],
)
def test_a_malformed_flag_is_one_line_and_exit_2(command):
    result = subprocess.run(
        [sys.executable, "-m", *command], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "see --help" in lines[0]
