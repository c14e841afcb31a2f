"""The scratch system the image recipe's tests run its steps on (bootstrap/image/*.sh): stub
commands first on PATH that record every call, and IMAGE_ROOT, which keeps every file the steps
write under the test's tmp_path."""

import os
import subprocess
from pathlib import Path

from stacks.image.recipe import RECIPE_DIR, read_pins

PINS = read_pins()
KERNEL = "6.8.0-1064-aws"  # the held linux-aws-lts-24.04 kernel the stubs report

# A stub records its name and arguments, prints <name>.out if the test wrote one and exits with
# <name>.exit (0 by default). Some stubs need behaviour: they get their own body below.
RECORDER = """#!/usr/bin/env bash
name=$(basename "$0")
printf '%s\\n' "$name $*" >>"$STUB_LOG"
[[ -f $STUB_DIR/$name.out ]] && cat "$STUB_DIR/$name.out"
exit "$(cat "$STUB_DIR/$name.exit" 2>/dev/null || echo 0)"
"""
GENERIC = (
    "apt-get",
    "apt-mark",
    "dpkg",
    "dpkg-query",
    "curl",
    "systemctl",
    "modinfo",
    "uname",
    "snap",
    "make",
    "git",
    "gpg",
    "ldconfig",
    "update-grub",
)


class Bake:
    """A scratch system: stub commands on PATH, IMAGE_ROOT, and the calls they recorded."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "root"
        self.stubs = tmp_path / "stubs"
        self.log = tmp_path / "calls.log"
        for directory in ("etc/apt/apt.conf.d", "etc/apt/preferences.d"):
            (self.root / directory).mkdir(parents=True)
        self.stubs.mkdir()
        self.log.touch()
        for name in GENERIC:
            self.stub(name)
        self.output("uname", KERNEL)

    def stub(self, name: str, body: str = RECORDER) -> None:
        path = self.stubs / name
        path.write_text(body)
        path.chmod(0o755)

    def output(self, name: str, text: str) -> None:
        (self.stubs / f"{name}.out").write_text(text + "\n")

    def exit_code(self, name: str, code: int) -> None:
        (self.stubs / f"{name}.exit").write_text(str(code))

    def file(self, relative: str, text: str = "", mode: int = 0o644) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        return path

    def run(self, script: str, *args: str) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "PATH": f"{self.stubs}:{os.environ['PATH']}",
            "IMAGE_ROOT": str(self.root),
            "STUB_LOG": str(self.log),
            "STUB_DIR": str(self.stubs),
        }
        return subprocess.run(
            ["bash", str(RECIPE_DIR / f"{script}.sh"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def calls(self, name: str | None = None) -> list[str]:
        lines = self.log.read_text().splitlines()
        return [line for line in lines if line and (name is None or line.split()[0] == name)]


def index(calls: list[str], fragment: str) -> int:
    return next(i for i, call in enumerate(calls) if fragment in call)


def failed_line(result: subprocess.CompletedProcess) -> str:
    """The one line a failed step prints: the step and what is wrong, nothing else."""
    assert result.returncode != 0, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 1, result.stdout
    return failed[0]
