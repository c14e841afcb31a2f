"""What every trainer command does with a user mistake: one line on stderr, exit code 2.

Tested by: .venv/bin/python -m pytest tests/trainer/test_cli.py
"""

import argparse
import sys
from typing import NoReturn


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: message` on stderr and exit; never returns."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse without the usage block before its error: the error line names the flag."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see --help)")
