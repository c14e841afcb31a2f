"""A record's time (contract/runs.py's stamp) as this package's clocks read it: a wall time."""

from __future__ import annotations

from contract import runs


def utc_stamp(now: float) -> str:
    """A wall time (time.time()) as the run's records write it."""
    return runs.stamp_at(now)


def parse_stamp(text: str) -> float:
    """A record's time as a wall time."""
    return runs.parse_stamp(text).timestamp()
