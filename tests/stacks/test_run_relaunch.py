"""The run controller's relaunch, executed from the synthesized workflow in moto: stop or
replace, launch the missing nodes in one all-or-nothing request and tell each its index, zone
by zone and round by round, give up in one line."""

import clients
import ec2_fleet
import pytest
from run_controller_fleet import RUN, ZONES, Ec2Answers, Fleet, read_json, ticks  # noqa: F401
from test_run_workflow import ATTEMPTS, CONTROLLER, DONE, launches  # noqa: F401  (a fixture)

# ruff: noqa: F811  (launches and ticks are fixtures)


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


def teardown_of(workflow, attempt: int) -> dict:
    [execution] = [e for e in workflow.executions() if e["name"].startswith(f"{RUN}-a{attempt}-")]
    return execution


def test_a_spot_interruption_replaces_the_reclaimed_node_and_reboots_the_running_one(
    workflow, relaunch, monkeypatch, launches
):
    """EC2 reclaimed node 1 (a one-time Spot Instance is terminated on interruption): it comes
    back from the one template; node 0 still runs, passes its checks and is not named, so it is
    rebooted in place, its instance store kept, as an on-demand node would be."""
    fleet = Fleet(spot=True, zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[1]])
    execution = relaunch(fleet, "interrupted", "interrupted")
    assert workflow.states(execution)[-1] == "Relaunched"
    nodes = fleet.instances()
    assert [n["node"] for n in nodes] == [0, 1] and all(n["state"] == "running" for n in nodes)
    assert nodes[0]["id"] == fleet.nodes[0] and nodes[1]["id"] != fleet.nodes[1]
    assert answers.reboots == [fleet.nodes[0]]
    [request] = launches
    assert request["LaunchTemplate"] == {"LaunchTemplateId": fleet.template, "Version": "$Latest"}
    assert (request["MinCount"], request["MaxCount"]) == (1, 1)
    # The deployed zone's subnet and group are the templates' own: nothing overridden.
    assert not any("NetworkInterfaces" in r or "Placement" in r for r in launches)
    came_back = read_json(CONTROLLER)["relaunch"]["nodes"]
    assert {k: v["came_back"] for k, v in came_back.items()} == {"0": "rebooted", "1": "replaced"}


def test_an_on_demand_node_ec2_retired_is_replaced_and_the_rest_reboot_in_place(
    workflow, relaunch, monkeypatch, launches
):
    fleet = Fleet(nodes=3, zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[2]])  # a retired host
    execution = relaunch(fleet)
    output = workflow.output(execution)
    assert output["launch"]["started"] == []
    assert output["launch"]["rebooted"] == sorted(fleet.nodes[:2]) == sorted(answers.reboots)
    assert list(output["launch"]["replaced"]) == ["2"]
    assert [(r["LaunchTemplate"]["LaunchTemplateId"], r["MinCount"]) for r in launches] == [
        (fleet.template, 1)
    ]
    assert [n["state"] for n in fleet.instances()] == ["running"] * 3


def test_no_capacity_in_its_zone_moves_the_whole_fleet_to_the_next(
    workflow, relaunch, monkeypatch, launches
):
    """The next zone's subnet on every interface and its placement group, from TrainStack's
    HorovodFleetZones: nothing is created at run time."""
    fleet = Fleet(nodes=2)
    answers = Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[1]])
    answers.full = {ZONES[0]: "InsufficientInstanceCapacity"}
    execution = relaunch(fleet)
    assert workflow.states(execution)[-1] == "Relaunched"
    nodes = fleet.instances()
    assert [(n["node"], n["zone"]) for n in nodes] == [(0, ZONES[1]), (1, ZONES[1])]
    moved = [r for r in launches if r.get("Placement")]
    assert len(moved) == 1 and all(
        r["Placement"] == {"GroupName": f"TrainStack-group-{ZONES[1]}"}
        and [i["SubnetId"] for i in r["NetworkInterfaces"]] == [fleet.subnets[ZONES[1]]] * 2
        and [i["NetworkCardIndex"] for i in r["NetworkInterfaces"]] == [0, 1]
        for r in moved
    )
    # A capacity refusal in zone a, then at once the next zone: no wait between them.
    assert [(state, s) for _, state, s in workflow.waits] == [("WaitForCapacity", 0)]
    assert len({r["ClientToken"] for r in launches}) == len(launches)


def test_a_relaunch_ec2_refuses_gives_up_in_one_line_and_leaves_nothing_running(
    workflow, relaunch, monkeypatch
):
    fleet = Fleet(nodes=2, zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[1]])
    answers.full = {ZONES[0]: "InvalidParameterValue"}
    execution = relaunch(fleet)
    assert workflow.states(execution)[-1] == "GaveUp"
    assert "DeleteStack" in workflow.states(teardown_of(workflow, 2))
    done = read_json(DONE)
    assert (done["cause"], done["attempt"]) == ("relaunch_refused", 2)
    assert done["reason"].startswith("the relaunch failed: EC2 answered InvalidParameterValue: ")
    assert "\n" not in done["reason"]
    assert fleet.billing() == []


def test_the_hard_cap_ends_the_wait_for_capacity_early(workflow, relaunch, monkeypatch):
    """A try whose wait would leave less than an attempt before the cap gives up now."""
    fleet = Fleet(zones=ZONES[:1], hours=0.6)
    answers = Ec2Answers(monkeypatch, fleet)
    answers.impaired = dict.fromkeys(fleet.nodes, "system")  # stopped and started: a new host
    answers.full = {ZONES[0]: "InsufficientInstanceCapacity"}
    execution = relaunch(fleet)
    assert [s for _, state, s in workflow.waits if state == "WaitForCapacity"] == []
    assert read_json(DONE)["reason"].startswith(
        "no capacity for the fleet in us-east-1a: InsufficientInstanceCapacity on each of 1 tries"
    )
    assert workflow.states(execution)[-1] == "GaveUp"
    assert workflow.states(teardown_of(workflow, 2))[-1] == "Deleted"


def test_while_it_waits_for_capacity_controller_json_says_what_and_names_the_execution(
    workflow, relaunch, monkeypatch
):
    fleet = Fleet(zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.impaired = dict.fromkeys(fleet.nodes, "system")
    answers.full, answers.full_tries = {ZONES[0]: "InsufficientInstanceCapacity"}, 1
    seen = []
    workflow.on_wait = lambda *_: seen.append(read_json(CONTROLLER))
    execution = relaunch(fleet)
    [status] = seen
    assert status["execution"] == execution["executionArn"]
    assert status["controller_state"] == "WaitForCapacity"
    assert status["reason"].startswith(
        "waiting for capacity: InsufficientInstanceCapacity in us-east-1a (try 1 of 4); next try "
        "in us-east-1a at "
    )


def test_cdk_destroy_during_a_relaunch_starts_nothing_and_follows_the_delete(
    workflow, relaunch, monkeypatch
):
    fleet = Fleet(zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.impaired = dict.fromkeys(fleet.nodes, "system")
    answers.full, answers.full_tries = {ZONES[0]: "InsufficientInstanceCapacity"}, 1

    def destroy(_execution, state, _seconds):
        if state == "WaitForCapacity":  # cdk destroy while the relaunch waits
            fleet.set_stack_status("DELETE_IN_PROGRESS")
        if state == "WaitForDelete":
            fleet.set_stack_status("DELETE_COMPLETE")

    workflow.on_wait = destroy
    execution = relaunch(fleet)
    states = workflow.states(execution)
    assert states.count("Launch") == 1 and states[-1] == "Deleted"
    assert fleet.billing() == []


def test_a_fleet_without_the_replacement_template_that_lost_a_node_is_deleted(
    workflow, relaunch, monkeypatch
):
    """A stack from before the replacement template (none, or one per node with its index in
    it) cannot bring back a node EC2 terminated: starting the others would wait for it until
    restarts ran out."""
    fleet = Fleet(nodes=1, zones=None)
    old = {k: v for k, v in fleet.outputs.items() if k != "HorovodFleetReplacementTemplate"}
    fleet.update_outputs(old)
    clients.client("ec2").terminate_instances(InstanceIds=fleet.nodes)
    execution = relaunch(fleet)
    [entry] = read_json(ATTEMPTS)["attempts"]
    assert entry["decision"] == "stop" and "no replacement template" in entry["why"]
    assert workflow.states(execution)[-1] == "Deleted"


@pytest.mark.parametrize(
    ("cause", "max_restarts", "hours", "decision"),
    [
        ("node_lost", 0, 6, "stop"),  # restarts exhausted
        ("trainer_input", 3, 6, "teardown"),  # another attempt would fail the same way
        ("node_lost", 3, 0.3, "stop"),  # the hard cap leaves no time for an attempt
    ],
)
def test_an_end_that_is_not_relaunched_tears_the_fleet_down(
    workflow, relaunch, monkeypatch, cause, max_restarts, hours, decision
):
    fleet = Fleet(zones=ZONES[:1], max_restarts=max_restarts, hours=hours)
    Ec2Answers(monkeypatch, fleet)
    execution = relaunch(fleet, cause)
    [entry] = read_json(ATTEMPTS)["attempts"]
    assert entry["decision"] == decision
    assert "DeleteStack" in workflow.states(execution)
    assert workflow.states(execution)[-1] == "Deleted"
    assert fleet.stack_status() == "DELETE_COMPLETE"


EVERY_STATE = ("pending", "running", "stopping", "stopped", "shutting-down", "terminated")


def launched(fleet: Fleet) -> list[dict]:
    """Every instance the controller ever launched for the fleet, whatever its state now."""
    return [n for n in fleet.instances(states=EVERY_STATE) if not n["cloudformation"]]


def assignment(instance_id: str) -> dict | None:
    return read_json(f"runs/{RUN}/launches/{instance_id}.json")


def launch_order(ids: list[str]) -> list[str]:
    reservations = clients.client("ec2").describe_instances(InstanceIds=ids)["Reservations"]
    found = [i for r in reservations for i in r["Instances"]]
    return [i["InstanceId"] for i in sorted(found, key=lambda i: i["AmiLaunchIndex"])]


def test_the_missing_nodes_launch_in_one_request_and_each_learns_its_index(
    workflow, relaunch, monkeypatch, launches
):
    """EC2 retired three of four nodes' hosts: one RunInstances for all three from the one
    template, MinCount = MaxCount = 3, so EC2 launches all or none; the instance at launch
    index k is the k-th missing node, in its tag and in the assignment it reads at boot."""
    fleet = Fleet(nodes=4, zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[i] for i in (0, 2, 3)])
    execution = relaunch(fleet)
    assert workflow.states(execution)[-1] == "Relaunched"
    [request] = launches
    assert request["LaunchTemplate"]["LaunchTemplateId"] == fleet.template
    assert (request["MinCount"], request["MaxCount"]) == (3, 3)
    replaced = workflow.output(execution)["launch"]["replaced"]
    assert launch_order(list(replaced.values())) == [replaced[i] for i in ("0", "2", "3")]
    for index, instance_id in replaced.items():
        assert assignment(instance_id) == {
            "node_index": int(index),
            "instance_id": instance_id,
            "run": RUN,
            "attempt": 2,
            "zone": ZONES[0],
        }
    nodes = fleet.instances()
    assert [(n["node"], n["state"]) for n in nodes] == [(i, "running") for i in range(4)]
    assert {n["id"] for n in nodes if n["node"] != 1} == set(replaced.values())


def test_a_fleet_short_of_capacity_launches_none_and_keeps_its_wait(
    workflow, relaunch, monkeypatch, launches
):
    """EC2 has one p4d in the zone and the Spot fleet needs two: each try's one request
    launches nothing (MinCount: "Amazon EC2 does not launch any instances"), so no node bills
    during the wait, which keeps its schedule (10, 20, 40 minutes) and its one-line end."""
    fleet = Fleet(spot=True, zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    answers.capacity = {ZONES[0]: 1}
    clients.client("ec2").terminate_instances(InstanceIds=fleet.nodes)  # both reclaimed
    execution = relaunch(fleet, "interrupted", "interrupted")
    assert [s for _, state, s in workflow.waits if state == "WaitForCapacity"] == [600, 1200, 2400]
    assert [(r["MinCount"], r["MaxCount"]) for r in launches] == [(2, 2)] * 4
    assert launched(fleet) == []
    done = read_json(DONE)
    assert (done["cause"], done["attempt"]) == ("no_capacity", 2)
    assert done["reason"].startswith(
        "no capacity for the fleet in us-east-1a: InsufficientInstanceCapacity on each of 4 tries"
    )
    assert workflow.states(execution)[-1] == "GaveUp"
    assert workflow.states(teardown_of(workflow, 2))[-1] == "Deleted"


@pytest.mark.parametrize("dies", ["after RunInstances", "after the first node's tag"])
def test_a_launch_that_dies_midway_and_is_retried_launches_each_node_once(
    workflow, relaunch, monkeypatch, launches, dies
):
    """The Launch step's process dies after EC2 launched the nodes (or after it tagged the
    first): its retry asks for the same launch with the same ClientToken, EC2 answers with the
    same reservation (Ec2Answers plays it: moto launches again), and it writes the same
    assignments and tags. The fleet ends with one instance per missing node, each tagged with
    its index and with its assignment in S3."""
    fleet = Fleet(nodes=3, spot=True, zones=ZONES[:1])
    Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=fleet.nodes)  # every one reclaimed
    module, name = (
        (ec2_fleet, "launch") if dies == "after RunInstances" else (ec2_fleet, "tag_node")
    )
    real, calls = getattr(module, name), []

    def then_die(*args):
        result = real(*args)
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("Runtime.ExitError")  # what Lambda answers for a dead process
        return result

    monkeypatch.setattr(ec2_fleet, name, then_die)
    execution = relaunch(fleet, "interrupted", "interrupted")
    assert workflow.states(execution)[-1] == "Relaunched"
    assert len(workflow.steps_called("steps_fleet.launch")) == 2
    assert len(launches) == 2 and launches[0] == launches[1]
    assert (launches[0]["MinCount"], launches[0]["MaxCount"]) == (3, 3)
    nodes = launched(fleet)
    assert [(n["node"], n["state"]) for n in nodes] == [(i, "running") for i in range(3)]
    for node in nodes:
        assert assignment(node["id"])["node_index"] == node["node"]
    assert fleet.instances() == nodes


def test_a_launch_retried_after_its_refusal_does_not_relaunch_onto_a_terminated_instance(
    workflow, relaunch, monkeypatch
):
    """Bug 4: the try launches node 1's replacement, EC2 refuses to start node 0, the try ends
    its replacement, and the step dies before it answers. Retried, the same ClientToken would
    get the same, now terminated, instance back ("the same response is returned"): the try is
    spent, and the relaunch goes on to its next try. Every node ends on a running instance."""
    fleet = Fleet(zones=ZONES[:1])
    answers = Ec2Answers(monkeypatch, fleet)
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[1]])  # a retired host
    answers.full, answers.full_tries = {ZONES[0]: "InsufficientInstanceCapacity"}, 1
    answers.refused_operations = ("StartInstances",)
    real, ended = ec2_fleet.terminate, []

    def end_then_die(ids):
        real(ids)
        if ids and not ended:
            ended.extend(ids)
            raise RuntimeError("Runtime.ExitError")  # the step's process dies here

    monkeypatch.setattr(ec2_fleet, "terminate", end_then_die)
    execution = relaunch(fleet)
    assert workflow.states(execution)[-1] == "Relaunched"
    nodes = fleet.instances()
    assert [(n["node"], n["state"]) for n in nodes] == [(0, "running"), (1, "running")]
    assert nodes[1]["id"] not in ended
