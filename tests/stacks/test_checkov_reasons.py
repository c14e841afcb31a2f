"""Every checkov finding the app accepts carries its reason in the template, where checkov reads
it (Metadata checkov.skip). `make check` runs checkov itself and fails on any other finding."""

import pytest
from aws_cdk.assertions import Template

import app

EXPECTED = {
    ("AWS::Logs::LogGroup", "CKV_AWS_158"),
    ("AWS::Lambda::Function", "CKV_AWS_115"),
    ("AWS::Lambda::Function", "CKV_AWS_116"),
    ("AWS::Lambda::Function", "CKV_AWS_117"),
    ("AWS::Lambda::Function", "CKV_AWS_173"),
    ("AWS::SQS::Queue", "CKV_AWS_27"),
    ("AWS::S3::Bucket", "CKV_AWS_18"),
    ("AWS::S3::Bucket", "CKV_AWS_21"),
    ("AWS::SNS::Topic", "CKV_AWS_26"),
}


@pytest.fixture(scope="module")
def skips(tmp_path_factory) -> list[tuple[str, str, str, dict]]:
    _, _, stacks = app.build(
        {"budgetEmail": "ops@example.com"}, str(tmp_path_factory.mktemp("out"))
    )
    found = []
    for stack in (stacks.dataset, stacks.teardown, stacks.preprocess, stacks.train):
        resources = Template.from_stack(stack).to_json()["Resources"]
        for logical_id, resource in resources.items():
            for skip in resource.get("Metadata", {}).get("checkov", {}).get("skip", []):
                found.append((resource["Type"], logical_id, stack.stack_name, skip))
    return found


def test_each_accepted_finding_is_explained(skips):
    assert {(kind, skip["id"]) for kind, _, _, skip in skips} == EXPECTED
    for _, logical_id, stack, skip in skips:
        assert set(skip) == {"id", "comment"}, (stack, logical_id)
        assert len(skip["comment"]) > 60, (stack, logical_id, skip)


def test_every_log_group_of_every_stack_says_why_no_kms_key(skips):
    explained = {(stack, logical_id) for kind, logical_id, stack, skip in skips
                 if kind == "AWS::Logs::LogGroup"}  # fmt: skip
    assert {stack for stack, _ in explained} == {"TeardownStack", "PreprocessStack", "TrainStack"}
