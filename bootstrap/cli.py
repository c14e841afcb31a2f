"""What every bootstrap command does with a user mistake: one `error: ...` line on stderr, exit 2.

Standard library only, like node_config: the shell scripts run these commands before anything is
installed.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


def usage_error(message: str) -> int:
    """Print `error: message` on stderr; returns the exit code for a user mistake."""
    print(f"error: {message}", file=sys.stderr)
    return 2


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default where it has one; not "(default: None)" for a value
    settled later (its help says how), nor "(default: False)" for a switch."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse without the usage block before its error: the one line names what was wrong and
    --help says what is allowed, with the defaults. Subparsers inherit the class."""

    def __init__(self, *args, formatter_class=DefaultsHelpFormatter, **kwargs) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.exit(usage_error(f"{message} (see --help)"))
