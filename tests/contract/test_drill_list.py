"""contract/drill.py: the drill's one list of experiments, held to FIS's rules."""

import dataclasses

import pytest

from contract import drill


def test_the_list_keeps_fis_s_rules():
    assert drill.problems() == []


def test_the_drill_plays_at_least_five_distinct_fis_actions():
    ids = {a for e in drill.EXPERIMENTS for a in e.action_ids}
    assert len(ids) >= 5 and ids <= set(drill.ACTIONS)


@pytest.mark.parametrize(
    ("action", "problem"),
    [
        (drill.FisAction("t", drill.TERMINATE, drill.CONTROLLER_ROLE), "cannot target"),
        (drill.FisAction("t", "aws:ec2:melt-instances", drill.NODE), "not an action the drill"),
        (
            drill.FisAction(
                "t",
                drill.THROTTLE,
                drill.CONTROLLER_ROLE,
                (
                    ("service", "s3"),
                    ("operations", "GetObject"),
                    ("percentage", "100"),
                    ("duration", "PT3M"),
                ),
            ),
            "service is ec2 or kinesis",
        ),
        (
            drill.FisAction(
                "c",
                drill.DISRUPT_CONNECTIVITY,
                drill.FLEET_SUBNET,
                (("scope", "internet"), ("duration", "PT1M")),
            ),
            "scope is one of",
        ),
        (
            drill.FisAction(
                "s",
                drill.SPOT_INTERRUPTION,
                drill.SPOT_NODE,
                (("durationBeforeInterruption", "PT1M"),),
            ),
            "2 to 15 minutes",
        ),
        (
            drill.FisAction(
                "c",
                drill.DISRUPT_CONNECTIVITY,
                drill.FLEET_SUBNET,
                (("scope", "s3"), ("duration", "60 s")),
            ),
            "ISO 8601",
        ),
        (drill.FisAction("c", drill.DISRUPT_CONNECTIVITY, drill.FLEET_SUBNET), "takes"),
    ],
)
def test_a_bad_action_is_named(action, problem):
    assert any(problem in p for p in drill.action_problems(action))


def test_a_list_with_a_repeated_or_badly_named_experiment_is_refused():
    first = drill.EXPERIMENTS[0]
    again = (first, first, dataclasses.replace(first, name="Node Terminated!"))
    found = drill.problems(again)
    assert any("listed twice" in p for p in found)
    assert any("Node Terminated!" in p and "[a-z0-9-]" in p for p in found)


def test_an_on_demand_drill_leaves_the_spot_notice_out():
    on_demand = [e.name for e in drill.plan("on-demand")]
    spot = [e.name for e in drill.plan("spot")]
    assert "spot-notice" in spot and "spot-notice" not in on_demand
    assert [n for n in spot if n != "spot-notice"] == on_demand


def test_named_experiments_and_an_unknown_name():
    assert [e.name for e in drill.plan("spot", ("s3-cut", "node-terminated"))] == [
        "node-terminated",
        "s3-cut",
    ]
    with pytest.raises(drill.UnknownExperiment, match=r"unknown experiment 'melt': allowed node-"):
        drill.plan("on-demand", ("melt",))


def test_fis_bills_each_action_its_minutes_and_an_instant_one_a_minute():
    cut = drill.FisAction("c", drill.DISRUPT_CONNECTIVITY, drill.FLEET_SUBNET,
                          (("scope", "s3"), ("duration", "PT90S")))  # fmt: skip
    assert cut.minutes == 2
    assert drill.FisAction("t", drill.TERMINATE, drill.NODE).minutes == 1
    plan = drill.plan("on-demand")
    assert drill.fis_usd(plan) == round(0.10 * sum(e.minutes for e in plan), 2)


def test_the_drill_s_dataset_has_its_own_prefixes_and_enough_shards_for_its_fleet():
    data = drill.DATASET
    assert data.raw_prefix.startswith("drill/") and data.tfrecords_prefix.startswith("drill/")
    assert data.raw_prefix != data.tfrecords_prefix
    assert all(data.train_shards % nodes == 0 for nodes in (1, 2, 3))
    assert data.classes * data.train_per_class >= data.train_shards
    assert data.val_images >= data.val_shards


def test_an_on_demand_drill_plays_at_least_five_distinct_fis_actions():
    """What `-c drill=true` synthesizes on its default, on-demand fleet (issue 49's done-when)."""
    ids = {a for e in drill.plan("on-demand") for a in e.action_ids}
    assert len(ids) >= 5, ids
