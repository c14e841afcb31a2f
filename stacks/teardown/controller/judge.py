"""The tick's rules, each a pure function of what the tick read (observe.py) and the time: what
a long action's executions say, which instances are orphans, which nodes are gone or silent,
when an idle fleet is due to go. decide.py composes them.

The loop and its timeouts follow AWS ParallelCluster's cluster manager, which reads the fleet as
it is every 60 s and repairs it (`LOOP_TIME = 60`), and terminates an instance no node claims
after 300 s (`"orphaned_instance_timeout": 300`): aws/aws-parallelcluster-node
src/slurm_plugin/clustermgtd.py at 2e8f9a8,
https://github.com/aws/aws-parallelcluster-node/blob/2e8f9a8e325d447cbfc36bb3ebd118cbd6439d6d/src/slurm_plugin/clustermgtd.py
Only the standard library: part of the run controller's Lambda asset.
"""

import datetime

from clients import parse_stamp
from ec2_fleet import HEAD_NODE, LIVE_STATES, UP_STATES, missing
from executions import DONE, LIVE, RESUMES

# An instance of a fleet that no record knows, and no live stack owns, is terminated once it is
# this old (clustermgtd's orphaned_instance_timeout).
ORPHAN_AGE = datetime.timedelta(seconds=300)
# After EC2 ended a node and no node wrote DONE.json, the leader's own record is awaited this
# long (a Spot notice comes two minutes ahead of the reclaim, and the leader writes DONE.json in
# it: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
NOTICE = datetime.timedelta(minutes=3)
# A replacement the tick launched and assigned that EC2 does not list yet is taken as launching
# for this long: EC2's API is eventually consistent, and AWS's advice is to look again "starting
# with a couple of seconds of wait time, and increasing gradually up to a few minutes"
# (https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html). Past it, an
# assigned instance EC2 does not list is gone (EC2 lists a terminated one for about an hour).
LISTING_LAG = datetime.timedelta(minutes=5)


def chain(executions: list[dict], kind: str) -> dict:
    """Where the long action `kind` stands: `none` (never started), `running`, `succeeded`,
    `failed` (the newest execution failed, timed out or was stopped, and a resume is left:
    `resume` is its number) or `exhausted` (failed, and resumed RESUMES times). `newest` is its
    newest execution."""
    mine = sorted((e for e in executions if e["kind"] == kind), key=lambda e: e["resume"])
    if not mine:
        return {"state": "none", "resume": 0, "newest": None}
    newest = mine[-1]
    if newest["status"] == LIVE:
        state = "running"
    elif newest["status"] == DONE:
        state = "succeeded"
    else:
        state = "failed" if newest["resume"] < RESUMES else "exhausted"
    return {"state": state, "resume": newest["resume"] + 1, "newest": newest}


def orphans(
    instances: list[dict], stack: dict | None, known: set[str], now: datetime.datetime
) -> list[str]:
    """Fleet instances older than ORPHAN_AGE that nothing accounts for: tagged with a stack that
    is not the live TrainStack (it is gone, or was replaced), or with the live one while neither
    CloudFormation, a node tag nor a launch assignment (`known`) claims them."""
    live_id = stack["id"] if stack is not None else None
    found = []
    for instance in instances:
        if instance["state"] not in LIVE_STATES or instance["launched"] is None:
            continue
        if now - instance["launched"] < ORPHAN_AGE:
            continue
        ours = instance["stack"] == live_id
        claimed = instance["cloudformation"] or instance["node"] or instance["id"] in known
        if not ours or not claimed:
            found.append(instance["id"])
    return found


def of_stack(instances: list[dict], stack_id: str) -> list[dict]:
    return [i for i in instances if i["stack"] == stack_id]


def gone_nodes(count: int, fleet: list[dict]) -> list[str]:
    """What keeps the fleet from being whole: each node index no instance up serves, as
    "node <i>", naming the instance that served it when it is still there (stopping, stopped,
    shutting down). [] for a whole fleet."""
    up = {n["node"] for n in fleet if n["state"] in UP_STATES}
    down = {n["node"]: n for n in fleet if n["state"] in (*LIVE_STATES, "shutting-down")}
    gone = []
    for index in (str(i) for i in range(count) if str(i) not in up):
        was = down.get(index)
        gone.append(f"node {index}" + (f" ({was['id']}, {was['state']})" if was else ""))
    return gone


def silent_nodes(
    count: int,
    heartbeats: dict,
    started: datetime.datetime,
    now: datetime.datetime,
    timeout: datetime.timedelta,
    grace: datetime.timedelta,
) -> list[str]:
    """The nodes, all of them, when none has beaten for `timeout` ([] otherwise): each node's
    heartbeat of this attempt (written since it `started`) is older than `timeout`, or, once the
    attempt is past its start-up `grace`, missing. A node still within the grace with no beat
    yet may be booting; a node with a fresh beat is alive, and so the fleet is not silent."""
    ages = {}
    for index in range(count):
        beat = heartbeats.get(str(index))
        ages[index] = now - beat if beat is not None and beat >= started else None
    past_grace = now - started > grace
    if all(
        (age is not None and age > timeout) or (age is None and past_grace) for age in ages.values()
    ):
        return [f"node {i}" for i in range(count)]
    return []


def idle_due(
    idle_since: datetime.datetime,
    checkpoint_at: datetime.datetime | None,
    deployed: datetime.datetime,
    window: datetime.timedelta,
    grace: datetime.timedelta,
) -> datetime.datetime:
    """When an idle fleet goes: once it has been quiet for the idle `window` since its last
    progress (the alarm's onset less the window, or its newest checkpoint when later), and has
    had the launch `grace` since it was `deployed` or relaunched."""
    quiet_from = idle_since - window
    progress = max(quiet_from, checkpoint_at) if checkpoint_at else quiet_from
    return max(progress + window, deployed + grace)


# --- the elastic fleet: a lost node replaced while the attempt goes on ------------------------


def head_of(fleet: list[dict]) -> dict | None:
    """The fleet's head instance (the newest launched with the head's tag); None for a fleet
    without one (a stack from before the elastic fleet)."""
    heads = [n for n in fleet if n["node"] == HEAD_NODE]
    return max(heads, key=lambda n: n["launched"] or datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)) if heads else None  # fmt: skip


def serving(fleet: list[dict], index: int, assigned_ids: set[str]) -> dict | None:
    """The instance that serves node `index` now: the newest launched of those, not yet
    terminated, tagged with it or assigned to it (a replacement the tick launched but did not
    tag yet)."""
    mine = [
        n
        for n in fleet
        if n["state"] in (*LIVE_STATES, "shutting-down")
        and (n["node"] == str(index) or n["id"] in assigned_ids)
    ]
    epoch = datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
    return max(mine, key=lambda n: n["launched"] or epoch) if mine else None


def launching(fleet: list[dict], assigned: dict[str, dict], now: datetime.datetime) -> list[str]:
    """The replacements of a node (`assigned`: instance id -> its launch assignment) that a tick
    launched and assigned within LISTING_LAG but EC2 does not list yet: the node is being
    replaced, not lost again."""
    listed = {n["id"] for n in fleet}
    return sorted(
        instance_id
        for instance_id, launch in assigned.items()
        if instance_id not in listed
        and launch.get("launched_at")
        and now - parse_stamp(launch["launched_at"]) <= LISTING_LAG
    )


def last_served(fleet: list[dict], index: int, assigned: dict[str, dict]) -> str | None:
    """The instance node `index` lost: the newest launched of those tagged with it or assigned
    to it, in any state (terminated ones too, as long as EC2 lists them), a replacement EC2
    does not list any more by its assignment's `launched_at`; None when nothing ever served it
    as far as EC2 and the assignments say. What a replacement's ClientToken is made from
    (ec2_fleet.replacement_token): a replacement is always newer than the instance it replaced,
    so a token is never asked for again once its launch was lost in turn. EC2's LaunchTime is
    to the second: within one second, a later replacement number is the newer (the instance
    CloudFormation launched counts as number 0)."""
    epoch = datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
    launched = {n["id"]: n["launched"] or epoch for n in fleet if n["node"] == str(index)}
    listed = {n["id"]: n["launched"] or epoch for n in fleet}
    for instance_id, launch in assigned.items():
        at = launch.get("launched_at")
        launched[instance_id] = listed.get(instance_id) or (parse_stamp(at) if at else epoch)

    def newest(instance_id: str) -> tuple:
        number = (assigned.get(instance_id) or {}).get("replacement") or 0
        return launched[instance_id], number, instance_id

    return max(launched, key=newest) if launched else None


def held(hold: dict | None, stack: dict) -> bool:
    """Whether an operator holds the run (`horovod-fleet hold`, runs/<run>/hold.json): a hold
    on record for this TrainStack (one left from an earlier stack of the run holds nothing)."""
    return bool(hold and hold.get("held") is True and hold.get("stack_id") == stack["id"])


def lost_why(
    instance: dict | None,
    beat: datetime.datetime | None,
    head_beat: datetime.datetime | None,
    started: datetime.datetime,
    now: datetime.datetime,
    timeout: datetime.timedelta,
    grace: datetime.timedelta,
    head_says_silent: bool = False,
) -> str | None:
    """Why a node of an elastic fleet is lost while its head trains on (None: it is not): no
    instance serves it, EC2 stopped or ended its instance, or its instance runs but its
    heartbeat (written since this instance launched and the attempt began) is older than
    `timeout` and the head's discovery leaves it out for that too (`head_says_silent`:
    status.json's `nodes_silent`, judged after an S3 outage from S3's return, which this tick
    cannot see: every heartbeat is old right after one), or it is missing past the start-up
    `grace`. Silence counts only while the head's own heartbeat is fresh: a silent head is the
    head's loss, which ends the attempt."""
    if instance is None:
        return "no instance serves it"
    if instance["state"] not in UP_STATES:
        return f"EC2 says its instance {instance['id']} is {instance['state']}"
    if head_beat is None or now - head_beat > timeout:
        return None
    since = max(started, instance["launched"] or started)
    if beat is not None and beat >= since:
        if now - beat > timeout and head_says_silent:
            return (
                f"its instance {instance['id']} runs, but its heartbeat is "
                f"{(now - beat).total_seconds():.0f} s old (more than {timeout.total_seconds():.0f} s)"
            )
        return None
    if now - since > grace:
        return (
            f"its instance {instance['id']} runs, but it has not registered in its start-up "
            f"grace ({grace.total_seconds():.0f} s)"
        )
    return None


def replacement_numbers(
    index: int, attempt: int, assignments: list[dict], tries: list[dict]
) -> set[int]:
    """The replacement numbers node `index` has used in `attempt`: the launches the controller
    assigned (runs/<run>/launches/, `replacement`) and the tries EC2 refused (controller.json's
    `replacements`)."""
    used = {
        a["replacement"]
        for a in assignments
        if a.get("attempt") == attempt and a.get("node_index") == index and a.get("replacement")
    }
    return used | {
        t["number"] for t in tries if t.get("attempt") == attempt and t.get("node") == index
    }


def unreturnable(stack: dict, fleet: list[dict]) -> str | None:
    """Why a relaunch cannot bring the fleet back, if it cannot: a node gone from a stack
    without the replacement template, or the head EC2 ended in a stack without the head's
    template (deployed before it). A head whose template is there is launched again from it."""
    lost = missing(stack["nodes"], fleet)
    head = head_of(fleet)
    if lost and not stack["template"]:
        return (
            f"node(s) {', '.join(map(str, lost))} cannot come back: the stack has no "
            "replacement template (deployed before it); deploy again to resume from the "
            "newest checkpoint"
        )
    if head and head["state"] not in LIVE_STATES and not stack.get("head_template"):
        return (
            f"the head ({head['id']}) is {head['state']} and cannot come back: the stack has no "
            "launch template for the head (deployed before it); deploy again to resume from "
            "the newest checkpoint"
        )
    return None
