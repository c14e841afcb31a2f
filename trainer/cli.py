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


def require_at_least(*checks: tuple[str, float, float]) -> None:
    """fail naming the first (flag, value, lowest) whose value is below its lowest."""
    for flag, value, lowest in checks:
        if value < lowest:
            fail(f"{flag} must be at least {lowest}, got {value}")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default where it has one; not "(default: None)" for a value
    settled later (its help says how), nor "(default: False)" for a switch."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse without the usage block before its error: the error line names the flag. Its
    --help shows the defaults."""

    def __init__(self, *args, formatter_class=DefaultsHelpFormatter, **kwargs) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see --help)")
