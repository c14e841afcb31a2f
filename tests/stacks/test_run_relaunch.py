"""The run controller's relaunch, executed from the synthesized workflow in moto: stop or
replace, launch all or none, zone by zone and round by round, give up in one line."""

import datetime
import json

import clients
import pytest
import starter
from run_controller_fleet import RUN, ZONES, Ec2Answers, Fleet, done_event, read_json
from test_run_workflow import ATTEMPTS, CONTROLLER, DONE, launches  # noqa: F401  (a fixture)

# ruff: noqa: F811  (launches is a fixture)


def relaunch(workflow, fleet: Fleet, cause="node_lost", status="failed") -> dict:
    fleet.fail(cause, status=status)
    starter.handler(done_event())
    [execution] = workflow.settle()
    return execution


def test_a_spot_interruption_replaces_every_node_from_its_own_template(
    workflow, monkeypatch, launches
):
    """One-time Spot Instances cannot be stopped: the survivors are terminated too, and each
    node comes back as a new instance launched from its own template, one request per node,
    with a token of its own."""
    fleet = Fleet(spot=True, zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[1]])
    execution = relaunch(workflow, fleet, "interrupted", "interrupted")
    assert workflow.states(execution)[-1] == "Relaunched"
    nodes = fleet.instances()
    assert [n["node"] for n in nodes] == [0, 1] and all(n["state"] == "running" for n in nodes)
    assert not {n["id"] for n in nodes} & set(fleet.nodes)
    assert [r["LaunchTemplate"]["LaunchTemplateId"] for r in launches] == fleet.templates
    assert {r["LaunchTemplate"]["Version"] for r in launches} == {"$Latest"}
    assert len({r["ClientToken"] for r in launches}) == 2
    # The deployed zone's subnet and group are the templates' own: nothing overridden.
    assert not any("NetworkInterfaces" in r or "Placement" in r for r in launches)


def test_an_on_demand_node_ec2_retired_is_replaced_and_the_rest_stop_and_start(
    workflow, monkeypatch, launches
):
    fleet = Fleet(nodes=3, zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[2]])  # a retired host
    execution = relaunch(workflow, fleet)
    output = workflow.output(execution)
    assert output["launch"]["started"] == sorted(fleet.nodes[:2])
    assert list(output["launch"]["replaced"]) == ["2"]
    assert [r["LaunchTemplate"]["LaunchTemplateId"] for r in launches] == fleet.templates[2:]
    assert [n["state"] for n in fleet.instances()] == ["running"] * 3


def test_no_capacity_in_its_zone_moves_the_whole_fleet_to_the_next(workflow, monkeypatch, launches):
    """The next zone's subnet on every interface and its placement group, from TrainStack's
    HorovodFleetZones: nothing is created at run time."""
    fleet = Fleet(nodes=2)
    answers = Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[1]])
    answers.full = {ZONES[0]: "InsufficientInstanceCapacity"}
    execution = relaunch(workflow, fleet)
    assert workflow.states(execution)[-1] == "Relaunched"
    nodes = fleet.instances()
    assert [(n["node"], n["zone"]) for n in nodes] == [(0, ZONES[1]), (1, ZONES[1])]
    moved = [r for r in launches if r.get("Placement")]
    assert len(moved) == 2 and all(
        r["Placement"] == {"GroupName": f"TrainStack-group-{ZONES[1]}"}
        and [i["SubnetId"] for i in r["NetworkInterfaces"]] == [fleet.subnets[ZONES[1]]] * 2
        and [i["NetworkCardIndex"] for i in r["NetworkInterfaces"]] == [0, 1]
        for r in moved
    )
    # A capacity refusal in zone a, then at once the next zone: no wait between them.
    assert [(state, s) for _, state, s in workflow.waits] == [("WaitForCapacity", 0)]
    assert len({r["ClientToken"] for r in launches}) == len(launches)


def test_a_relaunch_ec2_refuses_gives_up_in_one_line_and_leaves_nothing_running(
    workflow, monkeypatch
):
    fleet = Fleet(nodes=2, zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[1]])
    answers.full = {ZONES[0]: "InvalidParameterValue"}
    execution = relaunch(workflow, fleet)
    assert "DeleteStack" in workflow.states(execution)
    done = read_json(DONE)
    assert (done["cause"], done["attempt"]) == ("relaunch_refused", 2)
    assert done["reason"].startswith("the relaunch failed: EC2 answered InvalidParameterValue: ")
    assert "\n" not in done["reason"]
    assert fleet.billing() == []


def test_the_hard_cap_ends_the_wait_for_capacity_early(workflow, monkeypatch):
    """A try whose wait would leave less than an attempt before the cap gives up now."""
    fleet = Fleet(zones=ZONES[:1], hours=0.6)
    answers = Ec2Answers(monkeypatch, fleet)
    answers.full = {ZONES[0]: "InsufficientInstanceCapacity"}
    execution = relaunch(workflow, fleet)
    assert [s for _, state, s in workflow.waits if state == "WaitForCapacity"] == []
    assert read_json(DONE)["reason"].startswith(
        "no capacity for the fleet in us-east-1a: InsufficientInstanceCapacity on each of 1 tries"
    )
    assert workflow.states(execution)[-1] == "Deleted"


def test_while_it_waits_for_capacity_controller_json_says_what_and_names_the_execution(
    workflow, monkeypatch
):
    fleet = Fleet(zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.full, answers.full_tries = {ZONES[0]: "InsufficientInstanceCapacity"}, 1
    seen = []
    workflow.on_wait = lambda *_: seen.append(read_json(CONTROLLER))
    execution = relaunch(workflow, fleet)
    [status] = seen
    assert status["execution"] == execution["executionArn"]
    assert status["controller_state"] == "WaitForCapacity"
    assert status["reason"].startswith(
        "waiting for capacity: InsufficientInstanceCapacity in us-east-1a (try 1 of 4); next try "
        "in us-east-1a at "
    )


def test_cdk_destroy_during_a_relaunch_starts_nothing_and_follows_the_delete(workflow, monkeypatch):
    fleet = Fleet(zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.full, answers.full_tries = {ZONES[0]: "InsufficientInstanceCapacity"}, 1

    def destroy(_execution, state, _seconds):
        if state == "WaitForCapacity":  # cdk destroy while the relaunch waits
            fleet.set_stack_status("DELETE_IN_PROGRESS")
        if state == "WaitForDelete":
            fleet.set_stack_status("DELETE_COMPLETE")

    workflow.on_wait = destroy
    execution = relaunch(workflow, fleet)
    states = workflow.states(execution)
    assert states.count("Launch") == 1 and states[-1] == "Deleted"
    assert fleet.billing() == []


def test_a_fleet_without_templates_that_lost_a_node_is_deleted(workflow, monkeypatch):
    """A stack from before the nodes had launch templates cannot bring back a node EC2
    terminated: starting the others would wait for it until restarts ran out."""
    fleet = Fleet(nodes=1, zones=None)
    template = {
        "Resources": {"Node0": {"Type": "AWS::EC2::Instance",
                                "Properties": {"ImageId": "ami-12c6146b"}}},
        "Outputs": {"HorovodFleetRun": {"Value": RUN}, "HorovodFleetMaxRestarts": {"Value": "3"},
                    "HorovodFleetDeadline": {"Value": read_deadline()}},
    }  # fmt: skip
    clients.client("cloudformation").update_stack(
        StackName="TrainStack", TemplateBody=json.dumps(template)
    )
    resources = clients.client("cloudformation").describe_stack_resources(StackName="TrainStack")
    [node] = [r["PhysicalResourceId"] for r in resources["StackResources"]
              if r["ResourceType"] == "AWS::EC2::Instance"]  # fmt: skip
    clients.client("ec2").terminate_instances(InstanceIds=[node])
    execution = relaunch(workflow, fleet)
    assert workflow.output(execution)["record"]["reason"] == "relaunch-impossible"
    assert workflow.states(execution)[-1] == "Deleted"


def read_deadline() -> str:
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=6)
    return f"{later:%Y-%m-%dT%H:%M:%S}Z"


@pytest.mark.parametrize(
    ("cause", "max_restarts", "hours", "decision"),
    [
        ("node_lost", 0, 6, "stop"),  # restarts exhausted
        ("trainer_input", 3, 6, "teardown"),  # another attempt would fail the same way
        ("node_lost", 3, 0.3, "stop"),  # the hard cap leaves no time for an attempt
    ],
)
def test_an_end_that_is_not_relaunched_tears_the_fleet_down(
    workflow, monkeypatch, cause, max_restarts, hours, decision
):
    fleet = Fleet(zones=ZONES[:1], max_restarts=max_restarts, hours=hours)
    Ec2Answers(monkeypatch, fleet)
    execution = relaunch(workflow, fleet, cause)
    [entry] = read_json(ATTEMPTS)["attempts"]
    assert entry["decision"] == decision
    assert "DeleteStack" in workflow.states(execution)
    assert workflow.states(execution)[-1] == "Deleted"
    assert fleet.stack_status() == "DELETE_COMPLETE"
