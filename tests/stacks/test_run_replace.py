"""An elastic fleet's lost node, replaced by the run controller's tick while its head trains on
(stacks/teardown/controller/decide.py replace_lost, act.py replace), against moto with the
synthesized workflow: one instance from the replacement template in the fleet's zone, its
launch assignment and its tag; never twice for one loss, also when a tick dies midway; at most
REPLACEMENTS_PER_NODE times per node in an attempt."""

import contextlib

import ec2_fleet
from run_controller_fleet import (
    RUN,
    ZONES,
    Ec2Answers,
    Fleet,
    backend_instance,
    read_json,
    ticks,  # noqa: F401  (a fixture)
)

# ruff: noqa: F811  (ticks is a fixture)

CONTROLLER = f"runs/{RUN}/controller.json"


def assignment(instance_id: str) -> dict | None:
    return read_json(f"runs/{RUN}/launches/{instance_id}.json")


def lose(instance_id: str) -> None:
    """EC2 ends the instance (a retired host, a Spot reclaim of one node)."""
    backend_instance(instance_id).terminate()


def test_a_node_ec2_ended_gets_one_replacement_in_the_fleet_s_zone_and_placement_group(
    ticks, monkeypatch
):
    fleet = Fleet(nodes=3, zones=ZONES, head=True)
    Ec2Answers(monkeypatch, fleet)
    ticks.minutes(3, fleet)
    lose(fleet.nodes[1])
    ticks.minutes(1, fleet)
    nodes = fleet.instances(states=("pending", "running"))
    assert [n["node"] for n in nodes] == [0, 1, 2, "head"]
    [new] = [n for n in nodes if n["node"] == 1]
    assert new["id"] != fleet.nodes[1] and new["zone"] == ZONES[0] and not new["cloudformation"]
    placement = backend_instance(new["id"])._placement
    assert placement.zone == ZONES[0]
    launch = assignment(new["id"])
    assert (launch["node_index"], launch["attempt"], launch["replacement"]) == (1, 1, 1)
    [tried] = read_json(CONTROLLER)["replacements"]
    assert (tried["node"], tried["number"], tried["instance_id"]) == (1, 1, new["id"])
    # The attempt goes on: no DONE.json, no record, and the next ticks launch nothing more.
    ticks.minutes(3, fleet)
    assert (
        read_json(f"runs/{RUN}/DONE.json") is None
        and read_json(f"runs/{RUN}/attempts.json") is None
    )
    assert len(fleet.instances(states=("pending", "running"))) == 4


def test_a_tick_that_dies_after_the_launch_launches_nothing_more(ticks, monkeypatch):
    """The first tick launches, then dies before the assignment and the tag; the next one finds
    the instance by the launch's ClientToken and finishes it: one replacement for one loss."""
    fleet = Fleet(nodes=3, zones=ZONES[:1], head=True)
    Ec2Answers(monkeypatch, fleet)
    ticks.minutes(2, fleet)
    lose(fleet.nodes[2])
    real_tag = ec2_fleet.tag_node

    def dies(*_args):
        raise RuntimeError("the tick's Lambda timed out")

    monkeypatch.setattr(ec2_fleet, "tag_node", dies)
    with contextlib.suppress(RuntimeError):
        ticks.minutes(1, fleet)
    monkeypatch.setattr(ec2_fleet, "tag_node", real_tag)
    ticks.minutes(2, fleet)
    launched = [n for n in fleet.instances(states=("pending", "running")) if n["node"] in (2, None)]
    assert len(launched) == 1 and launched[0]["node"] == 2
    assert [t["number"] for t in read_json(CONTROLLER)["replacements"]] == [1]


def test_a_node_lost_again_and_again_is_replaced_at_most_twice_then_left_out(ticks, monkeypatch):
    fleet = Fleet(nodes=3, zones=ZONES[:1], head=True)
    Ec2Answers(monkeypatch, fleet)
    ticks.minutes(2, fleet)
    lose(fleet.nodes[0])
    for _ in range(3):
        ticks.minutes(1, fleet)
        [current] = [
            n for n in fleet.instances(states=("pending", "running")) if n["node"] == 0
        ] or [None]
        if current:
            lose(current["id"])
    ticks.minutes(1, fleet)
    controller = read_json(CONTROLLER)
    assert [t["number"] for t in controller["replacements"]] == [1, 2]
    assert (
        "not replaced again: replaced 2 time(s) in attempt 1"
        in (controller["unreplaced"]["nodes"]["0"])
    )
    assert [n["node"] for n in fleet.instances(states=("pending", "running"))] == [1, 2, "head"]


def test_no_capacity_for_a_replacement_is_a_spent_try_said_in_controller_json(ticks, monkeypatch):
    fleet = Fleet(nodes=3, zones=ZONES[:1], head=True)
    answers = Ec2Answers(monkeypatch, fleet)
    answers.full[ZONES[0]] = "InsufficientInstanceCapacity"
    ticks.minutes(2, fleet)
    lose(fleet.nodes[1])
    ticks.minutes(3, fleet)
    controller = read_json(CONTROLLER)
    assert [(t["number"], t["instance_id"]) for t in controller["replacements"]] == [
        (1, None),
        (2, None),
    ]
    assert controller["replacements"][0]["refused"].startswith("InsufficientInstanceCapacity")
    assert "1" in controller["unreplaced"]["nodes"]


def test_the_head_is_stopped_and_started_with_the_fleet_in_a_relaunch(ticks, monkeypatch):
    fleet = Fleet(nodes=2, zones=ZONES[:1], head=True)
    Ec2Answers(monkeypatch, fleet)
    ticks.minutes(2, fleet)
    fleet.fail("node_lost")
    ticks.until_quiet()
    nodes = fleet.instances(states=("pending", "running"))
    assert [n["node"] for n in nodes] == [0, 1, "head"]
    assert {n["id"] for n in nodes} == {*fleet.nodes, fleet.head}  # stopped and started
    assert read_json(f"runs/{RUN}/attempts.json")["attempts"][0]["decision"] == "relaunch"
