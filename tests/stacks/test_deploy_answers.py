"""The deploy-time answers (controller/answers.py) against moto, as the Provider
framework invokes them, and the read-only role they run under."""

import datetime

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from test_teardown import as_list, render

from contract import names
from controller import answer_kit, answers

REGION = "us-east-1"
BUCKET = "horovod-fleet-dataset"
RUN = "resnet50-r1"
NOW = datetime.datetime(2026, 11, 22, 4, 33, 20, tzinfo=datetime.timezone.utc)
TOKEN = f"arn:aws:lambda:{REGION}:123456789012:function:AnswersProviderframeworkonEvent"


@pytest.fixture
def aws(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setattr(answers, "now", lambda: NOW)
    monkeypatch.setattr(answer_kit, "now", lambda: NOW)  # the answers of run_answers.py
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        yield


def request(resource_type: str, request_type: str, properties: dict, **extra) -> dict:
    """What the Provider framework hands onEvent: CloudFormation's request, its URL hidden."""
    return {
        "RequestType": request_type,
        "ResponseURL": "...",
        "StackId": f"arn:aws:cloudformation:{REGION}:123456789012:stack/TrainStack/guid",
        "RequestId": "req-1",
        "ResourceType": resource_type,
        "LogicalResourceId": "Resource",
        "ResourceProperties": {"ServiceToken": TOKEN, **properties},
        **extra,
    }


def refused(event: dict) -> str:
    with pytest.raises(answers.Refused) as raised:
        answers.on_event(event)
    return str(raised.value)


# --- hard-cap deadline -----------------------------------------------------------------------


def test_deadline_is_start_plus_max_hours():
    assert answers.deadline(NOW, 4, NOW) == {
        "ScheduleExpression": "at(2026-11-22T08:33:20)",
        "Deadline": "2026-11-22T08:33:20Z",
    }
    assert answers.deadline(NOW, 0.5, NOW)["ScheduleExpression"] == "at(2026-11-22T05:03:20)"
    assert answers.deadline(NOW, 36, NOW)["ScheduleExpression"] == "at(2026-11-23T16:33:20)"


def test_deadline_in_the_past_is_moved_just_ahead():
    start = NOW - datetime.timedelta(hours=10)
    assert answers.deadline(start, 4, NOW)["ScheduleExpression"] == "at(2026-11-22T04:38:20)"


@pytest.mark.parametrize("hours", [0, -1, float("nan")])
def test_deadline_rejects_non_positive_hours(hours):
    with pytest.raises(ValueError):
        answers.deadline(NOW, hours, NOW)


def deadline_request(request_type: str, max_hours: str, physical_id: str | None = None) -> dict:
    extra = {"PhysicalResourceId": physical_id} if physical_id else {}
    properties = {"Run": RUN, "MaxHours": max_hours}
    return request(names.DEADLINE_TYPE, request_type, properties, **extra)


def test_deadline_custom_resource_create_update_delete(aws, monkeypatch):
    created = answers.on_event(deadline_request("Create", "4"))
    assert created["Data"]["ScheduleExpression"] == "at(2026-11-22T08:33:20)"
    # An hour later the user raises the cap to 6 h: it still counts from the first deploy.
    monkeypatch.setattr(answers, "now", lambda: NOW + datetime.timedelta(hours=1))
    updated = answers.on_event(deadline_request("Update", "6", created["PhysicalResourceId"]))
    assert updated["Data"]["ScheduleExpression"] == "at(2026-11-22T10:33:20)"
    assert updated["PhysicalResourceId"] == created["PhysicalResourceId"]
    # The same request again (CloudFormation's retry) gets the same answer.
    assert answers.on_event(deadline_request("Update", "6", created["PhysicalResourceId"])) == (
        updated
    )
    deleted = answers.on_event(deadline_request("Delete", "6", created["PhysicalResourceId"]))
    assert deleted == {"PhysicalResourceId": created["PhysicalResourceId"]}


def test_deadline_custom_resource_fails_cleanly_on_bad_hours(aws):
    reason = refused(deadline_request("Create", "zero"))
    assert "zero" in reason and "\n" not in reason


# --- pinned preprocessing AMI and code --------------------------------------------------------

# moto reserves /aws/ names; the answer treats any parameter name alike.
UBUNTU = "/test/canonical/ubuntu/ami-id"
CODE_V1 = {"bootstrap": "s3://assets/1111.zip", "trainer": "s3://assets/2222.zip"}
CODE_V2 = {"bootstrap": "s3://assets/3333.zip", "trainer": "s3://assets/4444.zip"}


def pin_request(request_type: str, parameter: str = UBUNTU, code=CODE_V1, **extra) -> dict:
    properties = {"ImageParameter": parameter, "Code": code}
    return request(names.PINNED_TYPE, request_type, properties, **extra)


def publish(parameter: str, image: str) -> None:
    boto3.client("ssm", region_name=REGION).put_parameter(
        Name=parameter, Value=image, Type="String", Overwrite=True
    )


def test_pinned_image_and_code_are_kept_by_a_redeploy(aws):
    publish(UBUNTU, "ami-0aaaaaaaaaaaaaaaa")
    created = answers.on_event(pin_request("Create"))
    assert created["Data"] == {"ImageId": "ami-0aaaaaaaaaaaaaaaa", **CODE_V1}
    # Canonical publishes a new image and the code changes; a redeploy keeps both.
    publish(UBUNTU, "ami-0bbbbbbbbbbbbbbbb")
    old = {"ImageParameter": UBUNTU, "Code": CODE_V1}
    update = pin_request(
        "Update",
        code={**CODE_V2, "extra": "s3://assets/5555.zip"},
        PhysicalResourceId="ami-0aaaaaaaaaaaaaaaa",
        OldResourceProperties=old,
    )
    updated = answers.on_event(update)
    assert updated["Data"] == {
        "ImageId": "ami-0aaaaaaaaaaaaaaaa",
        **CODE_V1,
        "extra": "s3://assets/5555.zip",  # new code the old node never had: the new URL
    }
    assert updated["PhysicalResourceId"] == "ami-0aaaaaaaaaaaaaaaa"
    # A new stack (destroy, deploy) takes the new image and code.
    recreated = answers.on_event(pin_request("Create", code=CODE_V2))
    assert recreated["Data"] == {"ImageId": "ami-0bbbbbbbbbbbbbbbb", **CODE_V2}
    deleted = answers.on_event(pin_request("Delete", PhysicalResourceId="ami-0aaaaaaaaaaaaaaaa"))
    assert deleted == {"PhysicalResourceId": "ami-0aaaaaaaaaaaaaaaa"}


def test_pinned_image_with_a_missing_parameter_fails_the_deploy_cleanly(aws):
    assert "/no/such/parameter" in refused(pin_request("Create", parameter="/no/such/parameter"))


# --- dataset present before the fleet launches -------------------------------------------------


def dataset_request(request_type: str, key: str = "tfrecords/manifest.json", **extra) -> dict:
    properties = {"Bucket": BUCKET, "Key": key}
    return request(names.DATASET_TYPE, request_type, properties, **extra)


def test_a_missing_manifest_fails_the_deploy_in_one_line(aws):
    reason = refused(dataset_request("Create"))
    assert reason.startswith(f"no s3://{BUCKET}/tfrecords/manifest.json: the fleet has")
    assert "Deploy PreprocessStack" in reason and "\n" not in reason
    assert f"indexed first by horovod-fleet dataset index s3://{BUCKET}/tfrecords/;" in reason


def test_a_missing_manifest_s3_answers_with_403_is_missing_too(aws, monkeypatch):
    def denied(**_):
        raise ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, "HeadObject")

    monkeypatch.setattr(answers.client("s3"), "head_object", denied)
    assert refused(dataset_request("Create")).startswith(
        f"no s3://{BUCKET}/tfrecords/manifest.json"
    )


def test_a_present_manifest_lets_the_fleet_launch_and_delete_always_succeeds(aws):
    boto3.client("s3", region_name=REGION).put_object(
        Bucket=BUCKET, Key="tfrecords/manifest.json", Body=b"{}"
    )
    created = answers.on_event(dataset_request("Create"))
    assert created == {"PhysicalResourceId": f"s3://{BUCKET}/tfrecords/manifest.json"}
    gone = answers.on_event(
        dataset_request("Delete", key="gone/manifest.json", PhysicalResourceId="s3://x/y")
    )
    assert gone == {"PhysicalResourceId": "s3://x/y"}


# --- the fleet's zone, picked at deploy time ----------------------------------------------------


def zone_request(request_type: str, preferred: str, fixed: bool = False, **extra) -> dict:
    slots = extra.pop("move_slots", None)
    properties = {
        "InstanceType": extra.pop("instance_type", "p4d.24xlarge"),
        "PreferredZone": preferred,
        "Fixed": str(fixed).lower(),
        **({} if slots is None else {"MoveSlots": str(slots)}),
    }
    return request(names.ZONE_TYPE, request_type, properties, **extra)


# moto's offerings (its copy of AWS's data): p4d.24xlarge in us-east-1a to 1d, not 1e or 1f.
OFFERING_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")


def test_the_preferred_zone_is_kept_when_it_offers_the_type(aws):
    # The zone, then the others that offer the type: where a relaunch may go.
    assert answers.on_event(zone_request("Create", "us-east-1b"))["Data"] == {
        "Zone": "us-east-1b",
        "Zones": "us-east-1b,us-east-1a,us-east-1c,us-east-1d",
    }


def test_a_fixed_zone_offers_nowhere_else(aws):
    answer = answers.on_event(zone_request("Create", "us-east-1c", fixed=True))
    assert answer["Data"] == {"Zone": "us-east-1c", "Zones": "us-east-1c"}


def test_a_fixed_zone_without_the_type_fails_the_deploy_in_one_line(aws):
    assert refused(zone_request("Create", "us-east-1e", fixed=True)) == (
        "p4d.24xlarge is not offered in zone us-east-1e for this account: try a subnet in a zone "
        "that does (us-east-1a, us-east-1b, us-east-1c, us-east-1d), a capacity reservation "
        "(-c capacityReservationId=...) or a Capacity Block"
    )


def test_a_type_no_zone_offers_fails_naming_the_region(aws):
    assert refused(zone_request("Create", "us-east-1a", instance_type="p9.mega")).startswith(
        "p9.mega is not offered in any zone of us-east-1 for this account: try another region"
    )


# moto's zones (its copy of one account's mapping): use1-az4 is us-east-1d, use1-az3 us-east-1e.
@pytest.mark.parametrize(
    ("preferred", "answered"),
    [
        ("us-east-1e", "us-east-1a"),  # a zone without the type gives way to one that has it
        ("use1-az4", "us-east-1d"),  # a zone ID is answered as this account's zone name
    ],
)
def test_the_zone_answered_is_a_name_that_offers_the_type_and_redeploys_keep_it(
    aws, preferred, answered
):
    created = answers.on_event(zone_request("Create", preferred))
    others = ",".join(z for z in OFFERING_ZONES if z != answered)
    assert created == {
        "PhysicalResourceId": answered,
        "Data": {"Zone": answered, "Zones": f"{answered},{others}"},
    }
    # A redeploy with the same preference keeps the subnet where it is.
    update = zone_request(
        "Update",
        preferred,
        PhysicalResourceId=answered,
        OldResourceProperties=zone_request("Create", preferred)["ResourceProperties"],
    )
    assert answers.on_event(update) == created


def test_a_zone_id_without_the_type_gives_way_unless_fixed(aws):
    assert answers.on_event(zone_request("Create", "use1-az3"))["Data"]["Zone"] == "us-east-1a"
    assert refused(zone_request("Create", "use1-az3", fixed=True)).startswith(
        "p4d.24xlarge is not offered in zone us-east-1e (use1-az3) for this account: try a "
        "subnet in a zone that does (us-east-1a, us-east-1b, us-east-1c, us-east-1d)"
    )


def test_each_move_slot_answers_another_offering_zone_then_the_zone_itself(aws):
    """TrainStack's move slots (a subnet and a placement group each): the other zones that
    offer the type, then spares in the fleet's own zone; the physical id remembers them."""
    answer = answers.on_event(zone_request("Create", "us-east-1b", move_slots=5))
    assert answer["Data"] == {
        "Zone": "us-east-1b",
        "Zones": "us-east-1b,us-east-1a,us-east-1c,us-east-1d",
        "Zone1": "us-east-1a",
        "Zone2": "us-east-1c",
        "Zone3": "us-east-1d",
        "Zone4": "us-east-1b",
        "Zone5": "us-east-1b",
    }
    assert answer["PhysicalResourceId"] == (
        "us-east-1b:us-east-1a,us-east-1c,us-east-1d,us-east-1b,us-east-1b"
    )


def test_a_fixed_zone_has_no_move_slots(aws):
    answer = answers.on_event(zone_request("Create", "us-east-1c", fixed=True, move_slots=5))
    assert answer == {
        "PhysicalResourceId": "us-east-1c",
        "Data": {"Zone": "us-east-1c", "Zones": "us-east-1c"},
    }


@pytest.mark.parametrize("instance_type", ["p4d.24xlarge", "g5.xlarge"])
def test_move_slots_keep_their_zones_on_every_update(aws, monkeypatch, instance_type):
    """A slot's subnet cannot change zone in an update (its replacement would need the CIDR
    block the old one holds): whatever the offerings or the type now, the slots stay; a new
    slot takes a zone no slot holds yet."""
    monkeypatch.setattr(answers, "offering_zones", lambda _: ["us-east-1b", "us-east-1f"])
    answer = answers.on_event(
        zone_request(
            "Update",
            "us-east-1b",
            move_slots=3,
            instance_type=instance_type,
            PhysicalResourceId="us-east-1b:us-east-1a,us-east-1c",
            OldResourceProperties=zone_request("Create", "us-east-1b", move_slots=2)[
                "ResourceProperties"
            ],
        )
    )
    assert {k: v for k, v in answer["Data"].items() if k != "Zones"} == {
        "Zone": "us-east-1b",
        "Zone1": "us-east-1a",
        "Zone2": "us-east-1c",
        "Zone3": "us-east-1f",
    }
    assert answer["PhysicalResourceId"] == "us-east-1b:us-east-1a,us-east-1c,us-east-1f"


def test_a_stack_answered_before_move_slots_gets_them_at_its_next_update(aws):
    answer = answers.on_event(
        zone_request(
            "Update",
            "us-east-1b",
            move_slots=2,
            PhysicalResourceId="us-east-1b",
            OldResourceProperties=zone_request("Create", "us-east-1b")["ResourceProperties"],
        )
    )
    assert (answer["Data"]["Zone1"], answer["Data"]["Zone2"]) == ("us-east-1a", "us-east-1c")
    assert answer["PhysicalResourceId"] == "us-east-1b:us-east-1a,us-east-1c"


def test_a_zone_id_of_another_region_fails_the_deploy_in_one_line(aws):
    assert refused(zone_request("Create", "usw2-az1")) == (
        "zone ID usw2-az1 is not a zone of us-east-1 this account can use: see aws ec2 "
        "describe-availability-zones --region us-east-1"
    )


def test_an_unknown_resource_type_fails_in_one_line(aws):
    assert refused(request("Custom::Other", "Create", {})) == (
        "no deploy-time answer for 'Custom::Other'"
    )


# --- the answers' role ---------------------------------------------------------------------------

MUTATING = ("ec2:RunInstances", "ec2:StopInstances", "ec2:TerminateInstances")


def answers_statements(template) -> list[dict]:
    roles = [
        logical_id
        for logical_id, resource in template.find_resources("AWS::IAM::Role").items()
        if logical_id.startswith("AnswersRole")
    ]
    assert len(roles) == 1, roles
    return [
        statement
        for policy in template.find_resources("AWS::IAM::Policy").values()
        if {"Ref": roles[0]} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


@pytest.mark.parametrize("stack", ["TeardownStack", "PreprocessStack"])
def test_the_answers_role_reads_and_changes_nothing(default, stack):
    """Its statements in every stack that grants it something: no action that starts, stops or
    deletes anything, and no write."""
    template = default[stack]
    found = (
        answers_statements(template)
        if stack == "TeardownStack"
        else [
            s
            for logical_id, policy in template.find_resources("AWS::IAM::Policy").items()
            if "Pinned" in logical_id
            for s in policy["Properties"]["PolicyDocument"]["Statement"]
        ]
    )
    assert found
    # Its one write: each run's record, runs/<run>/config.json (stacks/train/run_record.py).
    for statement in found:
        if "s3:PutObject" in as_list(statement["Action"]):
            written = [render(r) for r in as_list(statement["Resource"])]
            assert all(w.endswith("/runs/*/config.json") for w in written), statement
    actions = {a for s in found for a in as_list(s["Action"])} - {"s3:PutObject"}
    assert not actions & {*MUTATING, "cloudformation:DeleteStack"}
    assert all(a.split(":")[1].startswith(("Get", "Describe", "List", "PutLogEvents", "CreateLogStream"))
               for a in actions), actions  # fmt: skip


def test_every_deploy_time_answer_comes_from_the_answers_provider(default):
    kinds = (
        names.DEADLINE_TYPE,
        names.ZONE_TYPE,
        names.DATASET_TYPE,
        names.PINNED_TYPE,
        names.CODE_GUARD_TYPE,
    )
    found = [
        resource
        for template in default.values()
        for resource in template.to_json()["Resources"].values()
        if resource["Type"] in kinds
    ]
    assert {r["Type"] for r in found} == set(kinds)
    for resource in found:
        assert "AnswersProvider" in render(resource["Properties"]["ServiceToken"])


# --- the zone offers the head's type too -------------------------------------------------------


def head_offerings(monkeypatch, head_zones: tuple[str, ...]) -> None:
    """The GPU type in moto's offering zones, the head's type only in head_zones."""
    monkeypatch.setattr(
        answers,
        "offering_zones",
        lambda instance_type: list(
            OFFERING_ZONES if instance_type == "p4d.24xlarge" else head_zones
        ),
    )


def head_zone_request(preferred: str, fixed: bool = False) -> dict:
    event = zone_request("Create", preferred, fixed=fixed)
    event["ResourceProperties"]["HeadInstanceType"] = "c6i.xlarge"
    return event


def test_the_zone_answered_offers_the_head_type_and_moves_may_go_where_it_does_not(
    aws, monkeypatch
):
    """The head stays in the deployed zone: a preferred zone without its type gives way to the
    first that offers both; a relaunch's move takes only the nodes, so Zones keeps every zone
    that offers theirs."""
    head_offerings(monkeypatch, ("us-east-1c", "us-east-1d"))
    assert answers.on_event(head_zone_request("us-east-1a"))["Data"] == {
        "Zone": "us-east-1c",
        "Zones": "us-east-1c,us-east-1a,us-east-1b,us-east-1d",
    }
    assert answers.on_event(head_zone_request("us-east-1d"))["Data"]["Zone"] == "us-east-1d"


def test_a_fixed_zone_without_the_head_type_fails_the_deploy_in_one_line(aws, monkeypatch):
    head_offerings(monkeypatch, ("us-east-1c",))
    assert refused(head_zone_request("us-east-1a", fixed=True)) == (
        "c6i.xlarge, the fleet's head, is not offered for this account in zone us-east-1a where "
        "p4d.24xlarge is: try a subnet in a zone that does (us-east-1c)"
    )
    head_offerings(monkeypatch, ())
    assert refused(head_zone_request("us-east-1a")) == (
        "c6i.xlarge, the fleet's head, is not offered for this account in any zone of us-east-1 "
        "where p4d.24xlarge is: try another region (-c region=...)"
    )
