"""TrainStack's Replacements resource (controller/cleanup.py) under the requests
CloudFormation sends it: an update that renames the run and a rolled-back update end no live
node; `cdk destroy` ends every instance CloudFormation does not know, and its Delete always
answers."""

import pytest
from run_controller_fleet import NODE_TAG, RUN, Ec2Answers, Fleet, ticks  # noqa: F401

from controller import cleanup, clients

# ruff: noqa: F811  (ticks is a fixture)

TOKEN = "arn:aws:lambda:us-east-1:123456789012:function:CleanupProviderframeworkonEvent"


class CloudFormation:
    """The custom-resource protocol as CloudFormation plays it for one resource: an update whose
    answer names another physical id is a replacement, and the old id gets a Delete in the
    stack's cleanup phase; a rolled-back update is an update back to the old properties, and
    the new id's Delete
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/crpg-ref-responses.html,
    aws-cdk custom-resources README: "If the update fails, you will get a subsequent Update
    event to roll back to the previous state")."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.physical_id = None
        self.properties: dict = {}

    def request(self, kind: str, properties: dict, **extra) -> dict:
        event = {
            "RequestType": kind,
            "StackId": self.fleet.stack_id,
            "RequestId": f"request-{kind}",
            "ResourceType": "Custom::HorovodFleetReplacements",
            "LogicalResourceId": "Replacements",
            "ResourceProperties": {"ServiceToken": TOKEN, **properties},
            **extra,
        }
        if self.physical_id is not None:
            event["PhysicalResourceId"] = self.physical_id
        return cleanup.on_event(event)

    def create(self, properties: dict) -> None:
        self.physical_id = self.request("Create", properties)["PhysicalResourceId"]
        self.properties = properties

    def update(self, properties: dict, cleanup_status: str) -> str:
        """One update; returns the physical id the stack keeps."""
        old_id, old = self.physical_id, self.properties
        answer = self.request("Update", properties, OldResourceProperties=old)
        self.physical_id, self.properties = answer["PhysicalResourceId"], properties
        if answer["PhysicalResourceId"] != old_id:
            self.delete_replaced(old_id, cleanup_status)
        return self.physical_id

    def rolled_back_update(self, properties: dict) -> str:
        """An update of this resource, then another resource's failure rolls it back."""
        before_id, before = self.physical_id, self.properties
        self.update(properties, "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS")
        failed_id = self.physical_id
        self.fleet.set_stack_status("UPDATE_ROLLBACK_IN_PROGRESS")
        answer = self.request("Update", before, OldResourceProperties=properties)
        self.physical_id, self.properties = answer["PhysicalResourceId"], before
        if self.physical_id != failed_id:
            self.delete_replaced(failed_id, "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS")
        assert self.physical_id == before_id
        return self.physical_id

    def delete_replaced(self, physical_id: str, status: str) -> None:
        self.fleet.set_stack_status(status)
        kept, self.physical_id = self.physical_id, physical_id
        self.request("Delete", self.properties)
        self.physical_id = kept
        self.fleet.set_stack_status("UPDATE_COMPLETE")


def replaced_node(fleet: Fleet) -> str:
    """Node 1 as the run controller relaunched it: from the replacement template, outside
    CloudFormation, then tagged with its index."""
    clients.client("ec2").terminate_instances(InstanceIds=[fleet.nodes[1]])
    launched = clients.client("ec2").run_instances(
        LaunchTemplate={"LaunchTemplateId": fleet.template}, MinCount=1, MaxCount=1
    )
    instance_id = launched["Instances"][0]["InstanceId"]
    clients.client("ec2").create_tags(
        Resources=[instance_id], Tags=[{"Key": NODE_TAG, "Value": "1"}]
    )
    return instance_id


@pytest.mark.parametrize("change", ["rename the run", "roll back an update"])
def test_an_update_that_renames_the_run_or_rolls_back_ends_no_live_node(
    workflow, monkeypatch, change
):
    fleet = Fleet(spot=True)
    Ec2Answers(monkeypatch, fleet)
    replacement = replaced_node(fleet)
    cloudformation = CloudFormation(fleet)
    cloudformation.create({"Run": RUN})
    created = cloudformation.physical_id
    if change == "rename the run":
        kept = cloudformation.update({"Run": "resnet50-r2"}, "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS")
    else:
        kept = cloudformation.rolled_back_update({"Run": "resnet50-r2"})
    assert kept == created
    live = {n["id"] for n in fleet.billing()}
    assert live == {fleet.nodes[0], replacement}
    assert workflow.executions() == []


@pytest.mark.parametrize(
    "status",
    ["UPDATE_COMPLETE_CLEANUP_IN_PROGRESS", "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS"],
)
def test_a_delete_in_an_updates_cleanup_ends_nothing(workflow, monkeypatch, status):
    """A stack deployed before the physical id stopped naming the run gets one such Delete."""
    fleet = Fleet(spot=True)
    replacement = replaced_node(fleet)
    cloudformation = CloudFormation(fleet)
    cloudformation.physical_id = f"{RUN}-replacements"
    cloudformation.delete_replaced(cloudformation.physical_id, status)
    assert {n["id"] for n in fleet.billing()} == {fleet.nodes[0], replacement}


def test_cdk_destroy_ends_every_instance_cloudformation_does_not_know_and_is_followed(
    workflow, ticks, monkeypatch
):
    """The Delete ends what CloudFormation does not know; the tick, seeing the stack deleted and
    no execution following it, starts one that does."""
    fleet = Fleet(spot=True)
    replacement = replaced_node(fleet)
    cloudformation = CloudFormation(fleet)
    cloudformation.create({"Run": RUN})
    fleet.set_stack_status("DELETE_IN_PROGRESS")
    answer = cloudformation.request("Delete", {"Run": RUN})
    assert answer == {"PhysicalResourceId": cloudformation.physical_id}
    assert {n["id"] for n in fleet.billing()} == {fleet.nodes[0]}  # CloudFormation's own
    assert replacement not in {n["id"] for n in fleet.instances()}
    assert workflow.executions() == []
    workflow.on_wait = lambda _e, state, _s: (
        state == "WaitForDelete" and fleet.set_stack_status("DELETE_COMPLETE")
    )
    assert ticks()["actions"] == ["start"]
    [follower] = workflow.executions()
    assert follower["name"].startswith(f"{RUN}-destroy-")
    assert workflow.states(follower)[-1] == "Deleted"


def test_a_delete_answers_whatever_fails(workflow, monkeypatch):
    """A failed Delete would hold up the stack's delete while every node bills."""
    fleet = Fleet(spot=True)
    replaced_node(fleet)
    cloudformation = CloudFormation(fleet)
    cloudformation.create({"Run": RUN})
    fleet.set_stack_status("DELETE_IN_PROGRESS")

    def denied(**_):
        raise RuntimeError("UnauthorizedOperation")

    monkeypatch.setattr(clients.client("ec2"), "terminate_instances", denied)
    answer = cloudformation.request("Delete", {"Run": RUN})
    assert answer == {"PhysicalResourceId": cloudformation.physical_id}
