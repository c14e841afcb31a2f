"""The run controller's relaunch states (stacks/teardown/workflow.py): StopFleet, CheckSettled
and Launch, zone by zone and round by round, and the one-line record when no try can bring
the fleet back.

The head (an elastic fleet's CPU instance, on demand) is stopped and started with the nodes.
A stop and start puts an on-demand node on healthy hardware with empty instance stores, its
address and placement group kept. Spot Instances, one-time requests, cannot be stopped: they are
replaced, as a node EC2 terminated is. Either way each node's boot service resumes the run from
S3. Without capacity the next try goes to the next zone at once; after a round of every zone
the workflow waits, twice as long each round up to an hour (zones.wait_after); after the last
round, or when the hard cap leaves no time for an attempt, the run gives up in one line: the
DONE.json of the attempt that never started, which the tick records.

The execution's input (tick.py): {"run", "action": "relaunch", "stack_id", "attempt" (the one
that ended), "plan": {"zones" (in try order), "nodes"}}.
Only boto3, the standard library and contract/: part of the run controller's Lambda asset.
"""

import datetime

from botocore.exceptions import ClientError

from contract import causes
from contract.names import HEAD_NODE
from contract.runs import stamp
from controller import ec2_fleet, records, recovery, train_stack, zones
from controller.clients import client, error_code, error_message, log, now, setting, step, throttled
from controller.notify import notify
from controller.steps import RECHECK, fleet_stack, seconds, tell, wait

SETTLE_CHECK = datetime.timedelta(seconds=15)
# Stopping a p4d takes minutes; one that is still stopping after this is stuck.
SETTLE_LIMIT = datetime.timedelta(minutes=20)
# A try whose launch was ended after EC2 refused its start (ec2_fleet.spent): it counts as that
# refusal, a try without capacity.
SPENT = "TrySpent"


class NotSettled(Exception):
    """The fleet's nodes are still stopping or terminating long after they were told to."""


def unusable(event: dict, stack: dict | None) -> dict | None:
    """Where the workflow goes instead when the stack is gone, being deleted or another run's."""
    if train_stack.gone(stack) or stack["run"] != event["run"]:
        log("relaunch-dropped", run=event["run"], stack=stack and stack["status"])
        return {"next": "nothing", "outcome": "nothing"}
    if train_stack.deleting(stack):
        return {"next": "follow", "outcome": "follow"}
    return None


@step
def stop_fleet(event: dict) -> dict:
    """No node bills until the launch: every on-demand node stopped, every Spot one terminated.
    A node still pending raises NodePending, and the state's Retry brings it back here."""
    stack = fleet_stack(event)
    if train_stack.gone(stack):
        return {"stopped": [], "terminated": []}
    result = ec2_fleet.stop(ec2_fleet.nodes(stack["id"]))
    log("relaunch-stop", run=event["run"], **result)
    return result


@step
def settled(event: dict) -> dict:
    """Whether no node of the fleet is still stopping or terminating, so a launch may begin."""
    stack = fleet_stack(event)
    if (other := unusable(event, stack)) is not None:
        return other
    if train_stack.busy(stack):
        return wait(RECHECK)
    fleet = ec2_fleet.nodes(stack["id"])
    if ec2_fleet.settled(fleet):
        return {"next": "launch"}
    checks = (event.get("settle") or {}).get("checks", 0) + 1
    if checks * SETTLE_CHECK > SETTLE_LIMIT:
        states = {n["id"]: n["state"] for n in fleet}
        raise NotSettled(f"still settling after {SETTLE_LIMIT}: {states}")
    return wait(SETTLE_CHECK, checks=checks)


@step
def launch(event: dict) -> dict:
    """One try: in its zone (`plan.zones[(try - 1) % len]`), launch the missing nodes in one
    request and start the stopped ones, all or none. Nodes in another zone are terminated
    first (a placement group is one zone), and the fleet settles again. A try whose request
    launched an instance that is gone since (its start was refused and its launch ended, then
    the step was retried) is spent: asked again, EC2 would answer with that dead instance."""
    run, plan = event["run"], event["plan"]
    attempt = event["attempt"]
    number = (event.get("launch") or {}).get("next_try", 1)
    stack = fleet_stack(event)
    if (other := unusable(event, stack)) is not None:
        return other
    zone = zones.zone_of_try(plan["zones"], number)
    fleet = ec2_fleet.nodes(stack["id"])
    # The head stays where it is (it has no template to be launched again from, and is in no
    # placement group): it reaches the nodes across zones.
    elsewhere = [
        n["id"]
        for n in fleet
        if zone["zone"]
        and n["state"] in ec2_fleet.LIVE_STATES
        and n["zone"] != zone["zone"]
        and n["node"] != HEAD_NODE
    ]
    ec2_fleet.terminate(elsewhere)
    if elsewhere or not ec2_fleet.settled(fleet) or train_stack.busy(stack):
        log("relaunch-settle", run=run, zone=zone["zone"], moving=elsewhere)
        return {"outcome": "settle", "next_try": number}
    token = f"{stack['id']}/{run}/a{attempt}/t{number}/{zone['zone']}"
    earlier = ec2_fleet.launched_by(token, fleet)
    missing = ec2_fleet.missing(plan["nodes"], [n for n in fleet if n["id"] not in earlier])
    stopped = sorted(n["id"] for n in fleet if n["state"] == "stopped")
    if missing and ec2_fleet.spent(ec2_fleet.client_token(token, missing)):
        log("relaunch-try-spent", run=run, zone=zone["zone"], tries=number)
        return refused(
            event, stack, zone, number, SPENT, "its launch was ended: the start was refused"
        )
    try:
        launched = ec2_fleet.launch(stack["template"], missing, zone, token)
    except ClientError as error:
        unless_throttled(error)
        return refused(event, stack, zone, number, error_code(error), error_message(error))
    replaced = assign(run, attempt + 1, zone, launched, missing)
    try:
        ec2_fleet.start(stopped)
    except ClientError as error:
        # A refused start ends the try, and its launched nodes must not bill through the wait;
        # a retried step finds the try spent by its token.
        unless_throttled(error)
        ec2_fleet.terminate(list(replaced.values()))
        return refused(event, stack, zone, number, error_code(error), error_message(error))
    log("relaunched", run=run, zone=zone["zone"], started=stopped, replaced=replaced)
    first = plan["zones"][0]["zone"]
    tell(event, "Relaunched", reason=f"relaunched in {zone['zone'] or 'its zone'}")
    if zone["zone"] != first and (stopped or replaced):
        tried = ", ".join(z["zone"] for z in plan["zones"][: plan["zones"].index(zone)])
        notify(stack, run, f"moved to zone {zone['zone']}: {tried} had no capacity")
    return {"outcome": "launched", "zone": zone["zone"], "started": stopped, "replaced": replaced}


def unless_throttled(error: ClientError) -> ClientError:
    """`error`, or, when AWS only throttled the call, AwsThrottled raised for the state's Retry."""
    if (retry := throttled(error)) is not None:
        raise retry from error
    return error


def assign(run: str, attempt: int, zone: dict, launched: list[str], indexes: list[int]) -> dict:
    """Which node each instance launched for `attempt` is: the one at launch index k is node
    indexes[k]. Written to S3, where the node waits for it at boot, then tagged on the
    instance, where the controller finds it; a retried step gets the same instances in the
    same order and writes the same."""
    s3, bucket = client("s3"), setting("BUCKET")
    for instance_id, index in zip(launched, indexes, strict=True):
        assignment = {
            "node_index": index,
            "instance_id": instance_id,
            "run": run,
            "attempt": attempt,
            "zone": zone["zone"],
        }
        records.write_launch(s3, bucket, run, instance_id, assignment)
        ec2_fleet.tag_node(instance_id, index)
    return {str(index): instance_id for instance_id, index in zip(launched, indexes, strict=True)}


def refused(event: dict, stack: dict, zone: dict, number: int, code: str, message: str) -> dict:
    """EC2 refused the try: without capacity the next try, in the next zone at once or after a
    round later; any other refusal, or no round or time left, ends the run in one line."""
    order = event["plan"]["zones"]
    if code not in (*ec2_fleet.CAPACITY_CODES, SPENT):
        why = f"the relaunch failed: EC2 answered {code}: {message}"
        return give_up(event, stack, causes.RELAUNCH_REFUSED, why)
    pause = zones.wait_after(number, len(order))
    deadline = train_stack.deadline_of(stack)
    if pause is None or (deadline and now() + pause + recovery.MIN_ATTEMPT > deadline):
        where = ", ".join(z["zone"] or "its zone" for z in order)
        return give_up(
            event,
            stack,
            causes.NO_CAPACITY,
            f"no capacity for the fleet in {where}: {code} on each of {number} tries; deploy "
            "again later, in another region, or with a capacity reservation",
        )
    next_zone = zones.zone_of_try(order, number + 1)["zone"]
    at = now() + pause
    rounds = len(order) * zones.CAPACITY_ROUNDS
    log("relaunch-no-capacity", run=event["run"], error=code, zone=zone["zone"], tries=number)
    tell(
        event,
        "WaitForCapacity",
        reason=f"waiting for capacity: {code} in {zone['zone'] or 'its zone'} (try {number} of "
        f"{rounds}); next try {'in ' + next_zone if next_zone else 'there'} at {stamp(at)}",
    )
    return {
        "outcome": "no_capacity",
        "wait_s": seconds(pause),
        "next_try": number + 1,
        "zone": zone["zone"],
        "error": code,
    }


def give_up(event: dict, stack: dict, cause: str, reason: str) -> dict:
    """The relaunch cannot bring the fleet back: the attempt it was for ends as failed with
    `cause` and `reason`, one line, in the DONE.json it never wrote. The tick records it as final
    (contract.causes.FINAL) and tears the fleet down with its results."""
    run, attempt = event["run"], event["attempt"] + 1
    s3, bucket = client("s3"), setting("BUCKET")
    records.write_done(
        s3,
        bucket,
        run,
        attempt=attempt,
        status="failed",
        cause=cause,
        reason=reason,
        at=stamp(now()),
        earlier=records.attempts(s3, bucket, run),
    )
    log("relaunch-gave-up", run=run, reason=reason, attempt=attempt)
    notify(stack, run, f"gave up: {reason}")
    return {"outcome": "gave_up", "attempt": attempt}
