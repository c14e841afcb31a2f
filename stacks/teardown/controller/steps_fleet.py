"""The run controller's relaunch states (stacks/teardown/workflow.py): StopFleet, CheckSettled
and Launch, zone by zone and round by round, and the one-line record when no try can bring
the fleet back.

Each instance of the fleet, the head's too, comes back the cheapest way EC2's own view of it
and the ended attempt's records allow (recovery.way_back): one that runs, passes its status
checks, has no event scheduled and is not named is rebooted in place, keeping its instance store
(the dataset), its addresses and its billing period, and asking EC2 for no capacity; an
on-demand one that is stopped, impaired, scheduled or named is stopped and started (a healthy
host, empty instance stores); a Spot one that would need a stop, and one EC2 ended, is replaced
from its launch template. The reboots come last, once the launches and starts of the try went
through: a node rebooted early would boot into an attempt that a try without capacity then
stops. Whichever way, each node's boot service resumes the run from S3 under the new attempt's
key. Without capacity the next try goes to the next zone at once; after a round of every zone
the workflow waits, twice as long each round up to an hour (zones.wait_after), with every node
stopped (or terminated, on Spot); after the last round, or when the hard cap leaves no time for
an attempt, the run gives up in one line: the DONE.json of the attempt that never started, which
the tick records.

controller.json's `relaunch` says what the relaunch does and did: the try's plan (the nodes it
starts and reboots), written before any of it, so a step that dies midway and is retried does
the same (EC2 answers a repeated launch with its ClientToken's instances, a repeated start of a
running instance changes nothing, a repeated reboot is one more boot), and, once the try went
through, how each node came back (`nodes`), which each node copies into its phases record and
so into DONE.json (docs/contracts.md).

The execution's input (tick.py): {"run", "action": "relaunch", "stack_id", "attempt" (the one
that ended), "plan": {"zones" (in try order), "nodes"}}.
Only boto3 and the standard library: part of the run controller's Lambda asset.
"""

import datetime

import ec2_fleet
import records
import recovery
import train_stack
import zones
from botocore.exceptions import ClientError
from clients import (
    client,
    error_code,
    error_message,
    log,
    now,
    parse_stamp,
    setting,
    stamp,
    step,
    throttled,
)
from notify import notify
from steps import RECHECK, fleet_stack, seconds, tell, wait

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
    """No node bills until the launch but the ones that come back in place. The relaunch's
    first stop (no try made yet) weighs each node (`ways`): the ones to reboot keep running,
    every other on-demand node is stopped, every other Spot one terminated. After a try that
    found no capacity, or gave the relaunch up, every node stops: the wait may last an hour. A
    node still pending raises NodePending, and the state's Retry brings it back here."""
    stack = fleet_stack(event)
    if train_stack.gone(stack):
        return {"stopped": [], "terminated": [], "ways": {}}
    fleet = ec2_fleet.nodes(stack["id"])
    ways = {} if "launch" in event else assess(event, stack, fleet)
    keep = frozenset(w["instance_id"] for w in ways.values() if w["way"] == recovery.REBOOTED)
    result = ec2_fleet.stop(fleet, keep)
    log("relaunch-stop", run=event["run"], ways=ways, **result)
    return {**result, "ways": ways}


def assess(event: dict, stack: dict, fleet: list[dict]) -> dict:
    """How each node (by index, and the head) comes back, and why: recovery.way_back on EC2's
    view of its instance and on what the ended attempt's records say of it."""
    live = [n for n in fleet if n["state"] not in recovery.ENDED_STATES]
    checks = ec2_fleet.checks([n["id"] for n in live])
    named = named_instances(event, stack, live)
    ways = {}
    for node in live:
        way, why = recovery.way_back(node, checks.get(node["id"]), named.get(node["id"]))
        ways[node["node"] or node["id"]] = {"instance_id": node["id"], "way": way, "why": why}
    gone = [str(i) for i in ec2_fleet.missing(event["plan"]["nodes"], live)]
    if stack["head_template"] and not any(n["node"] == ec2_fleet.HEAD_NODE for n in live):
        gone.append(ec2_fleet.HEAD_NODE)
    for node in gone:
        way, why = recovery.way_back(None, None, None)
        ways[node] = {"instance_id": None, "way": way, "why": why}
    return ways


def named_instances(event: dict, stack: dict, live: list[dict]) -> dict[str, str]:
    """The instances a record of the ended attempt names, by id, each with why: a node's own
    failure whose cause indicts its instance (recovery.NAMING_CAUSES), the Spot notice of its
    instance (EC2 reclaims it), and, when the attempt ended `nodes_missing`, a node with no
    heartbeat since its instance launched in the attempt (it never booted). Records of an
    earlier attempt, or of an instance that is gone, name nothing."""
    s3, bucket, run = client("s3"), setting("BUCKET"), event["run"]
    entries = records.attempts(s3, bucket, run)
    since = attempt_began(entries, event["attempt"], stack["created_at"])
    ids = {n["id"] for n in live}
    named = {}
    for doc in records.said_since(s3, bucket, run, "failures", since):
        if doc.get("cause") in recovery.NAMING_CAUSES and doc.get("instance_id") in ids:
            named[doc["instance_id"]] = f"its own failure names it ({doc['cause']})"
    for doc in records.said_since(s3, bucket, run, "interruptions", since):
        if doc.get("instance_id") in ids:
            named[doc["instance_id"]] = "EC2 gave it a Spot interruption notice"
    ended = next((e for e in entries if e.get("attempt") == event["attempt"]), {})
    if ended.get("cause") == "nodes_missing":
        beats = records.heartbeats(s3, bucket, run)
        for node in live:
            beat, launched = beats.get(node["node"] or ""), node["launched"] or since
            if node["node"] != ec2_fleet.HEAD_NODE and (
                beat is None or beat < max(since, launched)
            ):
                named[node["id"]] = "it never registered in the attempt (nodes_missing)"
    return named


def attempt_began(entries: list[dict], attempt: int, created: datetime.datetime):
    """When `attempt` began, to the second (S3's LastModified has no finer one): the decision
    that relaunched the one before it, or the stack's creation (a run deployed again continues
    its attempts in a new stack)."""
    before = [e for e in entries if (e.get("attempt") or 0) < attempt and e.get("decided_at")]
    decided = [parse_stamp(e["decided_at"]) for e in before]
    return max([created.replace(microsecond=0), *decided])


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
    request (and the head from its own template, when EC2 ended it), start the stopped ones,
    all or none, then reboot the ones that come back in place. Nodes in another zone are
    terminated first (a placement group is one zone), and the fleet settles again. A try whose
    request launched an instance that is gone since (its start was refused and its launch
    ended, then the step was retried) is spent: asked again, EC2 would answer with that dead
    instance."""
    run, plan = event["run"], event["plan"]
    attempt = event["attempt"]
    number = (event.get("launch") or {}).get("next_try", 1)
    stack = fleet_stack(event)
    if (other := unusable(event, stack)) is not None:
        return other
    zone = zones.zone_of_try(plan["zones"], number)
    fleet = ec2_fleet.nodes(stack["id"])
    # The head stays where it is (its template launches it in the deployed zone, outside any
    # placement group): it reaches the nodes across zones.
    elsewhere = [
        n["id"]
        for n in fleet
        if zone["zone"]
        and n["state"] in ec2_fleet.LIVE_STATES
        and n["zone"] != zone["zone"]
        and n["node"] != ec2_fleet.HEAD_NODE
    ]
    ec2_fleet.terminate(elsewhere)
    if elsewhere or not ec2_fleet.settled(fleet) or train_stack.busy(stack):
        log("relaunch-settle", run=run, zone=zone["zone"], moving=elsewhere)
        return {"outcome": "settle", "next_try": number}
    token = f"{stack['id']}/{run}/a{attempt}/t{number}/{zone['zone']}"
    earlier = ec2_fleet.launched_by(token, fleet)
    before = [n for n in fleet if n["id"] not in earlier]
    missing = ec2_fleet.missing(plan["nodes"], before)
    head = bool(stack["head_template"]) and not any(
        n["node"] == ec2_fleet.HEAD_NODE and n["state"] in ec2_fleet.LIVE_STATES for n in before
    )
    spent = (missing and ec2_fleet.spent(ec2_fleet.client_token(token, missing))) or (
        head and ec2_fleet.spent(ec2_fleet.head_token(token))
    )
    if spent:
        log("relaunch-try-spent", run=run, zone=zone["zone"], tries=number)
        return refused(
            event, stack, zone, number, SPENT, "its launch was ended: the start was refused"
        )
    in_place = try_plan(event, number, before)
    replaced, head_id = {}, None
    try:
        replaced, head_id = launch_missing(event, stack, zone, token, missing, head)
        ec2_fleet.start(in_place["started"])
    except ClientError as error:
        # A refused start ends the try, and its launched nodes must not bill through the wait;
        # a retried step finds the try spent by its token.
        unless_throttled(error)
        ended = [*launched_in(error), *replaced.values(), *([head_id] if head_id else [])]
        ec2_fleet.terminate(ended)
        return refused(event, stack, zone, number, error_code(error), error_message(error))
    ec2_fleet.reboot(in_place["rebooted"])
    came_back = ways_back(in_place, before, replaced, head_id)
    log("relaunched", run=run, zone=zone["zone"], came_back=came_back)
    tell(
        event,
        "Relaunched",
        reason=f"relaunched in {zone['zone'] or 'its zone'}",
        relaunch={**in_place, "nodes": came_back},
    )
    first = plan["zones"][0]["zone"]
    if zone["zone"] != first and (in_place["started"] or replaced or head_id):
        tried = ", ".join(z["zone"] for z in plan["zones"][: plan["zones"].index(zone)])
        notify(stack, run, f"moved to zone {zone['zone']}: {tried} had no capacity")
    return {
        "outcome": "launched",
        "zone": zone["zone"],
        "started": in_place["started"],
        "rebooted": in_place["rebooted"],
        "replaced": replaced,
        "head": head_id,
    }


class TryRefused(ClientError):
    """EC2 refused a launch or a start of the try after it launched `launched` (to be ended)."""

    def __init__(self, error: ClientError, launched: list[str]):
        super().__init__(error.response, error.operation_name)
        self.launched = launched


def launched_in(error: ClientError) -> list[str]:
    return getattr(error, "launched", [])


def launch_missing(
    event: dict, stack: dict, zone: dict, token: str, missing: list[int], head: bool
) -> tuple[dict, str | None]:
    """The missing nodes launched in one request and told their index, then the head from its
    template when it is missing: ({index: instance}, the head's instance or None). A refusal
    after a launch is raised with what it launched."""
    launched = ec2_fleet.launch(stack["template"], missing, zone, token)
    replaced = assign(event["run"], event["attempt"] + 1, zone, launched, missing)
    try:
        head_id = ec2_fleet.launch_head(stack["head_template"], token) if head else None
    except ClientError as error:
        raise TryRefused(error, launched) from error
    return replaced, head_id


def try_plan(event: dict, number: int, before: list[dict]) -> dict:
    """What try `number` starts (the stopped nodes) and reboots (the ones that run: they come
    back in place), as first planned: written in controller.json's `relaunch` before anything
    is done, and read back by a retried step, to which the started nodes look like running ones
    and the launched ones are known by their token."""
    arn = event["execution"]["arn"]
    controller = records.key(event["run"], "controller.json")
    planned = (records.read_json(client("s3"), setting("BUCKET"), controller) or {}).get("relaunch")
    planned = planned or {}
    if (planned.get("execution"), planned.get("try")) == (arn, number):
        return {k: planned[k] for k in PLAN_FIELDS}
    plan = {
        "attempt": event["attempt"] + 1,
        "execution": arn,
        "try": number,
        "started": sorted(n["id"] for n in before if n["state"] == "stopped"),
        "rebooted": sorted(n["id"] for n in before if n["state"] == "running"),
    }
    tell(event, "Launch", relaunch=plan)
    return plan


PLAN_FIELDS = ("attempt", "execution", "try", "started", "rebooted")


def ways_back(plan: dict, before: list[dict], replaced: dict, head_id: str | None) -> dict:
    """How each node came back, by node (its index, or "head"): {"instance_id", "came_back"}."""
    fleet = {n["id"]: n for n in before}
    came_back = {}
    for way, ids in ((recovery.STARTED, plan["started"]), (recovery.REBOOTED, plan["rebooted"])):
        for instance_id in ids:
            node = (fleet.get(instance_id) or {}).get("node") or instance_id
            came_back[node] = {"instance_id": instance_id, "came_back": way}
    for index, instance_id in replaced.items():
        came_back[index] = {"instance_id": instance_id, "came_back": recovery.REPLACED}
    if head_id:
        came_back[ec2_fleet.HEAD_NODE] = {"instance_id": head_id, "came_back": recovery.REPLACED}
    return came_back


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
        return give_up(event, stack, "relaunch_refused", why)
    pause = zones.wait_after(number, len(order))
    deadline = train_stack.deadline_of(stack)
    if pause is None or (deadline and now() + pause + recovery.MIN_ATTEMPT > deadline):
        where = ", ".join(z["zone"] or "its zone" for z in order)
        return give_up(
            event,
            stack,
            "no_capacity",
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
    (recovery.FINAL) and tears the fleet down with its results."""
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
