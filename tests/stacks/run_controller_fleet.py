"""A deployed TrainStack in moto as the run controller finds it (stacks/train/, docs/contracts.md):
its tags and outputs, a subnet per zone, the replacement template, its nodes; the EC2 answers
moto does not give (no capacity in a zone, a stop refused while a node is pending, a launch
repeated with its ClientToken); the tick as its schedule runs it, on a
clock the tests move; and the triggers' events as EventBridge and CloudWatch deliver them."""

import datetime
import functools
import json

import boto3
import clients
import pytest
import tick
from botocore.exceptions import ClientError
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import Instance, InstanceBackend

from rehearsal import cloud

REGION = "us-east-1"
BUCKET = f"horovod-fleet-{DEFAULT_ACCOUNT_ID}-{REGION}"
RUN = "resnet50-r1"
ZONES = ("us-east-1a", "us-east-1b")
FLEET_TAG, NODE_TAG = "horovod-fleet:stack", "horovod-fleet:node"
CARDS = 2  # EFA interfaces per node in the template


# One client per service for the session: moto's mock serves any client, whenever it was made,
# and making one parses its service model again.
@functools.cache
def ec2():
    return boto3.client("ec2", region_name=REGION)


@functools.cache
def s3():
    return boto3.client("s3", region_name=REGION)


@functools.cache
def cloudformation():
    return boto3.client("cloudformation", region_name=REGION)


class Fleet:
    """TrainStack with `nodes` nodes, on-demand or Spot, zones made at deploy (`zones`: its
    HorovodFleetZones output; None for a stack from before it), the hard cap `hours` ahead."""

    def __init__(self, nodes=2, spot=False, zones=ZONES, hours=6.0, max_restarts=3, run=RUN,
                 creating=False, heartbeat_s=120, grace_s=2400, head=False, min_nodes=None):  # fmt: skip
        self.count, self.spot, self.zone_names, self.run = nodes, spot, zones, run
        s3().create_bucket(Bucket=BUCKET)
        placeholder = {"Resources": {"Handle": {"Type": "AWS::SNS::Topic"}}}
        # The stack-level tags stacks/train/stack.py sets, which CreateStack carries.
        self.tags = {"horovod-fleet:run": run, "horovod-fleet:nodes": str(nodes),
                     "horovod-fleet:heartbeatTimeoutS": str(heartbeat_s),
                     "horovod-fleet:startupGraceS": str(grace_s)}  # fmt: skip
        self.stack_id = cloudformation().create_stack(
            StackName="TrainStack",
            TemplateBody=json.dumps(placeholder),
            Tags=[{"Key": k, "Value": v} for k, v in self.tags.items()],
        )["StackId"]
        vpc = ec2().create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
        self.subnets = {
            zone: ec2().create_subnet(
                VpcId=vpc, CidrBlock=f"10.42.{16 * i}.0/20", AvailabilityZone=zone
            )["Subnet"]["SubnetId"]
            for i, zone in enumerate(ZONES)
        }
        group = ec2().create_security_group(GroupName="fleet", Description="fleet", VpcId=vpc)
        self.security_group = group["GroupId"]
        self.template = self.replacement_template()
        self.head_template = self.head_launch_template() if head else None
        deadline = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=hours)
        outputs = {
            "HorovodFleetRun": run,
            "HorovodFleetMaxRestarts": str(max_restarts),
            "HorovodFleetDeadline": f"{deadline:%Y-%m-%dT%H:%M:%S}Z",
            "HorovodFleetReplacementTemplate": self.template,
            "HorovodFleetNodes": str(nodes),
        }
        if head:  # an elastic fleet (stacks/train/head.py)
            outputs["HorovodFleetMinNodes"] = str(min_nodes or max(1, nodes - 1))
            outputs["HorovodFleetHeadTemplate"] = self.head_template
        if zones:
            entries = [
                {"zone": z, "subnet": self.subnets[z], "group": f"TrainStack-group-{z}"}
                for z in zones
            ]
            outputs["HorovodFleetZones"] = json.dumps({"zones": entries})
        self.outputs = outputs
        if creating:  # no outputs yet: CloudFormation writes them once the create is over
            self.set_stack_status("CREATE_IN_PROGRESS")
        else:
            self.update_outputs(outputs)
        self.nodes = [self.launch_node(index) for index in range(nodes)]
        self.head = self.launch_node("head", spot=False) if head else None

    def replacement_template(self) -> str:
        tags = [
            {"Key": "Project", "Value": "horovod-fleet"},
            {"Key": FLEET_TAG, "Value": self.stack_id},
        ]
        data = {
            "ImageId": "ami-12c6146b",
            "InstanceType": "p4d.24xlarge",
            "NetworkInterfaces": [
                {
                    "DeviceIndex": 0 if card == 0 else 1,
                    "NetworkCardIndex": card,
                    "InterfaceType": "efa",
                    "SubnetId": self.subnets[ZONES[0]],
                    "Groups": [self.security_group],
                    "DeleteOnTermination": True,
                }
                for card in range(CARDS)
            ],
            "Placement": {"GroupName": f"TrainStack-group-{ZONES[0]}"},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        }
        if self.spot:
            data["InstanceMarketOptions"] = {"MarketType": "spot"}
        created = ec2().create_launch_template(
            LaunchTemplateName="node-replacement", LaunchTemplateData=data
        )
        return created["LaunchTemplate"]["LaunchTemplateId"]

    def head_launch_template(self) -> str:
        """The head's own template (stacks/train/head.py HeadReplacement): its type, the fleet's
        subnet and group in the deployed zone, no placement group, the head's tags."""
        tags = [
            {"Key": "Project", "Value": "horovod-fleet"},
            {"Key": FLEET_TAG, "Value": self.stack_id},
            {"Key": NODE_TAG, "Value": "head"},
        ]
        data = {
            "ImageId": "ami-12c6146b",
            "InstanceType": "c6i.xlarge",
            "NetworkInterfaces": [
                {
                    "DeviceIndex": 0,
                    "SubnetId": self.subnets[ZONES[0]],
                    "Groups": [self.security_group],
                    "DeleteOnTermination": True,
                }
            ],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        }
        created = ec2().create_launch_template(
            LaunchTemplateName="head-replacement", LaunchTemplateData=data
        )
        return created["LaunchTemplate"]["LaunchTemplateId"]

    def update_outputs(self, outputs: dict[str, str]) -> None:
        template = {
            "Resources": {"Handle": {"Type": "AWS::SNS::Topic"}},
            "Outputs": {key: {"Value": value} for key, value in outputs.items()},
        }
        cloudformation().update_stack(
            StackName="TrainStack",
            TemplateBody=json.dumps(template),
            Tags=[{"Key": k, "Value": v} for k, v in self.tags.items()],
        )

    def created(self) -> None:
        """The create is over: the outputs are there, the stack CREATE_COMPLETE."""
        self.update_outputs(self.outputs)
        self.set_stack_status("CREATE_COMPLETE")

    def launch_node(self, index: int | str, spot: bool | None = None) -> str:
        """Node `index` (or the head) as CloudFormation launched it: CloudFormation's tag and
        the fleet's; the head is on demand whatever the fleet's market."""
        tags = {
            "aws:cloudformation:stack-id": self.stack_id,
            "Project": "horovod-fleet",
            FLEET_TAG: self.stack_id,
            NODE_TAG: str(index),
        }
        spot = self.spot if spot is None else spot
        market = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
        reservation = ec2().run_instances(
            ImageId="ami-12c6146b",
            MinCount=1,
            MaxCount=1,
            SubnetId=self.subnets[ZONES[0]],
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ],
            **market,
        )
        return reservation["Instances"][0]["InstanceId"]

    def instances(self, states=("pending", "running", "stopping", "stopped")) -> list[dict]:
        """The fleet's instances in `states`: id, state, node (None before the controller tagged
        it), zone, whether CloudFormation's."""
        pages = (
            ec2()
            .get_paginator("describe_instances")
            .paginate(
                Filters=[
                    {"Name": f"tag:{FLEET_TAG}", "Values": [self.stack_id]},
                    {"Name": "instance-state-name", "Values": list(states)},
                ]
            )
        )
        found = []
        for instance in (i for p in pages for r in p["Reservations"] for i in r["Instances"]):
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            found.append(
                {
                    "id": instance["InstanceId"],
                    "state": instance["State"]["Name"],
                    "node": (
                        int(tags[NODE_TAG])
                        if tags.get(NODE_TAG, "head") != "head"
                        else tags.get(NODE_TAG)
                    ),
                    "zone": instance["Placement"]["AvailabilityZone"],
                    "cloudformation": "aws:cloudformation:stack-id" in tags,
                }
            )
        # Node indexes in order, then the head, then what the controller has not tagged yet.
        rank = {"head": 1, None: 2}
        return sorted(found, key=lambda n: (rank.get(n["node"], 0), n["node"] if isinstance(n["node"], int) else 0, n["id"]))  # fmt: skip

    def billing(self) -> list[dict]:
        return self.instances(states=("pending", "running"))

    def stack_status(self) -> str:
        stacks = cloudformation().describe_stacks(StackName=self.stack_id)["Stacks"]
        return stacks[0]["StackStatus"]

    def set_stack_status(self, status: str) -> None:
        from moto.cloudformation.models import cloudformation_backends

        backend = cloudformation_backends[DEFAULT_ACCOUNT_ID][REGION]
        backend.stacks[self.stack_id].status = status

    def fail(self, cause: str = "node_lost", attempt: int = 1, status: str = "failed") -> None:
        """The leader's DONE.json for an attempt that failed with `cause`, and its logs."""
        done = {"run": self.run, "status": status, "cause": cause, "attempt": attempt,
                "reason": f"{cause} in attempt {attempt}"}  # fmt: skip
        put_json(f"runs/{self.run}/DONE.json", done)
        s3().put_object(Bucket=BUCKET, Key=f"runs/{self.run}/logs/node-0.log", Body=b"log")

    def beat(self, *indexes: int) -> None:
        """The nodes' heartbeats: each rewrites its registration (S3 stamps LastModified); and
        the head's, when there is one."""
        for index in indexes or range(self.count):
            put_json(f"runs/{self.run}/nodes/{index}.json", {"index": index})
        if self.head is not None:
            put_json(f"runs/{self.run}/head.json", {"instance_id": self.head})


def put_json(key: str, document: dict) -> None:
    s3().put_object(Bucket=BUCKET, Key=key, Body=json.dumps(document).encode())


def read_json(key: str) -> dict | None:
    try:
        return json.loads(s3().get_object(Bucket=BUCKET, Key=key)["Body"].read())
    except s3().exceptions.NoSuchKey:
        return None


def backend_instance(instance_id: str):
    return ec2_backends[DEFAULT_ACCOUNT_ID][REGION].get_instance(instance_id)


class Ticks:
    """The run controller's tick as its schedule runs it, on a clock the test moves: each tick
    at real time plus `offset` (moto stamps what it makes with real time), then every execution
    it started runs to its end or its next wait."""

    def __init__(self, workflow, monkeypatch) -> None:
        self.workflow, self.offset = workflow, datetime.timedelta(0)
        for module in ("tick", "steps", "steps_fleet", "steps_teardown"):
            monkeypatch.setattr(f"{module}.now", self.now)
        # What S3 and CloudFormation stamp (a heartbeat's LastModified, a stack event) is on the
        # same clock.
        for stamps in ("moto.s3.models.utcnow", "moto.cloudformation.models.utcnow"):
            monkeypatch.setattr(stamps, lambda: self.now().replace(tzinfo=None))
        self.decisions: list[dict] = []

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.timezone.utc) + self.offset

    def advance(self, **delta) -> None:
        self.offset += datetime.timedelta(**delta)

    def minutes(self, count: int, fleet: "Fleet | None" = None, every: int = 1) -> None:
        """`count` minutes of the schedule's ticks, one in `every` of them run (what a tick
        reads does not change in between); the nodes of `fleet` beat before each."""
        for _ in range(0, count, every):
            self.advance(minutes=every)
            if fleet is not None:
                fleet.beat()
            self()

    def __call__(self, event: dict | None = None) -> dict:
        decision = tick.handler(event or {"trigger": "schedule"})
        self.decisions.append(decision)
        self.workflow.settle()
        return decision

    def until_quiet(self, most: int = 12) -> list[dict]:
        """Tick until a tick has nothing to do and nothing runs; the ticks' decisions."""
        made = []
        for _ in range(most):
            made.append(self())
            if not made[-1]["actions"] and not self.workflow.running():
                return made
        raise AssertionError(f"still acting after {most} ticks: {made[-3:]}")


@pytest.fixture
def ticks(workflow, monkeypatch) -> Ticks:
    return Ticks(workflow, monkeypatch)


class Ec2Answers:
    """EC2's answers moto does not give. `full`: zone -> the capacity code RunInstances and
    StartInstances answer there (for `full_tries` calls, then capacity again); `capacity`:
    zone -> how many more instances EC2 has there, a RunInstances for more launching none
    (InsufficientInstanceCapacity); `pending`: instance -> how many stops EC2 refuses before it
    has reached `running`; `impaired`: instance -> the status check that fails on it ("system"
    or "instance"; moto's always pass), `schedule` an event on an instance (moto schedules
    none), and `reboots`: every instance RebootInstances rebooted, in order (moto would reboot
    a stopped instance into `running`, which EC2 refuses: a reboot of one here fails the test). A RunInstances repeated with its ClientToken gets its first answer
    again, which moto does not do ("If you repeat the request with the same client token, the
    same response is returned", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Run_Instance_Idempotency.html)."""

    def __init__(self, monkeypatch, fleet: Fleet) -> None:
        self.fleet = fleet
        self.full: dict[str, str] = {}
        self.capacity: dict[str, int] = {}
        self.reservations: dict[str, tuple[int, object]] = {}  # ClientToken -> (count, answer)
        self.full_tries: int | None = None
        self.refused_operations = ("RunInstances", "StartInstances")
        self.refused_launches = 0
        self.pending: dict[str, int] = {}
        self.stops_refused: list[str] = []
        self.impaired: dict[str, str] = {}
        self.reboots: list[str] = []
        real_run, real_start = InstanceBackend.run_instances, InstanceBackend.start_instances
        real_stop, real_reboot = InstanceBackend.stop_instances, InstanceBackend.reboot_instances
        answers = self

        def run_instances(backend, image_id, count, user_data, groups, **kwargs):
            token = kwargs.get("client_token")
            if token in answers.reservations:
                first_count, reservation = answers.reservations[token]
                if first_count != count:
                    raise EC2ClientError("IdempotentParameterMismatch", f"token {token}")
                return reservation
            template = (kwargs.get("launch_template") or {}).get("LaunchTemplateId")
            if template and not backend.describe_launch_templates(template_ids=[template]):
                # moto fails with an IndexError on a template deleted since; EC2 answers so.
                raise EC2ClientError(
                    "InvalidLaunchTemplateId.NotFound",
                    f"The specified launch template, with template ID {template}, does not exist.",
                )
            subnet = answers.subnet_of(backend, kwargs)
            zone = backend.get_subnet(subnet).availability_zone
            answers.refuse(zone, "RunInstances")
            if count > answers.capacity.get(zone, count):
                raise EC2ClientError(
                    "InsufficientInstanceCapacity",
                    f"{answers.capacity[zone]} p4d.24xlarge in {zone}, {count} asked for",
                )
            if zone in answers.capacity:
                answers.capacity[zone] -= count
            if not kwargs.get("nics"):  # moto leaves a template's interfaces out
                kwargs["nics"] = [{"DeviceIndex": 0, "SubnetId": subnet}]
            reservation = real_run(backend, image_id, count, user_data, groups, **kwargs)
            if token != "ABCDE":  # moto's own token for a request without one
                answers.reservations[token] = (count, reservation)
            return reservation

        def start_instances(backend, instance_ids):
            for instance_id in instance_ids:
                answers.refuse(backend.get_instance(instance_id)._placement.zone, "StartInstances")
            for instance_id in instance_ids:  # a stop and start moves it to a healthy host
                answers.impaired.pop(instance_id, None)
            return real_start(backend, instance_ids)

        def stop_instances(backend, instance_ids):
            for instance_id in instance_ids:
                left = answers.pending.get(instance_id, 0)
                if left:
                    answers.pending[instance_id] = left - 1
                    answers.stops_refused.append(instance_id)
                    if left == 1:  # booted: the next stop finds it running
                        backend.get_instance(instance_id)._state.name = "running"
                        backend.get_instance(instance_id)._state.code = 16
                    raise EC2ClientError(
                        "IncorrectInstanceState",
                        f"Instance '{instance_id}' cannot be stopped as it has never reached "
                        "the 'running' state.",
                    )
            return real_stop(backend, instance_ids)

        def reboot_instances(backend, instance_ids):
            for instance_id in instance_ids:
                state = backend.get_instance(instance_id).state
                assert state == "running", f"rebooted {instance_id} while {state}"
            answers.reboots.extend(instance_ids)
            return real_reboot(backend, instance_ids)

        def status_check(kind: str):
            real = getattr(Instance, f"{kind}_status")

            def status(instance):
                if answers.impaired.get(instance.id) == kind and instance.state == "running":
                    return {"Status": "impaired"}
                return real.fget(instance)

            return property(status)

        monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)
        monkeypatch.setattr(InstanceBackend, "start_instances", start_instances)
        monkeypatch.setattr(InstanceBackend, "stop_instances", stop_instances)
        monkeypatch.setattr(InstanceBackend, "reboot_instances", reboot_instances)
        for kind in ("instance", "system"):
            monkeypatch.setattr(Instance, f"{kind}_status", status_check(kind))

    def refuse(self, zone: str, operation: str) -> None:
        if zone not in self.full or operation not in self.refused_operations:
            return
        if self.full_tries is not None and self.refused_launches >= self.full_tries:
            return
        self.refused_launches += 1
        raise EC2ClientError(self.full[zone], f"no p4d.24xlarge capacity in {zone} ({operation})")

    @staticmethod
    def subnet_of(backend, kwargs: dict) -> str:
        if kwargs.get("nics"):
            return kwargs["nics"][0]["SubnetId"]
        if kwargs.get("subnet_id"):
            return kwargs["subnet_id"]
        template = backend._get_template_from_args(kwargs["launch_template"]).data
        return template["NetworkInterfaces"][0]["SubnetId"]

    @staticmethod
    def schedule(instance_id: str, code: str, completed: bool = False) -> None:
        """EC2 schedules `code` (instance-retirement, system-reboot, ...) for the instance; a
        completed one is still described for a week, "[Completed]" first (API_InstanceStatusEvent)."""
        described = ("[Completed] " if completed else "") + f"{code} scheduled"
        backend_instance(instance_id).events = [{"Code": code, "Description": described}]

    def make_pending(self, instance_id: str, refusals: int) -> None:
        """The node is pending, and EC2 refuses `refusals` stops before it is running."""
        instance = backend_instance(instance_id)
        instance._state.name, instance._state.code = "pending", 0
        self.pending[instance_id] = refusals


class RefusedReads:
    """S3 refuses every read of the run's records (runs/<run>/: GetObject, HeadObject, a listing
    under it) with 403 AccessDenied, as a permission or a KMS key the controller's role lost
    would: every AWS call of the tick and the steps goes through clients.client("s3")."""

    READS = ("GetObject", "HeadObject", "ListObjectsV2", "ListObjects")

    def __init__(self, run: str = RUN) -> None:
        self.prefix = f"runs/{run}/"
        self.refused: list[str] = []

    def refuse(self, params, model, **_) -> None:
        where = params.get("Key") or params.get("Prefix") or ""
        if where.startswith(self.prefix):
            self.refused.append(f"{model.name} {where}")
            raise ClientError(
                {"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, model.name
            )

    def __enter__(self) -> "RefusedReads":
        for operation in self.READS:
            clients.client("s3").meta.events.register(
                f"provide-client-params.s3.{operation}", self.refuse
            )
        return self

    def __exit__(self, *_) -> None:
        for operation in self.READS:
            clients.client("s3").meta.events.unregister(
                f"provide-client-params.s3.{operation}", self.refuse
            )


# --- the triggers' events ----------------------------------------------------------------------


def done_event(run: str = RUN) -> dict:
    return cloud.done_event(BUCKET, run)


def state_change_event(instance_id: str, state: str) -> dict:
    """https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instance-state-changes.html"""
    return {
        "version": "0",
        "detail-type": "EC2 Instance State-change Notification",
        "source": "aws.ec2",
        "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}:{DEFAULT_ACCOUNT_ID}:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "state": state},
    }


def spot_warning_event(instance_id: str) -> dict:
    """https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html"""
    return {
        "version": "0",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}:{DEFAULT_ACCOUNT_ID}:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "instance-action": "terminate"},
    }


def alarm_event(run: str = RUN, at: str = "2026-11-22T04:30:00.000+0000") -> dict:
    """The idle alarm's Lambda action."""
    name = f"horovod-fleet-idle-{run}"
    return {
        "source": "aws.cloudwatch",
        "alarmArn": f"arn:aws:cloudwatch:{REGION}:{DEFAULT_ACCOUNT_ID}:alarm:{name}",
        "region": REGION,
        "alarmData": {
            "alarmName": name,
            "state": {"value": "ALARM", "reason": "Threshold Crossed", "timestamp": at},
            "configuration": {
                "metrics": [{"metricStat": {"metric": {"dimensions": {"Run": run}}}}]
            },
        },
    }


def set_idle_alarm(run: str, state: str) -> None:
    cloudwatch = clients.client("cloudwatch")
    name = f"horovod-fleet-idle-{run}"
    if not cloudwatch.describe_alarms(AlarmNames=[name])["MetricAlarms"]:
        cloudwatch.put_metric_alarm(
            AlarmName=name,
            Namespace="HorovodFleet",
            MetricName="nvidia_smi_utilization_gpu",
            Dimensions=[{"Name": "Run", "Value": run}],
            Statistic="Average",
            Period=300,
            EvaluationPeriods=6,
            Threshold=5,
            ComparisonOperator="LessThanThreshold",
        )
    cloudwatch.set_alarm_state(AlarmName=name, StateValue=state, StateReason="test")


CAP_EVENT = {"trigger": "hard-cap", "run": RUN}
