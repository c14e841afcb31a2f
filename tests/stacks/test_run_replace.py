"""An elastic fleet's lost node, replaced by the run controller's tick while its head trains on
(controller/decide.py replace_lost, act.py replace), against moto with the
synthesized workflow: one instance from the replacement template in the fleet's zone, its
launch assignment and its tag; never twice for one loss, also when a tick dies midway; at most
REPLACEMENTS_PER_NODE times per node in an attempt."""

import contextlib

import pytest
from run_controller_fleet import (
    RUN,
    ZONES,
    Ec2Answers,
    Fleet,
    backend_instance,
    put_json,
    read_json,
    ticks,  # noqa: F401  (a fixture)
)

from controller import clients, ec2_fleet, records, tick

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


# --- one tick at a time, one replacement per loss (issue 47) -------------------------------------


class RunInstancesCalls:
    """Every RunInstances the controller asks EC2 for."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        clients.client("ec2").meta.events.register(
            "provide-client-params.ec2.RunInstances", self.count
        )

    def count(self, params, **_) -> None:
        self.calls.append(params.get("ClientToken", ""))


class LaggingListing:
    """EC2's listing does not show the instances launched from now on (eventual consistency,
    https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html): the fleet's
    listing (ec2_fleet.every_fleet_instance) and, with `tokens`, the client-token lookup too."""

    def __init__(self, monkeypatch, fleet: Fleet, tokens: bool = False) -> None:
        self.known = {n["id"] for n in fleet.instances(states=("pending", "running", "stopping",
                      "stopped", "shutting-down", "terminated"))}  # fmt: skip
        listing = ec2_fleet.every_fleet_instance
        monkeypatch.setattr(
            ec2_fleet, "every_fleet_instance",
            lambda: [n for n in listing() if n["id"] in self.known],
        )  # fmt: skip
        if tokens and hasattr(ec2_fleet, "launched_with"):
            lookup = ec2_fleet.launched_with
            monkeypatch.setattr(
                ec2_fleet, "launched_with", lambda t: [i for i in lookup(t) if i in self.known]
            )


def replacements(fleet: Fleet) -> list[dict]:
    """The instances up that the controller launched (tagged or not yet)."""
    return [n for n in fleet.instances(states=("pending", "running")) if not n["cloudformation"]]


def spent_once(fleet: Fleet, index: int) -> None:
    [new] = replacements(fleet)
    assert new["node"] == index
    assert assignment(new["id"])["replacement"] == 1
    assert [(t["number"], t["instance_id"]) for t in read_json(CONTROLLER)["replacements"]] == [
        (1, new["id"])
    ]


def test_two_overlapping_ticks_launch_one_replacement_and_spend_the_budget_once(ticks, monkeypatch):
    """Bug 5's "two replacements for one lost node": a second tick reads EC2 before the first
    launches, then the run's records after the first wrote its launch assignment. It sees the
    node served by no instance EC2 lists, and one replacement spent: it must not launch another
    (nor spend another)."""
    fleet = Fleet(nodes=3, zones=ZONES[:1], head=True)
    Ec2Answers(monkeypatch, fleet)
    ticks.minutes(2, fleet)
    lose(fleet.nodes[1])
    fleet.beat()
    ticks.advance(minutes=1)
    calls = RunInstancesCalls()
    listing, overlapped = ec2_fleet.every_fleet_instance, []

    def second_tick_reads_ec2_then_the_first_runs():
        seen = listing()
        if not overlapped:
            overlapped.append(None)
            overlapped[0] = tick.handler({"trigger": "schedule"})  # the first, whole
        return seen

    monkeypatch.setattr(
        ec2_fleet, "every_fleet_instance", second_tick_reads_ec2_then_the_first_runs
    )
    second = ticks()
    assert overlapped[0]["actions"] == ["replace"]
    assert "replace" not in second["actions"]
    monkeypatch.setattr(ec2_fleet, "every_fleet_instance", listing)
    ticks.minutes(2, fleet)
    assert len(calls.calls) == 1
    spent_once(fleet, 1)


@pytest.mark.parametrize("tokens_lag", [False, True], ids=["listing lags", "token lookup lags too"])
def test_a_tick_that_does_not_see_the_first_ones_instance_launches_nothing_more(
    ticks, monkeypatch, tokens_lag
):
    """The first tick launched node 1's replacement and recorded it; EC2 does not list it yet
    when the next tick comes. That tick takes it for launching: nothing more is launched."""
    fleet = Fleet(nodes=3, zones=ZONES[:1], head=True)
    Ec2Answers(monkeypatch, fleet)
    ticks.minutes(2, fleet)
    lose(fleet.nodes[1])
    calls = RunInstancesCalls()
    lag = LaggingListing(monkeypatch, fleet, tokens=tokens_lag)
    ticks.minutes(1, fleet)  # the first: launches
    ticks.minutes(2, fleet)  # the next ones: the listing still lags
    assert len(calls.calls) == 1
    lag.known |= {n["id"] for n in replacements(fleet)}  # EC2 lists it at last
    ticks.minutes(2, fleet)
    assert len(calls.calls) == 1
    spent_once(fleet, 1)


@pytest.mark.parametrize("tokens_lag", [False, True], ids=["found by its token", "same token"])
def test_a_launch_that_died_before_its_record_is_found_by_the_losss_token(
    ticks, monkeypatch, tokens_lag
):
    """The first tick launched, then died before the launch assignment; EC2 does not list the
    instance yet. The next tick sees the same loss, so the same ClientToken: it finds the
    instance by it (DescribeInstances' client-token filter) and launches nothing; were that
    lookup to lag too, RunInstances with the same token answers with the same instance."""
    fleet = Fleet(nodes=3, zones=ZONES[:1], head=True)
    Ec2Answers(monkeypatch, fleet)
    ticks.minutes(2, fleet)
    lose(fleet.nodes[2])
    calls = RunInstancesCalls()
    lag = LaggingListing(monkeypatch, fleet, tokens=tokens_lag)

    died = []

    def dies_once(real):
        def write(*args, **kwargs):
            if not died:
                died.append(True)
                raise RuntimeError("the tick's Lambda timed out")
            return real(*args, **kwargs)

        return write

    for name in ("claim_launch", "write_launch"):  # the assignment, as each version writes it
        if hasattr(records, name):
            monkeypatch.setattr(records, name, dies_once(getattr(records, name)))
    with contextlib.suppress(RuntimeError):
        ticks.minutes(1, fleet)
    assert died and len(calls.calls) == 1
    ticks.minutes(1, fleet)
    assert calls.calls[1:] == ([calls.calls[0]] if tokens_lag else [])
    lag.known |= {n["id"] for n in replacements(fleet)}
    ticks.minutes(2, fleet)
    assert len(set(calls.calls)) == 1
    spent_once(fleet, 2)


def test_a_silent_node_past_its_replacement_budget_is_terminated(ticks, monkeypatch):
    """Bug 5's "an unusable node past its replacement budget is never terminated": node 1 was
    replaced twice in the attempt (both refused, say), and now its instance runs silent, left
    out by the head. It is not replaced again, and it is terminated: the run cannot use it."""
    fleet = Fleet(nodes=3, zones=ZONES[:1], head=True)
    answers = Ec2Answers(monkeypatch, fleet)
    calls = RunInstancesCalls()
    ticks.minutes(2, fleet)
    spent = [{"stack_id": fleet.stack_id, "attempt": 1, "node": 1, "number": k,
              "instance_id": None, "refused": "InsufficientInstanceCapacity: none"}
             for k in (1, 2)]  # fmt: skip
    put_json(CONTROLLER, {"replacements": spent})
    for _ in range(3):  # node 1 silent for three minutes, the head's discovery says so
        ticks.advance(minutes=1)
        fleet.beat(0, 2)
        stamp = ticks.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        put_json(f"runs/{RUN}/status.json", {"updated_at": stamp, "nodes_silent": ["1"]})
        ticks()
    assert calls.calls == [] and answers.reservations == {}
    states = {n["node"]: n["state"] for n in fleet.instances(states=("pending", "running",
              "stopping", "stopped", "shutting-down", "terminated"))}  # fmt: skip
    assert states[1] in ("shutting-down", "terminated")
    assert [n["node"] for n in fleet.instances(states=("pending", "running"))] == [0, 2, "head"]
    assert "not replaced again" in read_json(CONTROLLER)["unreplaced"]["nodes"]["1"]
