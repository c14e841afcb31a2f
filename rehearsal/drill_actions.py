"""What each FIS action of the drill (contract/drill.py) does in the rehearsal: its own model of
FIS, played from outside the processes that must survive it (rehearsal/drill.py watches moto's
FIS experiments and plays each one's actions when it starts). FIS's own behaviour, per the
actions reference (https://docs.aws.amazon.com/fis/latest/userguide/fis-actions-reference.html):

- aws:ec2:terminate-instances: the target's host is gone (every process of its namespace killed,
  nothing restarts them) and its instance terminated in moto's EC2: a training node (COUNT(1):
  one of the running ones, at random) or the head.
- aws:ec2:stop-instances: the same host killed, its instance stopped (and left stopped: the
  drill gives no startInstancesAfterDuration).
- aws:ec2:send-spot-instance-interruptions: the rehearsal's Spot notice (IMDS's
  spot/instance-action) on one Spot node; no Spot instance to aim at fails loudly, as FIS fails
  an experiment whose target resolves to nothing.
- aws:fis:inject-api-throttle-error: the run controller's EC2 calls of exactly the listed
  operations answered RequestLimitExceeded at `percentage` for `duration`.
- aws:ec2:api-insufficient-instance-capacity-error: the controller's RunInstances,
  StartInstances, CreateFleet and CreateCapacityReservation in the given zones answered
  InsufficientInstanceCapacity at `percentage` for `duration`; a request that asks for capacity
  in several zones at once is not affected ("Requests that include capacity asks in multiple
  Availability Zones are not supported").
- aws:network:disrupt-connectivity, scope s3: every host of the fleet's subnet (the head too:
  FIS cuts the whole subnet) cut off from the local S3 for `duration` (rehearsal/iam_s3.py
  `cut`); the controller, which runs outside the subnet, is not.

The controller's errors are injected on the boto3 clients its code makes (clients.client, the
same objects its tick and its steps use in this process), before each call goes out, without
touching its code. botocore's own retries of the call are not played: FIS's errors at 100% would
fail each of them too.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from botocore.awsrequest import AWSResponse

from contract import drill
from contract.names import NODE_TAG
from rehearsal.common import say
from rehearsal.fault_actions import kill_head_and_its_instance, spot_notice

# The EC2 calls aws:ec2:api-insufficient-instance-capacity-error answers (the actions reference).
CAPACITY_OPERATIONS = ("RunInstances", "StartInstances", "CreateFleet", "CreateCapacityReservation")
PARAMS = "rehearsal-fis-params"  # where a call's parameters wait for its before-call


class Unplayable(RuntimeError):
    """An action the rehearsal has no model of, or cannot aim here: the drill fails on it."""


def duration_s(value: str) -> float:
    m = drill.DURATION.match(value)
    if not m:
        raise Unplayable(f"duration {value!r} is not an ISO 8601 duration like PT3M")
    return int(m[1]) * (60 if m[2] == "M" else 1)


@dataclass
class Window:
    """An error FIS injects into the controller's calls: `code` for `operations` (those in
    `zones` only, when given) at `percentage`, until `until`."""

    code: str
    operations: tuple[str, ...]
    percentage: float
    until: float
    zones: tuple[str, ...] = ()
    answered: list[str] = field(default_factory=list)  # the operations refused so far


class ControllerFaults:
    """The errors FIS injects into the run controller's EC2 requests. `ec2` is the rehearsal's
    own client of moto's EC2 (never refused), which says where a request asks for capacity."""

    def __init__(self, ec2, draw: Callable[[], float] = random.random) -> None:
        self.ec2, self.draw = ec2, draw
        self.windows: list[Window] = []
        self.lock = threading.Lock()
        self.hooked: set[int] = set()

    def hook(self, client) -> None:
        """Every call of `client` (the controller's EC2 client) is looked at first."""
        if id(client) not in self.hooked:
            client.meta.events.register("before-parameter-build.ec2", self.keep_params)
            client.meta.events.register("before-call.ec2", self.before_call)
            self.hooked.add(id(client))

    @staticmethod
    def keep_params(params, context, **_) -> None:
        """The call's own parameters, for before_call (which gets them serialized)."""
        context[PARAMS] = dict(params)

    def add(self, window: Window) -> None:
        with self.lock:
            self.windows.append(window)

    def before_call(self, model, context, **_) -> tuple | None:
        params = context.get(PARAMS) or {}
        now = time.time()
        with self.lock:
            live = [w for w in self.windows if now < w.until]
        for window in live:
            if model.name not in window.operations or self.draw() * 100 >= window.percentage:
                continue
            if window.zones and self.zone_of(model.name, params) not in window.zones:
                continue
            window.answered.append(model.name)
            message = f"{window.code} (the drill's FIS action, played by the rehearsal)"
            status = 503 if window.code == "RequestLimitExceeded" else 500
            parsed = {"Error": {"Code": window.code, "Message": message},
                      "ResponseMetadata": {"HTTPStatusCode": status}}  # fmt: skip
            return AWSResponse("https://ec2.amazonaws.com/", status, {}, None), parsed
        return None

    def zone_of(self, operation: str, params: dict) -> str | None:
        """The one zone a request asks capacity in, or None (several, or none known)."""
        zones = set()
        if operation == "StartInstances":
            pages = self.ec2.describe_instances(InstanceIds=params.get("InstanceIds") or [])
            zones = {i["Placement"]["AvailabilityZone"]
                     for r in pages["Reservations"] for i in r["Instances"]}  # fmt: skip
        elif operation == "RunInstances":
            zones = self.run_zones(params)
        return zones.pop() if len(zones) == 1 else None

    def run_zones(self, params: dict) -> set[str]:
        if zone := (params.get("Placement") or {}).get("AvailabilityZone"):
            return {zone}
        subnets = {params.get("SubnetId")} | {
            n.get("SubnetId") for n in params.get("NetworkInterfaces") or []
        }
        template = params.get("LaunchTemplate") or {}
        if not subnets - {None} and template.get("LaunchTemplateId"):
            versions = self.ec2.describe_launch_template_versions(
                LaunchTemplateId=template["LaunchTemplateId"], Versions=["$Latest"]
            )["LaunchTemplateVersions"]
            data = versions[0]["LaunchTemplateData"] if versions else {}
            if zone := (data.get("Placement") or {}).get("AvailabilityZone"):
                return {zone}
            subnets = {n.get("SubnetId") for n in data.get("NetworkInterfaces") or []}
        subnets -= {None}
        if not subnets:
            return set()
        found = self.ec2.describe_subnets(SubnetIds=sorted(subnets))["Subnets"]
        return {s["AvailabilityZone"] for s in found}


class Players:
    """The rehearsal's model of each FIS action, played on `rehearsal` (rehearsal/core.py, its
    fleet of namespaces and its Cloud in moto) with `faults` on the controller's clients."""

    def __init__(self, rehearsal, zone: str, faults: ControllerFaults | None = None) -> None:
        self.rehearsal, self.zone = rehearsal, zone
        self.faults = faults  # made once the controller runs (rehearsal/drill.py Executor)
        self.by_id: dict[str, Callable[[str, dict[str, str]], str]] = {
            drill.TERMINATE: self.terminate,
            drill.STOP: self.stop,
            drill.SPOT_INTERRUPTION: self.interrupt,
            drill.THROTTLE: self.throttle,
            drill.INSUFFICIENT_CAPACITY: self.no_capacity,
            drill.DISRUPT_CONNECTIVITY: self.disrupt,
        }

    def check(self, action: drill.FisAction) -> None:
        """Unplayable unless the rehearsal has a model of the action as it is given."""
        if action.action_id not in self.by_id:
            raise Unplayable(
                f"the rehearsal cannot play {action.action_id} ({action.name}): it plays "
                f"{', '.join(sorted(self.by_id))}"
            )
        given = dict(action.parameters)
        if action.action_id == drill.DISRUPT_CONNECTIVITY and given.get("scope") != "s3":
            raise Unplayable(f"the rehearsal cuts only scope s3, not {given.get('scope')}")
        if action.action_id == drill.THROTTLE and given.get("service") != "ec2":
            raise Unplayable(f"the rehearsal throttles only ec2, not {given.get('service')}")

    def play(self, action_id: str, target: str, parameters: dict[str, str]) -> str:
        """Play one action now; returns what was done, in one line."""
        if action_id not in self.by_id:
            raise Unplayable(f"the rehearsal cannot play {action_id}")
        return self.by_id[action_id](target, parameters)

    # --- on instances -------------------------------------------------------------------------

    def running_nodes(self, spot: bool = False) -> dict[int, str]:
        """The training nodes whose instance runs now (FIS resolves its targets so: the run's
        tags, State.Name running), by index; Spot ones only with `spot`."""
        cloud = self.rehearsal.cloud
        pages = cloud.ec2.describe_instances(
            Filters=[{"Name": "instance-state-name", "Values": ["running"]}]
        )
        found = {}
        for instance in (i for r in pages["Reservations"] for i in r["Instances"]):
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            if not tags.get(NODE_TAG, "").isdigit():
                continue
            if spot and instance.get("InstanceLifecycle") != "spot":
                continue
            found[int(tags[NODE_TAG])] = instance["InstanceId"]
        return found

    def one_node(self, spot: bool = False) -> tuple[int, str]:
        nodes = self.running_nodes(spot)
        if not nodes:
            kind = "Spot training node" if spot else "training node"
            raise Unplayable(f"no running {kind} to aim at: FIS fails an empty target")
        index = random.choice(sorted(nodes))  # COUNT(1): one of them
        return index, nodes[index]

    def lose_host(self, index: int) -> int:
        rehearsal = self.rehearsal
        rehearsal.services.pop(f"node{index}", None)
        return len(rehearsal.fleet.kill_host(rehearsal.fleet.nodes[index].namespace))

    def terminate(self, target: str, parameters: dict[str, str]) -> str:
        if target == drill.HEAD:
            kill_head_and_its_instance(self.rehearsal)
            return f"the head's host gone, {self.rehearsal.noted['head_terminated']} terminated"
        index, instance = self.one_node()
        killed = self.lose_host(index)
        self.rehearsal.cloud.ec2.terminate_instances(InstanceIds=[instance])
        return f"node {index}'s host gone ({killed} processes), {instance} terminated"

    def stop(self, target: str, parameters: dict[str, str]) -> str:
        if target == drill.HEAD:
            raise Unplayable("the rehearsal stops training nodes only")
        index, instance = self.one_node()
        killed = self.lose_host(index)
        self.rehearsal.cloud.ec2.stop_instances(InstanceIds=[instance])
        return f"node {index}'s host gone ({killed} processes), {instance} stopped"

    def interrupt(self, target: str, parameters: dict[str, str]) -> str:
        index, instance = self.one_node(spot=True)
        spot_notice(index)(self.rehearsal)
        return f"node {index} ({instance}) noticed: EC2 interrupts it in two minutes"

    # --- on the controller's role and the subnet -----------------------------------------------

    def throttle(self, target: str, parameters: dict[str, str]) -> str:
        seconds = duration_s(parameters["duration"])
        operations = tuple(parameters["operations"].split(","))
        percentage = float(parameters["percentage"])
        self.faults.add(
            Window("RequestLimitExceeded", operations, percentage, time.time() + seconds)
        )
        return f"the controller's {', '.join(operations)} throttled at {percentage:g}% for {seconds:.0f} s"

    def no_capacity(self, target: str, parameters: dict[str, str]) -> str:
        seconds = duration_s(parameters["duration"])
        zones = tuple(
            self.zone if z == drill.ZONE else z
            for z in parameters["availabilityZoneIdentifiers"].split(",")
        )
        percentage = float(parameters["percentage"])
        window = Window("InsufficientInstanceCapacity", CAPACITY_OPERATIONS, percentage,
                        time.time() + seconds, zones)  # fmt: skip
        self.faults.add(window)
        return f"the controller's launches in {', '.join(zones)} refused (no capacity) for {seconds:.0f} s"

    def disrupt(self, target: str, parameters: dict[str, str]) -> str:
        seconds = duration_s(parameters["duration"])
        rehearsal = self.rehearsal
        rehearsal.iam.cut(keep={rehearsal.fleet.gateway}, seconds=seconds)
        return f"the fleet's subnet cut off from S3 for {seconds:.0f} s"


def wait_for_capacity_at_the_tick_s_scale(tick_s: float, stopping: threading.Event):
    """The workflow's WaitForCapacity at the rehearsal's minute (the tick runs every `tick_s`
    instead of every 60 s), where every other wait is near nothing: a relaunch that met no
    capacity waits 10 rehearsal minutes before its next try, as on AWS, not the instant the
    capacity error lasts (rehearsal/state_machine.py's on_wait)."""

    def on_wait(execution: str, state: str, seconds: float) -> None:
        if state == "WaitForCapacity" and seconds > 0:
            say(
                f"run controller: waiting for capacity {seconds:.0f} s ({seconds * tick_s / 60:.0f} s here)"
            )
            stopping.wait(seconds * tick_s / 60)

    return on_wait
