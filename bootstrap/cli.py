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


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse without the usage block before its error: the one line names what was wrong and
    --help says what is allowed. Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        sys.exit(usage_error(f"{message} (see --help)"))
