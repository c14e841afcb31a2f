"""The run controller's zone move against moto: a relaunch that finds no capacity in the fleet's
zone moves the whole fleet to the next zone that offers the type, and gives up in one line
after every zone has refused it for CAPACITY_ROUNDS rounds.

moto has no placement groups and launches from a template without its interfaces, so two fakes
stand in: a recorder of the placement group calls, and a RunInstances that honours the version's
interfaces (moto puts an instance in its subnet's zone when they are given as a parameter) and
answers InsufficientInstanceCapacity in the zones the test names."""

import datetime
import json

import boto3
import pytest
from botocore.exceptions import ClientError

# ruff: noqa: F811  (the tests take the fixtures aws and reaper, imported from test_reaper)
from test_reaper import (  # noqa: F401  (aws and reaper are fixtures)
    BUCKET,
    NOW,
    REGION,
    RUN,
    aws,
    decisions,
    fleet_tags,
    reaper,
    s3_event,
    schedules,
    stack_status,
    train_stack_id,
)

from stacks.network import MOVE_CIDRS
from stacks.teardown.names import REPLACEMENTS_OUTPUT_KEY as REPLACEMENTS
from stacks.teardown.names import ZONE_MOVE_OUTPUT_KEY, ZONE_TAG
from stacks.teardown.reaper import handler as reaper_module
from stacks.teardown.reaper import zone_move

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
NODE_LOST = "step 'training' failed: RuntimeError: node 1 (i-0abc, 10.42.0.12) lost: no heartbeat"
CARDS = 4  # p4d.24xlarge: one EFA per network card


def ec2():
    return boto3.client("ec2", region_name=REGION)


def deploy(nodes: int, spot: bool, zones: list[str] | None, deadline: str = "2026-11-22T12:00:00Z"):
    """TrainStack as stacks/train/stack.py deploys it: a VPC with the fleet's subnet in the first
    zone and its route table, a replacement template per node with every EFA card in that
    subnet and the fleet's placement group, its nodes, and its outputs (the move plan when
    `zones`). Returns the route table, the fleet's subnet and the nodes' instance ids."""
    client = ec2()
    stack_id = train_stack_id()
    vpc = client.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnet = client.create_subnet(VpcId=vpc, CidrBlock="10.42.0.0/20", AvailabilityZone=ZONES[0])
    subnet = subnet["Subnet"]["SubnetId"]
    table = client.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    client.associate_route_table(RouteTableId=table, SubnetId=subnet)
    group = client.create_security_group(GroupName="fleet", Description="fleet", VpcId=vpc)
    templates = []
    for index in range(nodes):
        tags = fleet_tags(stack_id, index)
        interfaces = [
            {
                "DeviceIndex": 0 if card == 0 else 1,
                "NetworkCardIndex": card,
                "InterfaceType": "efa",
                "SubnetId": subnet,
                "Groups": [group["GroupId"]],
                "DeleteOnTermination": True,
            }
            for card in range(CARDS)
        ]
        created = client.create_launch_template(
            LaunchTemplateName=f"node{index}",
            LaunchTemplateData={
                "ImageId": "ami-12c6146b",
                "InstanceType": "p4d.24xlarge",
                "NetworkInterfaces": interfaces,
                "Placement": {"GroupName": "TrainStack-FleetPlacementGroup"},
                "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
            },
        )
        templates.append(created["LaunchTemplate"]["LaunchTemplateId"])
    outputs = {
        "HorovodFleetRun": {"Value": RUN},
        "HorovodFleetMaxRestarts": {"Value": "3"},
        "HorovodFleetDeadline": {"Value": deadline},
        "HorovodFleetReplacementTemplates": {"Value": ",".join(templates)},
    }
    if zones:
        plan = {"zones": ",".join(zones), "vpc": vpc, "route_table": table, "cidrs": MOVE_CIDRS}
        outputs[ZONE_MOVE_OUTPUT_KEY] = {"Value": json.dumps(plan)}
    template = {"Resources": {"Handle": {"Type": "AWS::SNS::Topic"}}, "Outputs": outputs}
    boto3.client("cloudformation", region_name=REGION).update_stack(
        StackName="TrainStack", TemplateBody=json.dumps(template)
    )
    nodes_ids = []
    for index in range(nodes):
        tags = {
            "aws:cloudformation:stack-id": stack_id,
            "Project": "horovod-fleet",
            "horovod-fleet:stack": stack_id,
            "horovod-fleet:node": str(index),
        }
        market = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
        reservation = client.run_instances(
            ImageId="ami-12c6146b",
            MinCount=1,
            MaxCount=1,
            SubnetId=subnet,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ],
            **market,
        )
        nodes_ids.append(reservation["Instances"][0]["InstanceId"])
    return table, subnet, nodes_ids


class Ec2Capacity:
    """EC2's answers where moto has none: placement groups, capacity, a version's interfaces."""

    def __init__(self, reaper, monkeypatch, full: set[str]):
        self.full = full  # the zones without capacity
        self.groups: dict[str, dict] = {}
        self.launches: list[dict] = []
        self.versions: list[dict] = []
        real = {name: getattr(reaper.ec2, name) for name in ("run_instances", "start_instances")}
        self.real, self.client = real, reaper.ec2
        create_version = reaper.ec2.create_launch_template_version

        def record_version(**kwargs):
            # moto ignores SourceVersion; EC2 inherits the source version's data, and what the
            # request gives overwrites it (API_CreateLaunchTemplateVersion.html).
            self.versions.append(dict(kwargs))
            source = kwargs.pop("SourceVersion")
            [base] = self.client.describe_launch_template_versions(
                LaunchTemplateId=kwargs["LaunchTemplateId"], Versions=[source]
            )["LaunchTemplateVersions"]
            data = {**base["LaunchTemplateData"], **kwargs.pop("LaunchTemplateData")}
            return create_version(**kwargs, LaunchTemplateData=data)

        for name, fake in {
            "create_placement_group": self.create_placement_group,
            "delete_placement_group": self.delete_placement_group,
            "run_instances": self.run_instances,
            "start_instances": self.start_instances,
            "create_launch_template_version": record_version,
        }.items():
            monkeypatch.setattr(reaper.ec2, name, fake)

    @staticmethod
    def refuse(operation: str, zone: str):
        message = f"We currently do not have sufficient p4d.24xlarge capacity in {zone}."
        error = {"Code": "InsufficientInstanceCapacity", "Message": message}
        raise ClientError({"Error": error}, operation)

    def create_placement_group(self, GroupName, Strategy, TagSpecifications):
        if GroupName in self.groups:
            error = {"Code": "InvalidPlacementGroup.Duplicate", "Message": "exists"}
            raise ClientError({"Error": error}, "CreatePlacementGroup")
        self.groups[GroupName] = {"Strategy": Strategy, "Tags": TagSpecifications[0]["Tags"]}

    def delete_placement_group(self, GroupName):
        if self.groups.pop(GroupName, None) is None:
            error = {"Code": "InvalidPlacementGroup.Unknown", "Message": "no such group"}
            raise ClientError({"Error": error}, "DeletePlacementGroup")

    def start_instances(self, InstanceIds):
        zones = {zone_of(i) for i in InstanceIds}
        if zones & self.full:
            self.refuse("StartInstances", min(zones & self.full))
        return self.real["start_instances"](InstanceIds=InstanceIds)

    def run_instances(self, **kwargs):
        self.launches.append(kwargs)
        template = kwargs["LaunchTemplate"]
        [version] = self.client.describe_launch_template_versions(
            LaunchTemplateId=template["LaunchTemplateId"], Versions=[template["Version"]]
        )["LaunchTemplateVersions"]
        [subnet] = {i["SubnetId"] for i in version["LaunchTemplateData"]["NetworkInterfaces"]}
        zone = self.client.describe_subnets(SubnetIds=[subnet])["Subnets"][0]["AvailabilityZone"]
        if zone in self.full:
            self.refuse("RunInstances", zone)
        interfaces = [{"DeviceIndex": 0, "SubnetId": subnet}]
        return self.real["run_instances"](**kwargs, NetworkInterfaces=interfaces)


def zone_of(instance: str) -> str:
    [reservation] = ec2().describe_instances(InstanceIds=[instance])["Reservations"]
    return reservation["Instances"][0]["Placement"]["AvailabilityZone"]


def live_fleet(stack_id: str | None = None) -> dict[str, str]:
    """The fleet's live instances and their zones."""
    pages = (
        ec2()
        .get_paginator("describe_instances")
        .paginate(
            Filters=[
                {"Name": "tag:horovod-fleet:stack", "Values": [stack_id or train_stack_id()]},
                {"Name": "instance-state-name", "Values": ["pending", "running", "stopped"]},
            ]
        )
    )
    return {
        i["InstanceId"]: i["Placement"]["AvailabilityZone"]
        for p in pages
        for r in p["Reservations"]
        for i in r["Instances"]
    }


def fail_attempt(reason: str = NODE_LOST) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    done = {"run": RUN, "status": "failed", "cause": "node_lost", "reason": reason, "attempt": 1}
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/DONE.json", Body=json.dumps(done).encode())
    s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/logs/node-0.log", Body=b"log")


def next_recheck() -> tuple[dict, datetime.datetime]:
    """The pending relaunch re-check and its time; removed, as Scheduler does once it fires."""
    client = boto3.client("scheduler", region_name=REGION)
    [schedule] = [
        s for s in schedules() if json.loads(s["Target"]["Input"])["reason"] == "relaunch"
    ]
    client.delete_schedule(Name=schedule["Name"])
    at = schedule["ScheduleExpression"].removeprefix("at(").removesuffix(")")
    moment = datetime.datetime.fromisoformat(at).replace(tzinfo=datetime.timezone.utc)
    return json.loads(schedule["Target"]["Input"]), moment


def moved_subnets() -> list[dict]:
    return ec2().describe_subnets(Filters=[{"Name": "tag-key", "Values": [ZONE_TAG]}])["Subnets"]


def templates() -> list[str]:
    outputs = boto3.client("cloudformation", region_name=REGION).describe_stacks(
        StackName="TrainStack"
    )["Stacks"][0]["Outputs"]
    [value] = [o["OutputValue"] for o in outputs if o["OutputKey"] == REPLACEMENTS]
    return value.split(",")


def update_templates(user_data: str) -> None:
    """What an update of TrainStack (cdk deploy -c maxHours=...) does to each template: a new
    version, without description, that is not the default (CloudFormation leaves it at 1)."""
    for template in templates():
        [first] = ec2().describe_launch_template_versions(
            LaunchTemplateId=template, Versions=["1"]
        )["LaunchTemplateVersions"]
        data = {**first["LaunchTemplateData"], "UserData": user_data}
        ec2().create_launch_template_version(LaunchTemplateId=template, LaunchTemplateData=data)


def test_no_capacity_in_its_zone_moves_the_whole_fleet_to_the_next(reaper, capsys, monkeypatch):
    table, fleet_subnet, nodes = deploy(2, spot=False, zones=ZONES)
    update_templates("IyEvYmluL2Jhc2gKIyBtYXhIb3VycyA4Cg==")
    capacity = Ec2Capacity(reaper, monkeypatch, full={ZONES[0]})
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    stopping = decisions(capsys)[-1]
    assert stopping["decision"] == "relaunch-stop" and stopping["zones"] == ZONES
    payload, _ = next_recheck()
    assert (payload["check"], payload["zones"]) == (1, ZONES)
    payload_of_first_try = payload
    reaper.handle(payload)  # the stopped nodes cannot start in us-east-1a
    [refused] = decisions(capsys)
    assert refused["decision"] == "relaunch-no-capacity"
    assert (refused["zone"], refused["next_zone"]) == (ZONES[0], ZONES[1])
    status = json.loads(
        boto3.client("s3", region_name=REGION)
        .get_object(Bucket=BUCKET, Key=f"runs/{RUN}/status.json")["Body"]
        .read()
    )
    assert status["phase"] == "relaunching"
    assert status["reason"].startswith(
        "waiting for capacity: InsufficientInstanceCapacity in us-east-1a (try 1 of 12); "
        "next try in us-east-1b at 2026-11-22T04:3"
    )
    payload, at = next_recheck()
    assert payload["check"] == 2 and at - NOW <= datetime.timedelta(minutes=2)  # at once
    reaper.handle(payload)  # the fleet leaves us-east-1a whole: its stopped nodes go
    [moving] = decisions(capsys)
    assert moving["decision"] == "relaunch-wait" and sorted(moving["moving"]) == sorted(nodes)
    last = next_recheck()[0]
    reaper.handle(last)
    [relaunched] = decisions(capsys)
    assert relaunched["decision"] == "relaunched" and relaunched["zone"] == ZONES[1]
    assert sorted(relaunched["replaced"]) == ["0", "1"]
    assert set(live_fleet().values()) == {ZONES[1]} and len(live_fleet()) == 2
    # The new zone's subnet: the next free block, routed by the fleet's own route table.
    [subnet] = moved_subnets()
    assert (subnet["AvailabilityZone"], subnet["CidrBlock"]) == (ZONES[1], MOVE_CIDRS[0])
    [routes] = ec2().describe_route_tables(RouteTableIds=[table])["RouteTables"]
    assert subnet["SubnetId"] in {a.get("SubnetId") for a in routes["Associations"]}
    # One cluster placement group there, and a version of each template naming both, from
    # the deployed version (CloudFormation's newest, not its default), every EFA card moved:
    # nothing else of the template is overridden.
    [group] = capacity.groups
    assert capacity.groups[group]["Strategy"] == "cluster" and ZONES[1] in group
    assert len(capacity.versions) == 2
    for version in capacity.versions:
        assert version["SourceVersion"] == "2"
        data = version["LaunchTemplateData"]
        assert set(data) == {"NetworkInterfaces", "Placement"}
        assert data["Placement"] == {"GroupName": group}
        cards = data["NetworkInterfaces"]
        assert [c["NetworkCardIndex"] for c in cards] == list(range(CARDS))
        assert {c["SubnetId"] for c in cards} == {subnet["SubnetId"]} != {fleet_subnet}
        assert all(c["InterfaceType"] == "efa" for c in cards)
    for launch in capacity.launches[-2:]:
        assert set(launch) == {"LaunchTemplate", "MinCount", "MaxCount", "ClientToken"}
        assert launch["LaunchTemplate"]["Version"] == "3"
        [moved] = ec2().describe_launch_template_versions(
            LaunchTemplateId=launch["LaunchTemplate"]["LaunchTemplateId"], Versions=["3"]
        )["LaunchTemplateVersions"]
        assert moved["LaunchTemplateData"]["UserData"] == "IyEvYmluL2Jhc2gKIyBtYXhIb3VycyA4Cg=="
    # Re-checks delivered again, late or twice, never touch the fleet that came back: the
    # first try's names us-east-1a, and the last one finds every node up.
    fleet = live_fleet()
    reaper.handle(payload_of_first_try)
    reaper.handle(last)
    assert [d["decision"] for d in decisions(capsys)] == ["relaunch-stale", "relaunched"]
    assert live_fleet() == fleet


def test_deleting_the_stack_removes_what_a_move_made(reaper, capsys, monkeypatch):
    from test_reaper import Replies, replacements_request

    table, _, _ = deploy(2, spot=True, zones=ZONES)
    capacity = Ec2Capacity(reaper, monkeypatch, full={ZONES[0]})
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    for _ in range(2):  # refused in us-east-1a, then launched in us-east-1b
        reaper.handle(next_recheck()[0])
    assert decisions(capsys)[-1]["decision"] == "relaunched"
    [moved] = moved_subnets()
    assert capacity.groups
    replies = Replies()
    monkeypatch.setattr(reaper_module.urllib.request, "urlopen", replies)
    reaper.handle(replacements_request("Delete"))
    assert [r["Status"] for r in replies.bodies] == ["SUCCESS"]
    assert live_fleet() == {}
    assert moved_subnets() == [] and capacity.groups == {}
    # Its route table association went first: one left would hold up the table's delete.
    [routes] = ec2().describe_route_tables(RouteTableIds=[table])["RouteTables"]
    assert moved["SubnetId"] not in {a.get("SubnetId") for a in routes["Associations"]}
    assert decisions(capsys)[-1]["moves_left"] == []


@pytest.mark.parametrize(
    ("zones", "waits"),
    [
        # Every zone in turn at once, then a wait twice as long after each round.
        (ZONES[:2], [0, 10, 0, 20, 0, 40, 0]),
        # A fleet whose zone is fixed (its own subnet, a reservation) tries its zone only.
        (None, [10, 20, 40]),
    ],
)
def test_every_zone_without_capacity_gives_up_in_one_line(
    reaper, capsys, monkeypatch, zones, waits
):
    deploy(2, spot=True, zones=zones)
    stack_id = train_stack_id()
    Ec2Capacity(reaper, monkeypatch, full=set(ZONES))
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    decisions(capsys)
    seen = []
    for _ in range(20):
        payload, _ = next_recheck()
        reaper.handle(payload)
        recorded = decisions(capsys)
        if recorded[0]["decision"] == "relaunch-gave-up":
            break
        if recorded[0]["decision"] == "relaunch-no-capacity":
            seen.append(round((next_recheck_time() - NOW).total_seconds() / 60, -1))
    assert seen == waits
    gave_up = recorded[0]
    tries = len(waits) + 1
    assert f"InsufficientInstanceCapacity on each of {tries} tries" in gave_up["reason"]
    done = json.loads(
        boto3.client("s3", region_name=REGION)
        .get_object(Bucket=BUCKET, Key=f"runs/{RUN}/DONE.json")["Body"]
        .read()
    )
    named = ", ".join(zones) if zones else "its zone"
    assert done["reason"].startswith(
        f"no capacity for the fleet in {named}: InsufficientInstanceCapacity on each of {tries} tries"
    )
    assert (done["status"], done["cause"], done["attempt"]) == ("failed", "no_capacity", 2)
    assert done["written_by"] == "controller"
    attempts = json.loads(
        boto3.client("s3", region_name=REGION)
        .get_object(Bucket=BUCKET, Key=f"runs/{RUN}/attempts.json")["Body"]
        .read()
    )["attempts"]
    assert [a["decision"] for a in attempts] == ["relaunch", "teardown"]
    assert attempts[1]["why"] == "not retryable: no zone had capacity for the fleet"
    assert stack_status("TrainStack") in (None, "DELETE_COMPLETE")
    assert live_fleet(stack_id) == {}


def next_recheck_time() -> datetime.datetime:
    [schedule] = [
        s for s in schedules() if json.loads(s["Target"]["Input"])["reason"] == "relaunch"
    ]
    at = schedule["ScheduleExpression"].removeprefix("at(").removesuffix(")")
    return datetime.datetime.fromisoformat(at).replace(tzinfo=datetime.timezone.utc)


def test_the_hard_cap_ends_the_wait_for_capacity_early(reaper, capsys, monkeypatch):
    """A wait that would leave less than an attempt before the cap gives up at once."""
    deploy(1, spot=True, zones=ZONES[:2], deadline="2026-11-22T05:10:00Z")
    Ec2Capacity(reaper, monkeypatch, full=set(ZONES))
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    decisions(capsys)
    reaper.handle(next_recheck()[0])  # us-east-1a: none; us-east-1b next, at once
    assert decisions(capsys)[0]["decision"] == "relaunch-no-capacity"
    reaper.handle(next_recheck()[0])  # us-east-1b: none; a 10-minute wait would pass the cap
    assert decisions(capsys)[0]["decision"] == "relaunch-gave-up"


def test_a_relaunch_starts_in_the_zone_the_fleet_moved_to():
    assert zone_move.try_order(ZONES, "us-east-1b") == ["us-east-1b", "us-east-1c", "us-east-1a"]
    assert zone_move.try_order(ZONES, None) == ZONES


@pytest.mark.parametrize(
    "text",
    ["", "{", "[]", '{"zones": ""}', '{"zones": "a", "vpc": "v"}', '{"zones": 3, "vpc": "v", '
     '"route_table": "r", "cidrs": []}'],
)  # fmt: skip
def test_a_stack_without_a_usable_plan_never_moves(text):
    assert zone_move.parse_plan(text) is None


def test_a_plan_never_names_more_zones_than_it_has_blocks_for():
    text = json.dumps(
        {"zones": "a,b,c", "vpc": "vpc-1", "route_table": "rtb-1", "cidrs": ["10.42.16.0/20"]}
    )
    plan = zone_move.parse_plan(text)
    assert plan.zones == ("a", "b")


def fail_with(operation: str, code: str, times: int):
    """A fake EC2 call that answers `code` the first `times` calls, then does the real one."""
    calls = []

    def call(real):
        def answer(**kwargs):
            calls.append(kwargs)
            if len(calls) <= times:
                raise ClientError({"Error": {"Code": code, "Message": "refused"}}, operation)
            return real(**kwargs)

        return answer

    return call


def test_a_move_retried_after_a_failure_finishes_its_route(reaper, capsys, monkeypatch):
    """The subnet was made but its association failed: without the route the nodes could not
    reach S3 and would bill until the idle alarm. The retried invocation associates it."""
    table, _, _ = deploy(2, spot=True, zones=ZONES)
    Ec2Capacity(reaper, monkeypatch, full={ZONES[0]})
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    reaper.handle(next_recheck()[0])  # us-east-1a: none
    real = reaper.ec2.associate_route_table
    monkeypatch.setattr(
        reaper.ec2,
        "associate_route_table",
        fail_with("AssociateRouteTable", "RequestLimitExceeded", times=1)(real),
    )
    payload = next_recheck()[0]
    with pytest.raises(ClientError):  # Lambda retries an invocation that failed
        reaper.handle(payload)
    reaper.handle(payload)
    assert decisions(capsys)[-1]["decision"] == "relaunched"
    [subnet] = moved_subnets()
    [routes] = ec2().describe_route_tables(RouteTableIds=[table])["RouteTables"]
    assert subnet["SubnetId"] in {a.get("SubnetId") for a in routes["Associations"]}


def test_a_relaunch_ec2_refuses_gives_up_in_one_line_and_stops_what_it_started(
    reaper, capsys, monkeypatch
):
    _, _, nodes = deploy(3, spot=False, zones=ZONES)
    ec2().terminate_instances(InstanceIds=[nodes[2]])  # a retired host: node 2 is launched
    stack_id = train_stack_id()
    Ec2Capacity(reaper, monkeypatch, full=set())
    real = reaper.ec2.run_instances
    monkeypatch.setattr(
        reaper.ec2,
        "run_instances",
        fail_with("RunInstances", "UnauthorizedOperation", times=99)(real),
    )
    fail_attempt()
    reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
    decisions(capsys)
    reaper.handle(next_recheck()[0])
    recorded = decisions(capsys)
    assert recorded[0]["decision"] == "relaunch-gave-up"
    assert (
        recorded[0]["reason"] == "the relaunch failed: EC2 answered UnauthorizedOperation: refused"
    )
    attempts = json.loads(
        boto3.client("s3", region_name=REGION)
        .get_object(Bucket=BUCKET, Key=f"runs/{RUN}/attempts.json")["Body"]
        .read()
    )["attempts"]
    assert attempts[-1]["why"] == "not retryable: EC2 refused the relaunch"
    assert stack_status("TrainStack") in (None, "DELETE_COMPLETE")
    # The two nodes it had started for node 2's launch were stopped again.
    assert set(live_fleet(stack_id).values()) == {ZONES[0]}
    [reservation] = ec2().describe_instances(InstanceIds=nodes[:1])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] in ("stopping", "stopped")


def test_each_relaunch_launches_with_its_own_tokens(reaper, capsys, monkeypatch):
    """EC2 keeps a ClientToken for a day: a second relaunch reusing the first one's would get
    the first one's terminated instance back, and nothing would run."""
    deploy(2, spot=True, zones=ZONES)
    capacity = Ec2Capacity(reaper, monkeypatch, full=set())
    for attempt in (1, 2):
        ec2().terminate_instances(InstanceIds=list(live_fleet()))  # every node interrupted
        s3 = boto3.client("s3", region_name=REGION)
        done = {
            "run": RUN,
            "status": "interrupted",
            "cause": "interrupted",
            "reason": "Spot interruption",
            "attempt": attempt,
        }
        s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/DONE.json", Body=json.dumps(done).encode())
        s3.put_object(Bucket=BUCKET, Key=f"runs/{RUN}/logs/node-0.log", Body=b"log")
        reaper.handle(s3_event(f"runs/{RUN}/DONE.json"))
        reaper.handle(next_recheck()[0])
        assert decisions(capsys)[-1]["decision"] == "relaunched"
    tokens = [launch["ClientToken"] for launch in capacity.launches]
    assert len(tokens) == 4 and len(set(tokens)) == 4
