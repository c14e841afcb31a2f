"""The rehearsal's fleet as EC2, CloudFormation and Step Functions see it: moto in this process
holds TrainStack (its tags and outputs, a subnet, the nodes' launch templates) and one instance
per node, and the run controller that TeardownStack synthesizes runs there as deployed: its tick,
every TICK_S (the schedule's minute, scaled down), and the executions of its state machine the
tick starts, every state's real step code against moto's EC2 and the rehearsal's local S3, judged
as the controller's role (rehearsal/iam_s3.py). So what ends an attempt, and the relaunch that
follows, are the deployed controller's: the rehearsal only turns what EC2 did to each instance
into what happens to its node. A node whose processes all died is an instance still running with
nothing on it; the tick, not the rehearsal, ends its attempt (its heartbeats go stale).

While an attempt goes on, a node the tick replaced (an elastic fleet's lost node) is a new
instance: the rehearsal starts its node there (`joined`), and it joins the training.

Between attempts the relaunch brings each instance back its own way (`Relaunch`): rebooted in
place (RebootInstances: its disks kept), stopped and started (StartInstances: its instance store
empty), or replaced (a new instance, the head's from its own template), and the rehearsal does
that to the node's host (rehearsal/attempts.py).

`Cloud` is made when a fleet is deployed (rehearsal/attempts.py), and closed with the fleet.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from unittest import mock

import boto3
from moto import mock_aws
from moto.ec2.models.instances import InstanceBackend

from rehearsal.common import BUCKET, MAX_HOURS, REGION, RUN, say
from rehearsal.state_machine import Workflow, clients

FLEET_TAG, NODE_TAG = "horovod-fleet:stack", "horovod-fleet:node"  # stacks/teardown/names.py
HEAD_NODE = "head"  # the head's node tag
ZONE = f"{REGION}a"
IMAGE = "ami-12c6146b"  # any image moto knows
# The tick's schedule, a minute on AWS, scaled down: the rehearsal's attempts last minutes.
TICK_S = 5


# An execution's statuses once it is over; the others are RUNNING and PENDING_REDRIVE (the SDK's
# ExecutionStatus: https://docs.aws.amazon.com/sdk-for-cpp/latest/api/aws-cpp-sdk-states/html/_execution_status_8h_source.html).
FINISHED = {"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"}


@dataclass
class Relaunch:
    """What the run controller's execution did to the fleet: the decisions it recorded (an
    attempts.json entry each), the nodes whose instance it rebooted in place, the ones it
    stopped and started again, the new instance it launched for each node it replaced (EC2
    ended it, or a Spot one that needed a stop), and what it did to the head (`head`: rebooted,
    started or replaced, with `head_instance` its instance now; None: nothing)."""

    entries: list[dict] = field(default_factory=list)
    rebooted: list[int] = field(default_factory=list)
    started: list[int] = field(default_factory=list)
    launched: dict[int, str] = field(default_factory=dict)
    head: str | None = None
    head_instance: str | None = None

    @property
    def replaced(self) -> list[int]:
        return sorted(self.launched)

    @property
    def brought_back(self) -> bool:
        return bool(self.rebooted or self.started or self.launched or self.head)


class Cloud:
    """TrainStack's fleet of `nodes` in moto, and TeardownStack's run controller over it. The
    stack's tags say what its nodes' node.json says (`heartbeat_s`, `grace_s`: the rendezvous
    timeout and a minute)."""

    def __init__(
        self,
        teardown: dict,
        s3,
        *,
        endpoint: str,
        nodes: int,
        spot: bool,
        restarts: int,
        min_nodes: int = 1,
        heartbeat_s: int = 60,
        grace_s: int = 360,
        log_path=None,
    ) -> None:
        self.teardown, self.s3, self.endpoint = teardown, s3, endpoint
        self.count, self.spot, self.restarts, self.min_nodes = nodes, spot, restarts, min_nodes
        self.heartbeat_s, self.grace_s, self.log_path = heartbeat_s, grace_s, log_path
        self.started: list[str] = []  # the instances StartInstances started, in order
        self.rebooted: list[str] = []  # the instances RebootInstances rebooted, in order
        self.stack = ExitStack()
        self.ticking = threading.Event()
        self.ticker: threading.Thread | None = None

    def __enter__(self) -> Cloud:
        # The steps' S3 requests go to the local endpoint as the controller's role (the local S3
        # judges them by the access key); every other service is moto's, in this process.
        settings = {
            "AWS_ACCESS_KEY_ID": "controller",
            "AWS_SECRET_ACCESS_KEY": "rehearsal",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
        }
        self.stack.enter_context(mock.patch.dict(os.environ, settings))
        config = {**Workflow.CONFIG, "core": {"mock_credentials": False}}
        self.stack.enter_context(mock_aws(config=config))
        self.stack.enter_context(
            mock.patch.object(InstanceBackend, "start_instances", self._start())
        )
        self.stack.enter_context(
            mock.patch.object(InstanceBackend, "reboot_instances", self._reboot())
        )
        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.deploy()
        # The steps make their clients once per process, as Lambda does: here under the settings
        # above, and never again after them.
        clients.client.cache_clear()
        self.stack.callback(clients.client.cache_clear)
        self.workflow = self.stack.enter_context(Workflow(self.teardown))
        self.quiet_log()
        self.stack.callback(self.stop_ticking)
        return self

    def quiet_log(self) -> None:
        """The controller's one JSON line per decision goes to <workdir>/controller.log (on
        AWS, its log group), not between the nodes' lines; the tick's verdicts are said."""
        sink = self.log_path.open("a") if self.log_path else None

        def log(decision: str, **fields) -> None:
            if sink is not None:
                sink.write(json.dumps({"decision": decision, **fields}, default=str) + "\n")
                sink.flush()

        for module in list(sys.modules.values()):
            if getattr(module, "log", None) is clients.log:
                self.stack.enter_context(mock.patch.object(module, "log", log))
        if sink is not None:
            self.stack.callback(sink.close)

    def __exit__(self, *_) -> None:
        self.stack.close()

    # --- the tick, as its schedule runs it -----------------------------------------------------

    def start_ticking(self) -> None:
        """The tick every TICK_S in a thread of its own, as EventBridge Scheduler runs it."""
        import tick  # the controller's Lambda asset (rehearsal/state_machine.py's path)

        def every_tick() -> None:
            last = None
            while not self.ticking.wait(TICK_S):
                try:
                    decision = tick.handler({"trigger": "schedule"})
                except Exception as error:  # the tick fails loudly; the next one decides again
                    say(f"run controller: the tick failed: {type(error).__name__}: {error}")
                    continue
                if decision["actions"] or decision["phase"] != last:
                    actions = ", ".join(decision["actions"]) or "nothing to do"
                    say(f"run controller tick: {decision['phase']} ({decision['why']}): {actions}")
                last = decision["phase"]

        self.ticking.clear()
        self.ticker = threading.Thread(target=every_tick, daemon=True, name="tick")
        self.ticker.start()

    def stop_ticking(self) -> None:
        self.ticking.set()
        if self.ticker is not None:
            self.ticker.join(timeout=120)
            self.ticker = None

    def _start(self):
        real, started = InstanceBackend.start_instances, self.started

        def start_instances(backend, instance_ids):
            started.extend(instance_ids)
            return real(backend, instance_ids)

        return start_instances

    def _reboot(self):
        real, rebooted = InstanceBackend.reboot_instances, self.rebooted

        def reboot_instances(backend, instance_ids):
            rebooted.extend(instance_ids)
            return real(backend, instance_ids)

        return reboot_instances

    # --- TrainStack as deployed -------------------------------------------------------------

    def deploy(self) -> None:
        """What `cdk deploy TrainStack` leaves for the controller: the stack and its outputs
        (docs/contracts.md), a subnet and placement group in one zone, the replacement launch
        template, and the nodes' instances, tagged as CloudFormation and TrainStack tag them."""
        placeholder = {"Resources": {"Handle": {"Type": "AWS::SNS::Topic"}}}
        cloudformation = boto3.client("cloudformation", region_name=REGION)
        # stacks/train/stack.py's stack-level tags, with the rehearsal's node.json's values.
        tags = {"horovod-fleet:run": RUN, "horovod-fleet:nodes": str(self.count),
                "horovod-fleet:heartbeatTimeoutS": str(self.heartbeat_s),
                "horovod-fleet:startupGraceS": str(self.grace_s)}  # fmt: skip
        self.stack_id = cloudformation.create_stack(
            StackName="TrainStack", TemplateBody=json.dumps(placeholder), Tags=as_tags(tags)
        )["StackId"]
        vpc = self.ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
        subnet = self.ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.0.0/20", AvailabilityZone=ZONE)
        self.subnet = subnet["Subnet"]["SubnetId"]
        deadline = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
            hours=MAX_HOURS
        )
        zone = {"zone": ZONE, "subnet": self.subnet, "group": f"TrainStack-group-{ZONE}"}
        outputs = {
            "HorovodFleetRun": RUN,
            "HorovodFleetMaxRestarts": str(self.restarts),
            "HorovodFleetDeadline": f"{deadline:%Y-%m-%dT%H:%M:%S}Z",
            "HorovodFleetReplacementTemplate": self.template(),
            "HorovodFleetHeadTemplate": self.head_template(),
            "HorovodFleetNodes": str(self.count),
            "HorovodFleetMinNodes": str(self.min_nodes),
            "HorovodFleetZones": json.dumps({"zones": [zone]}),
        }
        with_outputs = {
            **placeholder,
            "Outputs": {key: {"Value": value} for key, value in outputs.items()},
        }
        cloudformation.update_stack(
            StackName="TrainStack", TemplateBody=json.dumps(with_outputs), Tags=as_tags(tags)
        )
        # The nodes, then the head (stacks/train/head.py: on demand whatever the nodes are).
        for node in [*map(str, range(self.count)), HEAD_NODE]:
            tags = {"aws:cloudformation:stack-id": self.stack_id, **self.tags(), NODE_TAG: node}
            self.ec2.run_instances(
                ImageId=IMAGE,
                MinCount=1,
                MaxCount=1,
                SubnetId=self.subnet,
                TagSpecifications=[{"ResourceType": "instance", "Tags": as_tags(tags)}],
                **(self.market() if node != HEAD_NODE else {}),
            )

    def tags(self) -> dict[str, str]:
        return {"Project": "horovod-fleet", FLEET_TAG: self.stack_id}

    def market(self) -> dict:
        return {"InstanceMarketOptions": {"MarketType": "spot"}} if self.spot else {}

    def template(self) -> str:
        """The replacement launch template (stacks/train/fleet.py): the fleet's tags and no node
        index, which the controller tags and assigns after the launch; the relaunch puts the
        zone's subnet and placement group on the launch itself."""
        data = {
            "ImageId": IMAGE,
            "InstanceType": "p4d.24xlarge",
            "TagSpecifications": [{"ResourceType": "instance", "Tags": as_tags(self.tags())}],
            **self.market(),
        }
        created = self.ec2.create_launch_template(
            LaunchTemplateName="node-replacement", LaunchTemplateData=data
        )
        return created["LaunchTemplate"]["LaunchTemplateId"]

    def head_template(self) -> str:
        """The head's own launch template (stacks/train/head.py): the head's tags, the fleet's
        subnet; the controller launches the head from it when EC2 ended the head's instance."""
        tags = {**self.tags(), NODE_TAG: HEAD_NODE}
        data = {
            "ImageId": IMAGE,
            "InstanceType": "c6i.xlarge",
            "NetworkInterfaces": [{"DeviceIndex": 0, "SubnetId": self.subnet}],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": as_tags(tags)}],
        }
        created = self.ec2.create_launch_template(
            LaunchTemplateName="head-replacement", LaunchTemplateData=data
        )
        return created["LaunchTemplate"]["LaunchTemplateId"]

    def head(self) -> str | None:
        """The head's instance now: the newest launched of those tagged as the head that run."""
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": f"tag:{FLEET_TAG}", "Values": [self.stack_id]},
                {"Name": f"tag:{NODE_TAG}", "Values": [HEAD_NODE]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )
        found = [i for p in pages for r in p["Reservations"] for i in r["Instances"]]
        newest = max(found, key=lambda i: i["LaunchTime"], default=None)
        return newest["InstanceId"] if newest else None

    def terminate_head(self) -> str:
        """EC2 ends the head's instance (its host is gone); returns its id."""
        head = self.head()
        self.ec2.terminate_instances(InstanceIds=[head])
        return head

    def instances(self) -> dict[int, str]:
        """The instance serving each node index now."""
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": f"tag:{FLEET_TAG}", "Values": [self.stack_id]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )
        found = {}
        for instance in (i for p in pages for r in p["Reservations"] for i in r["Instances"]):
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            if tags.get(NODE_TAG, "").isdigit():  # not the head, nor one not yet tagged
                found[int(tags[NODE_TAG])] = instance["InstanceId"]
        return found

    def joined(self, attempt: int) -> dict[int, str]:
        """The nodes the tick replaced while `attempt` goes on (an elastic fleet's lost node:
        stacks/teardown/controller/decide.py replace_lost), each with its new instance, once;
        nothing once the attempt is recorded (a relaunch's instances are `decided`'s)."""
        if any(e.get("attempt") == attempt for e in self.attempts()) or self.workflow_busy():
            return {}
        now = self.instances()
        new = {i: node for i, node in now.items() if self.before.get(i) not in (None, node)}
        new |= {i: node for i, node in now.items() if i not in self.before}
        self.before.update(new)
        return new

    # --- the run controller -----------------------------------------------------------------

    def watch(self) -> None:
        """From now on, what the controller does to the fleet is counted (decided)."""
        self.before, self.started[:], self.rebooted[:] = self.instances(), [], []
        self.head_before = self.head()
        self.known = len(self.attempts())

    def decided(self, attempt: int) -> Relaunch | None:
        """What the run controller did with `attempt` once it is over: its decisions (the
        attempts.json entries since `watch`), the nodes whose instance it stopped and started
        again, the instance it launched for each node it replaced; None while the attempt is
        under way or its action runs."""
        entries = self.attempts()[self.known :]
        if not any(e.get("attempt") == attempt for e in entries):
            return None
        if self.workflow_busy() or not self.chain_ended(attempt):
            return None
        after, head = self.instances(), self.head()
        launched = {i: node for i, node in after.items() if self.before.get(i) != node}
        kept = {i: node for i, node in after.items() if i not in launched}
        return Relaunch(
            entries=entries,
            rebooted=sorted(i for i, node in kept.items() if node in self.rebooted),
            started=sorted(i for i, node in kept.items() if node in self.started),
            launched=launched,
            head=(
                "replaced" if head != self.head_before
                else "started" if head in self.started
                else "rebooted" if head in self.rebooted
                else None
            ),
            head_instance=head,
        )  # fmt: skip

    def workflow_busy(self) -> bool:
        """An execution under way: RUNNING, or listed with no status yet. moto lists an
        execution before it marks it RUNNING (moto/stepfunctions/parser/models.py
        start_execution appends it, then builds its worker, then start() sets the status); a
        `statusFilter=RUNNING` listing misses it in between, and the rehearsal took a relaunch
        whose instances were not started yet for one that brought no node back."""
        return any(e.get("status") not in FINISHED for e in self.workflow.executions())

    def chain_ended(self, attempt: int) -> bool:
        """Whether the execution of `attempt`'s end ran (the tick starts it right after the
        record, so a moment may pass between them)."""
        prefix = f"{RUN}-a{attempt}-"
        return any(e["name"].startswith(prefix) for e in self.workflow.executions())

    def gone(self) -> bool:
        """Whether TrainStack was deleted (the run's end was torn down)."""
        cloudformation = boto3.client("cloudformation", region_name=REGION)
        try:
            [stack] = cloudformation.describe_stacks(StackName=self.stack_id)["Stacks"]
        except cloudformation.exceptions.ClientError:
            return True
        return stack["StackStatus"] == "DELETE_COMPLETE"

    def attempts(self) -> list[dict]:
        """attempts.json's entries (docs/contracts.md), read as the rehearsal."""
        try:
            body = self.s3.get_object(Bucket=BUCKET, Key=f"runs/{RUN}/attempts.json")["Body"]
        except self.s3.exceptions.NoSuchKey:
            return []
        return json.loads(body.read())["attempts"]


def as_tags(tags: dict[str, str]) -> list[dict]:
    return [{"Key": key, "Value": value} for key, value in tags.items()]


def done_event(bucket: str, run: str) -> dict:
    """EventBridge's "Object Created" for the run's DONE.json, as S3 sends it with EventBridge
    notifications on (https://docs.aws.amazon.com/AmazonS3/latest/userguide/ev-events.html)."""
    return {
        "version": "0",
        "detail-type": "Object Created",
        "source": "aws.s3",
        "region": REGION,
        "detail": {
            "bucket": {"name": bucket},
            "object": {"key": f"runs/{run}/DONE.json", "etag": "e1", "sequencer": "01"},
            "reason": "PutObject",
        },
    }
