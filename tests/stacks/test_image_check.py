"""The image, then the fleet (issue 50): TrainStack boots the image ImageStack baked, answered at
deploy (Custom::HorovodFleetImage), and a deploy while the bake runs, before any image is baked,
or against another checkout's image is refused in one line naming what to wait for and how to
check it, before any instance launches."""

import json
import re
from pathlib import Path

import boto3
import pytest
from test_deploy_answers import REGION, aws, refused, request  # noqa: F401 (aws: a fixture)

from controller import answer_kit, answers, run_answers
from stacks.train import image_check

ROOT = Path(__file__).resolve().parents[2]
VERSION = "horovod-fleet-training/1.0.4242"
AMI = "ami-0123456789abcdef0"


def image_request(request_type: str = "Create", version: str = VERSION, **extra) -> dict:
    return request(
        image_check.IMAGE_TYPE, request_type, {"Version": version, "Region": REGION}, **extra
    )


class Stacks:
    """CloudFormation's DescribeStacks as the answer sees it: ImageStack in `status` with
    `outputs` (None: no ImageStack), TrainStack in `train_status`."""

    def __init__(self, status=None, outputs=None, train_status="UPDATE_IN_PROGRESS"):
        self.status, self.outputs, self.train_status = status, outputs or {}, train_status

    def describe_stacks(self, StackName):
        if StackName != "ImageStack":
            return {"Stacks": [{"StackStatus": self.train_status}]}
        if self.status is None:
            from botocore.exceptions import ClientError

            raise ClientError(
                {"Error": {"Code": "ValidationError",
                           "Message": "Stack with id ImageStack does not exist"}},
                "DescribeStacks",
            )  # fmt: skip
        outputs = [{"OutputKey": k, "OutputValue": v} for k, v in self.outputs.items()]
        return {"Stacks": [{"StackStatus": self.status, "Outputs": outputs}]}


@pytest.fixture
def stacks(monkeypatch):
    def use(**kwargs) -> None:
        monkeypatch.setattr(answer_kit, "client", lambda name: Stacks(**kwargs))

    return use


CHECK = run_answers.image_check_command(REGION)


@pytest.mark.parametrize("status", ["CREATE_IN_PROGRESS", "UPDATE_IN_PROGRESS"])
def test_a_deploy_while_the_bake_runs_is_refused_naming_what_to_wait_for(stacks, status):
    stacks(status=status, outputs={"AmiId": AMI, "ImageVersion": "horovod-fleet-training/1.0.1"})
    line = refused(image_request())
    assert line == (
        f"ImageStack is {status}: the training image is still baking (about 3 hours the first "
        "time). Wait for npx cdk deploy ImageStack --output cdk.out.image to return, check with "
        f"{CHECK} until it says CREATE_COMPLETE or UPDATE_COMPLETE, then deploy TrainStack again"
    )


def test_a_deploy_before_any_image_is_baked_is_refused(stacks):
    stacks(status=None)
    line = refused(image_request())
    assert line.startswith("no training image is baked yet (ImageStack is not deployed): run "
                           "npx cdk deploy ImageStack --output cdk.out.image and wait")  # fmt: skip
    assert CHECK in line and "-c ami=" in line and "\n" not in line


def test_a_failed_bake_and_another_checkout_s_image_are_refused(stacks):
    stacks(status="ROLLBACK_COMPLETE")
    assert refused(image_request()).startswith(
        "ImageStack is ROLLBACK_COMPLETE with no baked image: its bake failed"
    )
    stacks(status="UPDATE_COMPLETE", outputs={"AmiId": AMI, "ImageVersion": "other/1.0.1"})
    line = refused(image_request())
    assert line.startswith(f"ImageStack holds other/1.0.1, and this checkout bakes {VERSION}: ")
    # An ImageStack deployed before it had the output: deploying it again adds the output.
    stacks(status="CREATE_COMPLETE", outputs={"AmiId": AMI})
    assert "ImageStack holds an image from before image versions" in refused(image_request())


@pytest.mark.parametrize(
    "status", ["CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE"]
)
def test_the_image_imagestack_holds_is_the_answer(stacks, status):
    stacks(status=status, outputs={"AmiId": AMI, "ImageVersion": VERSION})
    assert answers.on_event(image_request()) == {
        "PhysicalResourceId": AMI, "Data": {"ImageId": AMI}
    }  # fmt: skip


def test_a_rollback_answers_the_image_the_stack_had_whatever_imagestack_is_now(stacks):
    stacks(status="UPDATE_IN_PROGRESS", train_status="UPDATE_ROLLBACK_IN_PROGRESS")
    update = image_request("Update", PhysicalResourceId=AMI)
    assert answers.on_event(update) == {"PhysicalResourceId": AMI, "Data": {"ImageId": AMI}}


def test_against_cloudformation_s_own_answers(aws):  # noqa: F811
    """moto's DescribeStacks: no stack is the error the answer recognises; a deployed stack's
    outputs are read by key."""
    assert refused(image_request()).startswith("no training image is baked yet")
    template = {"Resources": {"Nothing": {"Type": "AWS::SNS::Topic"}},
                "Outputs": {"AmiId": {"Value": AMI}, "ImageVersion": {"Value": VERSION}}}  # fmt: skip
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName="ImageStack", TemplateBody=json.dumps(template)
    )
    assert answers.on_event(image_request())["Data"] == {"ImageId": AMI}


def test_train_stack_boots_the_answer_s_image_and_waits_for_no_bake(default):
    train, image = default["TrainStack"].to_json(), default["ImageStack"].to_json()
    [(check_id, check)] = [(k, r) for k, r in train["Resources"].items()
                           if r["Type"] == image_check.IMAGE_TYPE]  # fmt: skip
    # It expects the image this checkout's ImageStack bakes, which ImageStack outputs.
    assert check["Properties"]["Version"] == image["Outputs"]["ImageVersion"]["Value"]
    assert re.fullmatch(r"horovod-fleet-training/1\.0\.\d+", check["Properties"]["Version"])
    instances = [r for r in train["Resources"].values() if r["Type"] == "AWS::EC2::Instance"]
    assert instances
    for instance in instances:
        # Its GetAtt makes CloudFormation answer the check before it creates the instance.
        assert instance["Properties"]["ImageId"] == {"Fn::GetAtt": [check_id, "ImageId"]}
    assert "ImageStack" not in json.dumps(train)  # no reference, no dependency: no bake first


def test_readme_s_bake_step_says_to_wait_for_the_bake_and_how_to_check(tmp_path):
    readme = " ".join((ROOT / "README.md").read_text().split())
    step2 = readme[
        readme.index("3. Bake the training image") : readme.index("4. Create the dataset")
    ]
    assert "wait for it before step 6" in step2
    assert "refuses" in step2 and "TrainStack" in step2
    assert run_answers.image_check_command("<region>") in step2
