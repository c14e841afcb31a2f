"""The fleet's instances as the run controller sees and moves them through EC2: find them and
their status checks, reboot, stop or terminate them, start them, launch the missing ones.

Every instance of a fleet, CloudFormation's and the ones the controller launched, carries the
tags `horovod-fleet:stack` (TrainStack's id) and `horovod-fleet:node` (its node: an index, or a
name such as `head`; a launched node gets it from the controller right after its launch, the head
from its own template); the controller's role may reboot, stop, start, terminate, launch and tag
only instances so tagged.
Only boto3 and the standard library: part of the run controller's Lambda asset.
"""

import hashlib

from botocore.exceptions import ClientError
from clients import NodePending, client, log

FLEET_TAG = "horovod-fleet:stack"
NODE_TAG = "horovod-fleet:node"
HEAD_NODE = "head"  # an elastic fleet's head's node tag (stacks/teardown/names.py)
# The instance states a node can come back from; "shutting-down" is on its way to terminated.
LIVE_STATES = ("pending", "running", "stopping", "stopped")
UP_STATES = ("pending", "running")
SETTLING_STATES = ("stopping", "shutting-down")
# RunInstances' and StartInstances' answers when there is no capacity for the type in the zone
# now (or, for Spot, none at the price or within the quota): wait and try again. The five that
# AWS ParallelCluster fails over on as capacity errors
# (aws/aws-parallelcluster-node PR #673, src/slurm_plugin/fleet_manager.py), from
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html
CAPACITY_CODES = (
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "UnfulfillableCapacity",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
)
# What stacks/train/fleet.py sets on each interface, copied into a launch in another zone.
INTERFACE_FIELDS = (
    "DeviceIndex",
    "NetworkCardIndex",
    "InterfaceType",
    "Groups",
    "DeleteOnTermination",
    "Description",
)


def nodes(stack_id: str) -> list[dict]:
    """The stack's instances not yet terminated, CloudFormation's and the controller's: each
    one's id, state, node index (None without the tag), zone, whether it is Spot and whether
    CloudFormation owns it."""
    found = {}
    for tag in ("aws:cloudformation:stack-id", FLEET_TAG):
        pages = (
            client("ec2")
            .get_paginator("describe_instances")
            .paginate(
                Filters=[
                    {"Name": f"tag:{tag}", "Values": [stack_id]},
                    {"Name": "instance-state-name", "Values": [*LIVE_STATES, "shutting-down"]},
                ]
            )
        )
        for instance in (i for p in pages for r in p["Reservations"] for i in r["Instances"]):
            found[instance["InstanceId"]] = node_of(instance)
    return sorted(found.values(), key=lambda n: n["id"])


def every_fleet_instance() -> list[dict]:
    """Every instance that carries the fleet's tag, whatever stack it names: the tick's view of
    every fleet, live or left over (orphans). Terminated ones too, as long as EC2 lists them
    ("usually less than one hour"): they say which market a fleet reclaimed whole was on."""
    pages = (
        client("ec2")
        .get_paginator("describe_instances")
        .paginate(Filters=[{"Name": "tag-key", "Values": [FLEET_TAG]}])
    )
    found = [node_of(i) for p in pages for r in p["Reservations"] for i in r["Instances"]]
    return sorted(found, key=lambda n: n["id"])


def node_of(instance: dict) -> dict:
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    return {
        "id": instance["InstanceId"],
        "state": instance["State"]["Name"],
        # The node tag as text: an index ("3"), or a node that has none (an elastic fleet's head).
        "node": tags.get(NODE_TAG) or None,
        "launched": instance.get("LaunchTime"),
        "spot": instance.get("InstanceLifecycle") == "spot",
        "zone": instance.get("Placement", {}).get("AvailabilityZone"),
        "stack": tags.get(FLEET_TAG),
        "cloudformation": "aws:cloudformation:stack-id" in tags,
        # Which launch request made it ("The client token is included in the response when you
        # describe the instance", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Run_Instance_Idempotency.html).
        "client_token": instance.get("ClientToken", ""),
    }


def instance(instance_id: str) -> dict | None:
    """One instance as `nodes` gives it; None when EC2 no longer knows it."""
    try:
        reservations = client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
    except ClientError as error:
        if error.response["Error"].get("Code") != "InvalidInstanceID.NotFound":
            raise
        return None
    found = [i for r in reservations for i in r["Instances"]]
    return node_of(found[0]) if found else None


def missing(count: int, fleet: list[dict]) -> list[int]:
    """The node indexes no live instance serves: EC2 terminated them (a Spot interruption, a
    retired host) or the relaunch did (Spot instances cannot be stopped)."""
    served = {n["node"] for n in fleet if n["state"] in LIVE_STATES}
    return [i for i in range(count) if str(i) not in served]


def whole(count: int, fleet: list[dict]) -> bool:
    """Every node served, and every instance up: nothing for the controller to bring back."""
    live = [n for n in fleet if n["state"] in LIVE_STATES]
    return not missing(count, fleet) and all(n["state"] in UP_STATES for n in live)


def settled(fleet: list[dict]) -> bool:
    return not any(n["state"] in SETTLING_STATES for n in fleet)


def stop(fleet: list[dict], keep: frozenset[str] = frozenset()) -> dict:
    """No node of the fleet bills but the ones to `keep` running (they come back in place):
    every other on-demand one stopped, every other Spot one terminated (a one-time Spot
    instance cannot be stopped). A node still pending cannot be stopped yet: NodePending, after
    the others were, so the step is retried until it can be."""
    fleet = [n for n in fleet if n["id"] not in keep]
    terminate = [n["id"] for n in fleet if n["spot"] and n["state"] in LIVE_STATES]
    running = [n["id"] for n in fleet if not n["spot"] and n["state"] == "running"]
    pending = [n["id"] for n in fleet if not n["spot"] and n["state"] == "pending"]
    if terminate:
        client("ec2").terminate_instances(InstanceIds=terminate)
    refused = []
    for ids in (running, pending):
        if not ids:
            continue
        try:
            client("ec2").stop_instances(InstanceIds=ids)
        except ClientError as error:
            # "cannot be stopped as it has never reached the 'running' state" (research notes,
            # https://github.com/cloud-custodian/cloud-custodian/pull/6014)
            if error.response["Error"].get("Code") != "IncorrectInstanceState":
                raise
            refused += ids
    if refused:
        raise NodePending(f"EC2 refused to stop {', '.join(refused)} while pending")
    return {"stopped": running + pending, "terminated": terminate}


def terminate(ids: list[str]) -> None:
    if ids:
        client("ec2").terminate_instances(InstanceIds=ids)


def start(ids: list[str]) -> None:
    if ids:
        client("ec2").start_instances(InstanceIds=ids)


def reboot(ids: list[str]) -> None:
    """RebootInstances: "equivalent to an operating system reboot"; the instance keeps its
    addresses and "any data on its instance store volumes", and starts no new billing period
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-reboot.html). The call
    only queues the reboots ("This operation is asynchronous"; a Linux instance that does not
    shut down cleanly is hard-rebooted within minutes,
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RebootInstances.html)."""
    if ids:
        client("ec2").reboot_instances(InstanceIds=ids)


# Status checks that fail; "initializing" and "insufficient-data" are not failures, and a
# stopped instance's checks are "not-applicable".
IMPAIRED = "impaired"
# "After a scheduled event is completed, it can still be described for up to a week. If the
# event has been completed, this description starts with the following text: [Completed]"
# (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceStatusEvent.html).
DONE_EVENT = "[Completed]"


def checks(ids: list[str]) -> dict[str, dict]:
    """EC2's status checks and scheduled events of each instance, by id: {"system", "instance":
    the checks' status ("ok", "impaired", "initializing", ...), "events": the codes of the events
    still to come (instance-retirement, system-reboot, ...)}. DescribeInstanceStatus with
    IncludeAllInstances, so a stopped instance is described too ("When true, includes the
    health status for all instances. When false, includes the health status for running
    instances only",
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceStatus.html)."""
    if not ids:
        return {}
    answer = client("ec2").describe_instance_status(InstanceIds=ids, IncludeAllInstances=True)
    found = {}
    for status in answer["InstanceStatuses"]:
        events = [
            e.get("Code", "")
            for e in status.get("Events") or []
            if not (e.get("Description") or "").startswith(DONE_EVENT)
        ]
        found[status["InstanceId"]] = {
            "system": (status.get("SystemStatus") or {}).get("Status"),
            "instance": (status.get("InstanceStatus") or {}).get("Status"),
            "events": events,
        }
    return found


def client_token(try_token: str, indexes: list[int]) -> str:
    """The launch's ClientToken: a digest of the try, then one of the node indexes it launches,
    so a retried step asks for the same launch again and EC2 answers it with the same
    reservation ("If you repeat the request with the same client token, the same response is
    returned", 64 ASCII characters at most;
    https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-idempotency.html)."""
    nodes = ",".join(map(str, sorted(indexes)))
    return digest(try_token)[:32] + digest(nodes)[:32]


def spent(token: str) -> bool:
    """Whether a launch request with this ClientToken launched an instance that is now
    terminated or on its way: the same request again would get that instance back ("the same
    response is returned ... The only information that might vary in the response is the state
    of the instance", https://docs.aws.amazon.com/AWSEC2/latest/APIReference/Run_Instance_Idempotency.html),
    so the try it belongs to is spent. DescribeInstances' `client-token` filter: "The idempotency
    token you provided when you launched the instance"
    (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html)."""
    pages = (
        client("ec2")
        .get_paginator("describe_instances")
        .paginate(
            Filters=[
                {"Name": "client-token", "Values": [token]},
                {"Name": "instance-state-name", "Values": ["shutting-down", "terminated"]},
            ]
        )
    )
    return any(r["Instances"] for p in pages for r in p["Reservations"])


def launched_by(try_token: str, fleet: list[dict]) -> set[str]:
    """The instances an earlier run of this try's step launched: a retried step counts the
    nodes missing as they were before its launch, whatever of it was tagged since, so it asks
    for the same launch again."""
    return {n["id"] for n in fleet if n["client_token"].startswith(digest(try_token)[:32])}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def replacement_token(run: str, attempt: int, index: int, lost: str | None) -> str:
    """The ClientToken of the one replacement for one loss: the run, the attempt, the node and
    the instance it lost (the newest that served it; None when EC2 lists none), so every tick
    that sees the same loss asks EC2 for the same launch and gets the same instance back, and a
    new loss of the node (its replacement lost in turn) gets a new one. A SHA-256 digest in hex,
    64 characters: a token is "a unique, case-sensitive string of up to 64 ASCII characters"
    (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/Run_Instance_Idempotency.html), and
    a run's name alone may take 40."""
    return digest(f"replacement/{run}/a{attempt}/n{index}/{lost or 'none'}")


def launched_with(token: str) -> list[str]:
    """The instances a RunInstances with this ClientToken launched, in any state, found by
    DescribeInstances' `client-token` filter ("The idempotency token you provided when you
    launched the instance", https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html):
    a launch an earlier or concurrent tick made that the fleet's listing does not show yet
    (EC2's API is eventually consistent: "if you run a command to create a resource, it will
    eventually be visible to other commands",
    https://docs.aws.amazon.com/ec2/latest/devguide/eventual-consistency.html). When this lags
    too, the RunInstances with the same token still answers with that launch."""
    pages = (
        client("ec2")
        .get_paginator("describe_instances")
        .paginate(Filters=[{"Name": "client-token", "Values": [token]}])
    )
    return sorted(i["InstanceId"] for p in pages for r in p["Reservations"] for i in r["Instances"])


def launch(template: str, indexes: list[int], zone: dict, try_token: str) -> list[str]:
    """Launch the missing nodes `indexes` in one request from the replacement template, in
    `zone` (its subnet on every interface, its placement group), all or none: MinCount =
    MaxCount, and "If you specify a value that is more capacity than Amazon EC2 can provide in
    the target Availability Zone, Amazon EC2 does not launch any instances"
    (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RunInstances.html, MinCount).
    A refusal is raised. The instance ids in launch order: the one at AmiLaunchIndex k ("The
    AMI launch index, which can be used to find this instance in the launch group",
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Instance.html) is node
    indexes[k]."""
    if not indexes:
        return []
    return run_instances(template, len(indexes), zone, client_token(try_token, indexes))


def run_instances(template: str, count: int, zone: dict, token: str) -> list[str]:
    """`count` instances of `template` in `zone`, all or none, under ClientToken `token`; their
    ids in launch order (AmiLaunchIndex)."""
    reservation = client("ec2").run_instances(
        LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"},
        MinCount=count,
        MaxCount=count,
        ClientToken=token,
        **overrides(template, zone),
    )
    ordered = sorted(reservation["Instances"], key=lambda i: i["AmiLaunchIndex"])
    return [i["InstanceId"] for i in ordered]


def launch_head(template: str, try_token: str) -> str:
    """The fleet's head, launched again from its own template (stacks/train/head.py: its
    subnet, security group, role and node.json), where the template puts it: the head stays in
    the deployed zone whatever zone the nodes move to. Its ClientToken comes from the try, so a
    retried step gets the same instance back. A refusal is raised."""
    reservation = client("ec2").run_instances(
        LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"},
        MinCount=1,
        MaxCount=1,
        ClientToken=head_token(try_token),
    )
    return reservation["Instances"][0]["InstanceId"]


def head_token(try_token: str) -> str:
    return digest(try_token)[:32] + digest(HEAD_NODE)[:32]


def tag_node(instance_id: str, index: int) -> None:
    """The node index tag the controller finds a node by; the same tag again changes nothing."""
    client("ec2").create_tags(
        Resources=[instance_id], Tags=[{"Key": NODE_TAG, "Value": str(index)}]
    )


def overrides(template: str, zone: dict) -> dict:
    """RunInstances parameters that put a node of `template` into `zone`'s subnet and placement
    group: every interface with the zone's subnet (the call's list replaces the template's, and
    a subnet goes on the interfaces when there are any), and the placement; nothing when the
    template already launches there. "Any additional parameters that you specify for the new
    instance overwrite the corresponding parameters included in the launch template"
    (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RunInstances.html)."""
    if not zone.get("subnet"):
        return {}
    [version] = client("ec2").describe_launch_template_versions(
        LaunchTemplateId=template, Versions=["$Latest"]
    )["LaunchTemplateVersions"]
    data = version["LaunchTemplateData"]
    interfaces = data.get("NetworkInterfaces") or []
    group = (data.get("Placement") or {}).get("GroupName")
    if {i.get("SubnetId") for i in interfaces} == {zone["subnet"]} and group == zone["group"]:
        return {}
    moved = [
        {**{k: i[k] for k in INTERFACE_FIELDS if k in i}, "SubnetId": zone["subnet"]}
        for i in interfaces
    ]
    placement = {"Placement": {"GroupName": zone["group"]}}
    return (
        {"NetworkInterfaces": moved, **placement}
        if moved
        else {"SubnetId": zone["subnet"], **placement}
    )


def stop_billing(fleet: list[dict]) -> dict:
    """After the controller failed: every node that bills stops now, the ones EC2 will not stop
    (Spot, or still pending) terminated instead."""
    terminate_ids = [
        n["id"] for n in fleet if n["state"] in UP_STATES and (n["spot"] or n["state"] == "pending")
    ]
    stop_ids = [n["id"] for n in fleet if n["state"] == "running" and not n["spot"]]
    terminate(terminate_ids)
    if stop_ids:
        client("ec2").stop_instances(InstanceIds=stop_ids)
    log("stop-billing", stopped=stop_ids, terminated=terminate_ids)
    return {"stopped": stop_ids, "terminated": terminate_ids}
