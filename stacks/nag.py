"""cdk-nag acknowledgments and checkov reasons shared by the stacks, each saying why it is safe.

checkov reads its reasons from the template: a resource's Metadata `checkov.skip` list of
`{"id", "comment"}` (checkov/cloudformation/context_parser.py, collect_skip_comments).
"""

import json
import re
from collections.abc import Iterable
from typing import Any

import jsii
from aws_cdk import Acknowledgment, CfnResource, IAspect, Stack, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import IConstruct

SSM_MANAGED_POLICY = "AmazonSSMManagedInstanceCore"


def nag_text(scope: IConstruct, value: str) -> str:
    """A token string as cdk-nag prints it in a finding: Ref -> <Name>, GetAtt -> <Id.Attr>,
    ${Name} in a Fn::Sub -> <Name>."""

    def render(node: Any) -> str:
        if isinstance(node, str):
            return node
        if isinstance(node, dict) and len(node) == 1:
            [(function, argument)] = node.items()
            if function == "Ref":
                return f"<{argument}>"
            if function == "Fn::GetAtt":
                return f"<{'.'.join(argument)}>"
            if function == "Fn::Join":
                return argument[0].join(render(part) for part in argument[1])
            if function == "Fn::Sub" and isinstance(argument, str):
                return re.sub(r"\$\{([^}]+)\}", r"<\1>", argument)
        return json.dumps(node, separators=(",", ":"))

    return render(Stack.of(scope).resolve(value))


def acknowledge_wildcard_resources(
    policy: iam.Policy, resources: Iterable[str], reason: str
) -> None:
    """One IAM5 acknowledgment per wildcard resource, as cdk-nag 3 requires."""
    Validations.of(policy).acknowledge(
        *(
            Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{nag_text(policy, resource)}]", reason=reason
            )
            for resource in resources
        )
    )


def acknowledge_metric_data(policy: iam.Policy) -> None:
    acknowledge_wildcard_resources(
        policy,
        ["*"],
        "cloudwatch:PutMetricData supports no resource-level permissions; the statement's "
        "condition limits it to the HorovodFleet namespace.",
    )


def acknowledge_managed_policy(role: iam.Role, policy_name: str, reason: str) -> None:
    """cdk-nag's IAM4 for one AWS managed policy (`policy_name` as from_aws_managed_policy_name)."""
    Validations.of(role).acknowledge(
        Acknowledgment(
            id=f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{policy_name}]",
            reason=reason,
        )
    )


def acknowledge_ssm_policy(role: iam.Role) -> None:
    acknowledge_managed_policy(
        role,
        SSM_MANAGED_POLICY,
        "Session Manager replaces SSH keys and open ports; AWS maintains this policy as the "
        "agent's needs change.",
    )


def acknowledge_no_termination_protection(instance: ec2.CfnInstance, what: str) -> None:
    Validations.of(instance).acknowledge(
        Acknowledgment(
            id="AwsSolutions-EC29",
            reason=f"The run controller must be able to delete {what} to stop the bill; results and "
            "data live in S3, never only on the instance.",
        )
    )


def allow_fixed_zone(resource: CfnResource) -> None:
    """cfn-lint W3010 warns on a literal AZ; here one zone is the point (a cluster placement
    group, and a volume that must sit next to its instance)."""
    resource.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3010"]}})
    Validations.of(resource).acknowledge(
        Acknowledgment(id="CloudFormation-Validate::W3010", reason="One zone is the point.")
    )


def checkov_reason(resource: CfnResource, check_id: str, reason: str) -> None:
    """Tell checkov why `check_id` does not apply to `resource` (the comment is the reason)."""
    metadata = resource.get_metadata("checkov") or {}
    skips = [*metadata.get("skip", []), {"id": check_id, "comment": reason}]
    resource.add_metadata("checkov", {**metadata, "skip": skips})


LOG_GROUP_KMS_REASON = (
    "CloudWatch Logs always encrypts log data at rest with its own keys "
    "(https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html); "
    "these logs hold no secrets, and a customer managed key would add a key policy that can "
    "lock the agents out and a monthly charge per key."
)


@jsii.implements(IAspect)
class LogGroupReasons:
    """Every log group of the app gets the reason checkov's CKV_AWS_158 (KMS key) does not apply,
    whichever stack made it."""

    def visit(self, node) -> None:
        if isinstance(node, logs.CfnLogGroup) and not node.kms_key_id:
            checkov_reason(node, "CKV_AWS_158", LOG_GROUP_KMS_REASON)


def allow_implied_role_dependency(resource: CfnResource) -> None:
    """cfn-lint W3005 warns that a DependsOn on a role repeats what the resource's GetAtt of that
    role implies. CDK adds it to the functions of its custom-resource Provider framework and to
    a state machine, in one DependsOn with the role's default policy, which the GetAtt does not
    imply and which must exist before the resource first acts: the list stays whole."""
    resource.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
