"""rehearsal/drill_actions.py: the rehearsal's model of FIS's errors on the run controller's EC2
calls, injected on the client the controller's code uses: exactly the listed operations, at
their percentage, for their duration; capacity refused only for a request in the given zones,
never for one across several zones."""

import time

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from rehearsal.drill_actions import CAPACITY_OPERATIONS, ControllerFaults, Window, duration_s

IMAGE = "ami-12c6146b"


@pytest.fixture
def ec2(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        own = boto3.client("ec2", region_name="us-east-1")  # the rehearsal's: never refused
        controller = boto3.client("ec2", region_name="us-east-1")
        vpc = own.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
        subnets = {
            zone: own.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"][
                "SubnetId"
            ]
            for zone, cidr in (("us-east-1a", "10.42.0.0/20"), ("us-east-1b", "10.42.16.0/20"))
        }
        faults = ControllerFaults(own, draw=lambda: 0.5)
        faults.hook(controller)
        faults.hook(controller)  # once only
        yield own, controller, subnets, faults


def code(call) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    return raised.value.response["Error"]["Code"]


def launch(client, subnet: str) -> str:
    answer = client.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1, SubnetId=subnet)
    return answer["Instances"][0]["InstanceId"]


def test_only_the_listed_operations_are_throttled_and_only_for_the_duration(ec2):
    own, controller, subnets, faults = ec2
    faults.add(Window("RequestLimitExceeded", ("DescribeInstances", "RunInstances"), 100,
                      time.time() + 0.5))  # fmt: skip
    assert code(controller.describe_instances) == "RequestLimitExceeded"
    assert code(lambda: launch(controller, subnets["us-east-1a"])) == "RequestLimitExceeded"
    assert controller.describe_subnets()["Subnets"]  # not listed: answered
    assert own.describe_instances()["Reservations"] == []  # the rehearsal's own client
    time.sleep(0.6)
    assert controller.describe_instances()["Reservations"] == []


def test_a_percentage_refuses_that_share_of_the_calls(ec2):
    _, controller, _, faults = ec2  # every draw is 0.5: refused below 50%, not at or above
    faults.add(Window("RequestLimitExceeded", ("DescribeInstances",), 50, time.time() + 60))
    assert controller.describe_instances()["Reservations"] == []
    faults.add(Window("RequestLimitExceeded", ("DescribeInstances",), 51, time.time() + 60))
    assert code(controller.describe_instances) == "RequestLimitExceeded"


def test_capacity_is_refused_in_the_given_zone_only(ec2):
    own, controller, subnets, faults = ec2
    in_a, in_b = launch(own, subnets["us-east-1a"]), launch(own, subnets["us-east-1b"])
    own.stop_instances(InstanceIds=[in_a, in_b])
    faults.add(Window("InsufficientInstanceCapacity", CAPACITY_OPERATIONS, 100,
                      time.time() + 60, zones=("us-east-1a",)))  # fmt: skip
    assert code(lambda: launch(controller, subnets["us-east-1a"])) == "InsufficientInstanceCapacity"
    assert launch(controller, subnets["us-east-1b"])
    assert (
        code(lambda: controller.start_instances(InstanceIds=[in_a]))
        == "InsufficientInstanceCapacity"
    )
    # A request across two zones is not one FIS refuses.
    assert controller.start_instances(InstanceIds=[in_a, in_b])["StartingInstances"]
    assert controller.describe_instances()["Reservations"]  # not a capacity call


def test_a_launch_template_s_subnet_says_where_a_launch_asks_capacity(ec2):
    own, controller, subnets, faults = ec2
    template = own.create_launch_template(
        LaunchTemplateName="head",
        LaunchTemplateData={"ImageId": IMAGE, "NetworkInterfaces": [
            {"DeviceIndex": 0, "SubnetId": subnets["us-east-1a"]}]},
    )["LaunchTemplate"]["LaunchTemplateId"]  # fmt: skip
    faults.add(Window("InsufficientInstanceCapacity", CAPACITY_OPERATIONS, 100,
                      time.time() + 60, zones=("us-east-1a",)))  # fmt: skip

    def from_template():
        controller.run_instances(
            LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"},
            MinCount=1,
            MaxCount=1,
        )

    assert code(from_template) == "InsufficientInstanceCapacity"


def test_durations_are_fis_s_iso_8601():
    assert duration_s("PT3M") == 180 and duration_s("PT45S") == 45
