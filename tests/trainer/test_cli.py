"""Every trainer command answers an unknown or malformed flag with one line and exit 2."""

import subprocess
import sys

import pytest

COMMANDS = [
    ["trainer.preprocess", "--output", "/tmp/x", "--quality", "high"],
    ["trainer.train", "--epochs", "ten"],
    ["trainer.preprocess.sample", "--classes", "many"],
    ["trainer.bench_input", "--no-such-flag"],
    ["trainer.preprocess.bench", "--images", "lots"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_malformed_flag_is_one_line_and_exit_2(command):
    result = subprocess.run(
        [sys.executable, "-m", *command], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "see --help" in lines[0]
