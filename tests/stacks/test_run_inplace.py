"""A relaunch keeps what still works (stacks/teardown/controller/recovery.py `way_back`,
steps_fleet.py): each node weighed on EC2's view of its instance and on the ended attempt's own
records, rebooted in place when nothing is wrong with it, stopped and started (or, on Spot,
replaced) when something is, replaced when EC2 ended it; the head launched again from its own
template. Executed from the synthesized workflow in moto, and each AWS call of it followed by the
death of its step's process."""

import datetime

import clients
import ec2_fleet
import pytest
import recovery
import steps
from run_controller_fleet import RUN, ZONES, Ec2Answers, Fleet, put_json, read_json, ticks  # noqa: F401
from test_run_workflow import ATTEMPTS, CONTROLLER, launches  # noqa: F401  (a fixture)

# ruff: noqa: F811  (launches and ticks are fixtures)

ON_DEMAND = {"state": "running", "spot": False}
SPOT = {"state": "running", "spot": True}
PASSING = {"system": "ok", "instance": "ok", "events": []}


@pytest.mark.parametrize(
    ("node", "check", "named", "way"),
    [
        (ON_DEMAND, PASSING, None, "rebooted"),
        (ON_DEMAND, {**PASSING, "system": "initializing"}, None, "rebooted"),
        (ON_DEMAND, {**PASSING, "instance": "insufficient-data"}, None, "rebooted"),
        (ON_DEMAND, {**PASSING, "system": "impaired"}, None, "started"),
        (ON_DEMAND, {**PASSING, "instance": "impaired"}, None, "started"),
        (ON_DEMAND, {**PASSING, "events": ["instance-retirement"]}, None, "started"),
        (ON_DEMAND, {**PASSING, "events": ["system-reboot"]}, None, "started"),
        (ON_DEMAND, PASSING, "its own failure names it (node_unhealthy)", "started"),
        ({**ON_DEMAND, "state": "stopped"}, None, None, "started"),
        ({**ON_DEMAND, "state": "pending"}, None, None, "started"),
        ({**ON_DEMAND, "state": "terminated"}, None, None, "replaced"),
        ({**ON_DEMAND, "state": "shutting-down"}, None, None, "replaced"),
        (None, None, None, "replaced"),
        (SPOT, PASSING, None, "rebooted"),
        (SPOT, {**PASSING, "system": "impaired"}, None, "replaced"),
        (SPOT, PASSING, "EC2 gave it a Spot interruption notice", "replaced"),
    ],
)
def test_each_node_comes_back_the_way_ec2s_view_and_the_attempts_records_allow(
    node, check, named, way
):
    found, why = recovery.way_back(node, check, named)
    assert found == way
    assert why and "\n" not in why
    if named:
        assert named in why


def test_the_causes_that_name_a_node_are_its_hardwares_never_a_lost_or_silent_node():
    assert {"node_unhealthy", "disk_full", "image_mismatch"} == recovery.NAMING_CAUSES
    assert not recovery.NAMING_CAUSES & {"node_lost", "collective_timeout", "stalled",
                                         "rank_killed", "s3_unreachable", "interrupted"}  # fmt: skip


@pytest.fixture
def relaunch(workflow, ticks):
    """relaunch(fleet, cause, status): attempt 1 ends with the leader's DONE.json, the ticks run
    until nothing is left to do; the execution of its end (`-a1-`)."""

    def run(fleet: Fleet, cause="node_lost", status="failed") -> dict:
        fleet.fail(cause, status=status)
        ticks.until_quiet()
        [execution] = [e for e in workflow.executions() if e["name"].startswith(f"{RUN}-a1-")]
        return execution

    return run


def came_back() -> dict[str, str]:
    nodes = read_json(CONTROLLER)["relaunch"]["nodes"]
    return {node: entry["came_back"] for node, entry in nodes.items()}


def test_a_healthy_fleet_and_its_head_are_rebooted_in_place_and_nothing_else(
    workflow, relaunch, monkeypatch, launches
):
    """The whole fleet silent, a stalled collective, the head lost: no hardware named, every
    instance runs and passes its checks. Each is rebooted (its instance store, addresses and
    billing period kept), none stopped, started or launched, and controller.json says so for
    each node, which the nodes copy into DONE.json."""
    fleet = Fleet(nodes=3, zones=ZONES[:1], head=True)
    answers = Ec2Answers(monkeypatch, fleet)
    stops, starts = [], []
    monkeypatch.setattr(ec2_fleet, "start", lambda ids: starts.extend(ids))
    real_stop = ec2_fleet.stop
    monkeypatch.setattr(ec2_fleet, "stop", lambda *a: stops.append(real_stop(*a)) or stops[-1])
    execution = relaunch(fleet)
    assert workflow.states(execution)[-1] == "Relaunched"
    assert sorted(answers.reboots) == sorted([*fleet.nodes, fleet.head])
    assert launches == [] and starts == []
    assert stops == [{"stopped": [], "terminated": []}]
    assert came_back() == {"0": "rebooted", "1": "rebooted", "2": "rebooted", "head": "rebooted"}
    relaunched = read_json(CONTROLLER)["relaunch"]
    assert (relaunched["attempt"], relaunched["nodes"]["head"]["instance_id"]) == (2, fleet.head)
    assert [n["id"] for n in fleet.instances()] == [*fleet.nodes, fleet.head]


def test_an_impaired_a_scheduled_and_a_named_node_are_stopped_and_started_the_rest_rebooted(
    workflow, ticks, relaunch, monkeypatch
):
    """Node 0's system check fails, EC2 scheduled node 1's retirement, node 2's own failure of
    this attempt says its GPUs failed their check (node_unhealthy): each is stopped and started,
    onto a healthy host. Node 3's failure is an earlier attempt's (history), node 4 has a
    retirement EC2 completed already, and node 5's own failure names no hardware: rebooted."""
    fleet = Fleet(nodes=6, zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.impaired = {fleet.nodes[0]: "system"}
    answers.schedule(fleet.nodes[1], "instance-retirement")
    answers.schedule(fleet.nodes[4], "instance-retirement", completed=True)

    def failure(index: int, cause: str) -> None:
        put_json(f"runs/{RUN}/failures/{index}.json",
                 {"node": index, "instance_id": fleet.nodes[index], "cause": cause})  # fmt: skip

    ticks.advance(hours=-2)
    failure(3, "node_unhealthy")  # before the stack: an earlier deployment's attempt
    ticks.advance(hours=2, minutes=1)
    failure(2, "node_unhealthy")
    failure(5, "s3_unreachable")
    execution = relaunch(fleet, "node_unhealthy")
    assert workflow.states(execution)[-1] == "Relaunched"
    ways = workflow.output(execution)["stop"]["ways"]
    assert {node: w["way"] for node, w in ways.items()} == {
        "0": "started", "1": "started", "2": "started",
        "3": "rebooted", "4": "rebooted", "5": "rebooted",
    }  # fmt: skip
    assert "system status check is impaired" in ways["0"]["why"]
    assert "instance-retirement" in ways["1"]["why"]
    assert "node_unhealthy" in ways["2"]["why"]
    launch = workflow.output(execution)["launch"]
    assert launch["started"] == sorted(fleet.nodes[:3])
    assert sorted(answers.reboots) == launch["rebooted"] == sorted(fleet.nodes[3:])
    assert came_back() == {"0": "started", "1": "started", "2": "started",
                           "3": "rebooted", "4": "rebooted", "5": "rebooted"}  # fmt: skip


def test_a_node_that_never_registered_in_an_attempt_that_ended_nodes_missing_is_started(
    workflow, ticks, relaunch, monkeypatch
):
    """nodes_missing: node 1 never wrote a heartbeat in the attempt (it never booted), node 0
    did; node 1 is stopped and started, node 0 rebooted."""
    fleet = Fleet(nodes=2, zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    ticks.advance(minutes=1)
    fleet.beat(0)
    execution = relaunch(fleet, "nodes_missing")
    ways = workflow.output(execution)["stop"]["ways"]
    assert (ways["0"]["way"], ways["1"]["way"]) == ("rebooted", "started")
    assert "never registered" in ways["1"]["why"]
    assert answers.reboots == [fleet.nodes[0]]


def test_a_spot_fleet_keeps_its_running_nodes_and_replaces_the_one_ec2_gave_notice(
    workflow, relaunch, monkeypatch, launches
):
    """Node 1 got the two-minute notice (its own interruptions/ record) and still runs: EC2
    reclaims it, so it is terminated and launched again; node 0 is rebooted in place."""
    fleet = Fleet(nodes=2, spot=True, zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    put_json(f"runs/{RUN}/interruptions/1.json", {"index": 1, "instance_id": fleet.nodes[1]})
    execution = relaunch(fleet, "interrupted", "interrupted")
    assert workflow.states(execution)[-1] == "Relaunched"
    assert answers.reboots == [fleet.nodes[0]]
    [request] = launches
    assert (request["MinCount"], request["MaxCount"]) == (1, 1)
    nodes = fleet.instances()
    assert nodes[0]["id"] == fleet.nodes[0] and nodes[1]["id"] != fleet.nodes[1]
    assert came_back() == {"0": "rebooted", "1": "replaced"}


def test_a_head_ec2_terminated_is_launched_again_from_its_template_and_the_nodes_rebooted(
    workflow, relaunch, monkeypatch, launches
):
    """The head's instance is gone: the attempt's end is relaunched, not stopped for a person.
    A new head comes from HorovodFleetHeadTemplate, in its subnet, outside any placement group,
    tagged as the head; the nodes come back in place under it."""
    fleet = Fleet(nodes=2, zones=ZONES[:1], head=True)
    answers = Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.head])
    execution = relaunch(fleet)
    [entry] = read_json(ATTEMPTS)["attempts"]
    assert entry["decision"] == "relaunch"
    assert workflow.states(execution)[-1] == "Relaunched"
    [request] = launches
    assert request["LaunchTemplate"] == {"LaunchTemplateId": fleet.head_template, "Version": "$Latest"}  # fmt: skip
    assert (request["MinCount"], request["MaxCount"]) == (1, 1)
    assert "Placement" not in request and "NetworkInterfaces" not in request
    [head] = [n for n in fleet.instances() if n["node"] == "head"]
    assert head["id"] != fleet.head and head["state"] == "running"
    assert sorted(answers.reboots) == sorted(fleet.nodes)
    assert came_back() == {"0": "rebooted", "1": "rebooted", "head": "replaced"}
    assert workflow.output(execution)["launch"]["head"] == head["id"]


def test_a_head_ec2_terminated_in_a_stack_without_its_template_stops_the_run_for_a_person(
    workflow, relaunch, monkeypatch
):
    fleet = Fleet(nodes=2, zones=ZONES[:1], head=True)
    Ec2Answers(monkeypatch, fleet)
    fleet.update_outputs(
        {k: v for k, v in fleet.outputs.items() if k != "HorovodFleetHeadTemplate"}
    )
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.head])
    execution = relaunch(fleet)
    [entry] = read_json(ATTEMPTS)["attempts"]
    assert entry["decision"] == "stop"
    assert "no launch template for the head" in entry["why"]
    assert workflow.states(execution)[-1] == "Deleted"


# The relaunch's AWS calls, each followed by the death of its step's process (what Lambda
# answers: Runtime.ExitError); the state's Retry runs the step again.
CALLS = [
    (ec2_fleet, "checks"),
    (ec2_fleet, "stop"),
    (ec2_fleet, "launch_head"),
    (ec2_fleet, "start"),
    (ec2_fleet, "reboot"),
    (steps, "tell"),
]


@pytest.mark.parametrize(("module", "name"), CALLS, ids=[name for _, name in CALLS])
def test_a_relaunch_whose_step_dies_after_any_aws_call_still_brings_each_node_back_once(
    workflow, relaunch, monkeypatch, launches, module, name
):
    """Faults come in pairs: the head EC2 ended and an impaired node, then the step's process
    dies right after one of the relaunch's calls. Its retry ends with one head (EC2 answers the
    head's launch again with its ClientToken's instance: Ec2Answers plays it), each node once
    on a running instance, the impaired one started, the others rebooted, at most one reboot
    more of each (the call was made, its step died before it said so), and controller.json
    saying how each came back."""
    fleet = Fleet(nodes=3, zones=ZONES[:1], head=True)
    answers = Ec2Answers(monkeypatch, fleet)
    answers.impaired = {fleet.nodes[2]: "instance"}
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.head])
    real, calls = getattr(module, name), []

    def then_die(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("Runtime.ExitError")
        return result

    if module is steps:  # tell is imported by name into the relaunch's module
        import steps_fleet

        monkeypatch.setattr(steps_fleet, name, then_die)
    else:
        monkeypatch.setattr(module, name, then_die)
    execution = relaunch(fleet)
    assert workflow.states(execution)[-1] == "Relaunched"
    assert len(calls) >= 2  # it died once, and was called again
    heads = [r for r in launches if r["LaunchTemplate"]["LaunchTemplateId"] == fleet.head_template]
    assert len({r["ClientToken"] for r in heads}) == 1
    nodes = fleet.instances()
    assert [(n["node"], n["state"]) for n in nodes] == [
        (0, "running"), (1, "running"), (2, "running"), ("head", "running")
    ]  # fmt: skip
    assert [n["id"] for n in nodes[:3]] == fleet.nodes
    rebooted = answers.reboots
    assert set(rebooted) == set(fleet.nodes[:2])
    assert all(rebooted.count(i) <= (2 if name == "reboot" else 1) for i in fleet.nodes[:2])
    assert came_back() == {"0": "rebooted", "1": "rebooted", "2": "started", "head": "replaced"}


def test_attempts_json_keeps_how_each_node_came_back_for_later_done_jsons():
    """The ended attempt's own `attempts` entry of DONE.json (its nodes' ways and pulls) goes
    into its attempts.json entry, which later attempts' DONE.json list; an attempt whose
    DONE.json the controller wrote has none."""
    nodes = {"0": {"instance_id": "i-0", "came_back": "rebooted", "pull_bytes": 0}}
    done = {"attempt": 2, "status": "failed", "cause": "stalled",
            "attempts": [{"attempt": 1, "status": "failed"}, {"attempt": 2, "nodes": nodes}]}  # fmt: skip
    now = datetime.datetime(2026, 11, 29, tzinfo=datetime.timezone.utc)

    def entry(document):
        return recovery.attempt_entry(document, [{"attempt": 1, "decision": "relaunch"}],
                                      max_restarts=3, now=now, deadline=None, started_at=None,
                                      stack_id="s")  # fmt: skip

    assert entry(done)["nodes"] == nodes
    assert "nodes" not in entry({**done, "attempts": []})


def test_a_head_whose_template_was_deleted_by_hand_stops_the_run_in_one_line(
    workflow, relaunch, monkeypatch
):
    """The template itself is gone: EC2 refuses the head's launch, the relaunch gives up in one
    line naming EC2's answer (relaunch_refused), and nothing it launched bills."""
    fleet = Fleet(nodes=2, zones=ZONES[:1], head=True)
    answers = Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.head])
    clients.client("ec2").delete_launch_template(LaunchTemplateId=fleet.head_template)
    execution = relaunch(fleet)
    assert workflow.states(execution)[-1] == "GaveUp"
    done = read_json(f"runs/{RUN}/DONE.json")
    assert (done["cause"], done["attempt"]) == ("relaunch_refused", 2)
    assert (
        done["reason"].startswith("the relaunch failed: EC2 answered ")
        and "\n" not in done["reason"]
    )
    assert answers.reboots == [] and fleet.billing() == []
