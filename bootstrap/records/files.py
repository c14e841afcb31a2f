"""The JSON files a node keeps and reads back: read whole or not at all, written whole (a
temporary name, then a rename), and a trainer output counted only when this attempt wrote it."""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def read_list(path: Path) -> list:
    """A JSON list from path; [] when it is absent, unreadable or not a list."""
    try:
        found = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return found if isinstance(found, list) else []


def this_attempts(path: Path, started: float) -> dict:
    """A trainer output written by this attempt ({} for one a previous attempt left, restored
    from S3 with the checkpoints)."""
    try:
        if path.stat().st_mtime < started:
            return {}
    except OSError:
        return {}
    return read_json(path)


def save_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(doc, indent=1))
    os.replace(partial, path)
