"""The rehearsal plays the deployed fleet: where it stands for one of TrainStack's settings, it
takes TrainStack's default (cdk.json's context, validated by stacks/config.py)."""

import json
from pathlib import Path

from rehearsal import common
from rehearsal.__main__ import build_parser
from stacks.config import FleetConfig

REPO = Path(__file__).resolve().parents[2]


def trainstack_defaults() -> FleetConfig:
    return FleetConfig.from_context(json.loads((REPO / "cdk.json").read_text())["context"])


def test_python_m_rehearsal_relaunches_as_often_as_trainstack_by_default():
    defaults = build_parser().parse_args([])
    assert defaults.max_restarts == common.MAX_RESTARTS == trainstack_defaults().max_restarts


def test_the_rehearsal_s_hard_cap_is_trainstack_s_default():
    assert trainstack_defaults().max_hours == common.MAX_HOURS
