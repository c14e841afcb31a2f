"""The names TensorFlow gives a run's checkpoints, and its state file, the commit point every
role reads (checkpoints/checkpoint in the model dir): what the node's attempt record, the head's
uploads and its mirror agree on."""

from __future__ import annotations

import re
from pathlib import Path

STATE = "checkpoints/checkpoint"
# The entries of a checkpoints/checkpoint file: model_checkpoint_path (the newest) and
# all_model_checkpoint_paths (CheckpointState, written by update_checkpoint_state_internal in
# tensorflow/python/checkpoint/checkpoint_management.py, TF 2.15.1).
STATE_ENTRY = re.compile(r'^(all_)?model_checkpoint_paths?:\s*"([^"]+)"', re.MULTILINE)


def step_of(name: str) -> int:
    """The number TensorFlow's CheckpointManager puts after the prefix (ckpt-<step>)."""
    found = re.search(r"(\d+)$", name)
    return int(found.group(1)) if found else -1


def parse_state(text: str) -> tuple[str | None, set[str]]:
    """(the newest checkpoint, every checkpoint) a checkpoints/checkpoint file's text names."""
    entries = STATE_ENTRY.findall(text)
    newest = next((Path(p).name for every, p in entries if not every), None)
    return newest, {Path(p).name for _, p in entries}


def read_state(path: Path) -> tuple[str | None, set[str]]:
    """(the newest checkpoint, every checkpoint) a checkpoints/checkpoint file names."""
    try:
        return parse_state(path.read_text())
    except FileNotFoundError:
        return None, set()


def newest_named(model_dir: Path) -> str | None:
    """The checkpoint checkpoints/checkpoint names as the newest (what the trainer resumes)."""
    return read_state(model_dir / STATE)[0]
