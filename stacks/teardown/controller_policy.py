"""What each of the run controller's roles may do (stacks/teardown/run_controller.py), scoped to
TrainStack, its fleet's tags, the run records in S3 and the controller's own state machine."""

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from stacks.node_code import PROJECT
from stacks.teardown.names import (
    CAP_SCHEDULE_PREFIX,
    FLEET_TAG,
    NODE_TAG,
    NOTIFY_TOPIC_PREFIX,
    TRAIN_STACK_NAME,
)


class ControllerArns:
    """The ARNs the roles' statements name, and the wildcards among them for cdk-nag."""

    def __init__(self, stack: Stack, bucket: s3.IBucket, state_machine_name: str) -> None:
        arn = stack.format_arn
        self.train_stack = arn(
            service="cloudformation", resource="stack", resource_name=f"{TRAIN_STACK_NAME}/*"
        )
        self.instances = arn(service="ec2", resource="instance", resource_name="*")
        self.launch_templates = arn(service="ec2", resource="launch-template", resource_name="*")
        # What an instance launched into another zone's subnet and group names beside its
        # template: TrainStack made each one (stacks/train/, zones made at deploy).
        self.network = [
            arn(service="ec2", resource=kind, resource_name="*")
            for kind in ("subnet", "security-group", "placement-group")
        ]
        self.launched = [
            arn(service="ec2", resource=kind, resource_name="*")
            for kind in ("volume", "network-interface")
        ]
        self.train_roles = arn(
            service="iam", region="", resource="role", resource_name=f"{TRAIN_STACK_NAME}-*"
        )
        self.alarms = arn(
            service="cloudwatch",
            resource="alarm",
            resource_name="*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        # The runs' hard-cap schedules (default group), read while TrainStack is created.
        self.cap_schedules = arn(
            service="scheduler",
            resource="schedule",
            resource_name=f"default/{CAP_SCHEDULE_PREFIX}*",
        )
        self.notify_topics = arn(
            service="sns", resource=f"{NOTIFY_TOPIC_PREFIX}*", arn_format=ArnFormat.NO_RESOURCE_NAME
        )
        self.state_machine = arn(
            service="states",
            resource="stateMachine",
            resource_name=state_machine_name,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.executions = arn(
            service="states",
            resource="execution",
            resource_name=f"{state_machine_name}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.bucket = bucket.bucket_arn
        self.done = bucket.arn_for_objects("runs/*/DONE.json")
        self.attempts = bucket.arn_for_objects("runs/*/attempts.json")
        self.status = bucket.arn_for_objects("runs/*/status.json")
        self.controller = bucket.arn_for_objects("runs/*/controller.json")
        self.launches = bucket.arn_for_objects("runs/*/launches/*")
        # An operator's hold (`horovod-fleet hold`), which the controller only reads.
        self.hold = bucket.arn_for_objects("runs/*/hold.json")
        # The nodes' own records a relaunch weighs each node by (steps_fleet.py): a node's
        # failure, its Spot notice.
        self.said = [
            bucket.arn_for_objects(f"runs/*/{kind}/*") for kind in ("failures", "interruptions")
        ]

    def wildcards(self) -> list[str]:
        return [
            self.train_stack,
            self.instances,
            self.launch_templates,
            *self.network,
            *self.launched,
            self.train_roles,
            self.alarms,
            self.cap_schedules,
            self.notify_topics,
            self.executions,
            self.done,
            self.attempts,
            self.status,
            self.controller,
            self.launches,
            self.hold,
            *self.said,
            "*",
        ]


# What CloudFormation made for TrainStack carries its own tag naming the stack, which no one
# else can set (aws: tags are reserved).
TRAIN_STACK_TAGGED = {
    "StringEquals": {
        "aws:ResourceTag/aws:cloudformation:stack-name": TRAIN_STACK_NAME,
        "aws:ResourceTag/Project": PROJECT,
    }
}
FLEET_ACTIONS = [
    "ec2:TerminateInstances",
    "ec2:StopInstances",
    "ec2:StartInstances",
    "ec2:RebootInstances",
]


def fleet_tagged(arns: ControllerArns) -> dict:
    """The instances the controller launched carry TrainStack's id in the fleet's tag (their
    launch templates set it)."""
    return {
        "StringLike": {f"aws:ResourceTag/{FLEET_TAG}": arns.train_stack},
        "StringEquals": {"aws:ResourceTag/Project": PROJECT},
    }


def reads(arns: ControllerArns, *objects: str) -> list[iam.PolicyStatement]:
    """GetObject on the records, and ListBucket without a prefix condition: with it, S3 answers a
    read of a missing key with 404 (absent) and keeps 403 for a refusal, which the controller
    then never takes for an absent record ("If you have the s3:ListBucket permission on the
    bucket, Amazon S3 returns an HTTP status code 404 (Not Found) error",
    https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html). It also lists the
    heartbeats, the launch assignments, the checkpoints and the logs of runs/<run>/."""
    return [
        iam.PolicyStatement(actions=["s3:ListBucket"], resources=[arns.bucket]),
        iam.PolicyStatement(actions=["s3:GetObject"], resources=list(objects)),
    ]


def describes(*actions: str) -> iam.PolicyStatement:
    """Describe calls support no resource-level permissions; they are read-only."""
    return iam.PolicyStatement(actions=list(actions), resources=["*"])


def cleanup_statements(arns: ControllerArns) -> list[iam.PolicyStatement]:
    return [
        iam.PolicyStatement(
            actions=["cloudformation:DescribeStacks"], resources=[arns.train_stack]
        ),
        describes("ec2:DescribeInstances"),
        iam.PolicyStatement(
            actions=["ec2:TerminateInstances"],
            resources=[arns.instances],
            conditions=fleet_tagged(arns),
        ),
    ]


def steps_statements(arns: ControllerArns) -> list[iam.PolicyStatement]:
    """The tick and the workflow's steps: read and record the run, reboot, stop, start, launch and
    terminate its fleet (and the fleet instances no stack claims: orphans), delete TrainStack,
    start, watch and stop the controller's own executions."""
    return [
        # launches/: the controller's own assignments, read back to replace a lost node of an
        # elastic fleet once per number (controller/replace.py).
        # hold.json: an operator's hold, read, never written (controller/observe.py); failures/
        # and interruptions/: the nodes' own records a relaunch weighs each node by.
        *reads(
            arns,
            arns.done,
            arns.attempts,
            arns.status,
            arns.controller,
            arns.launches,
            arns.hold,
            *arns.said,
        ),
        # Checkpoints and logs are listed (results), never read.
        iam.PolicyStatement(
            actions=["s3:PutObject"],
            resources=[arns.done, arns.attempts, arns.controller, arns.launches],
        ),
        # A relaunch removes DONE.json, which would end the next attempt's members at once.
        iam.PolicyStatement(actions=["s3:DeleteObject"], resources=[arns.done]),
        iam.PolicyStatement(
            actions=[
                "cloudformation:DescribeStacks",
                "cloudformation:DescribeStackEvents",
                "cloudformation:DescribeStackResources",
                "cloudformation:DeleteStack",
            ],
            resources=[arns.train_stack],
        ),
        # Every alarm of the account and region, read-only: CloudWatch has been seen to
        # authorise DescribeAlarms against alarm:*, and a denial would leave an idle fleet.
        iam.PolicyStatement(actions=["cloudwatch:DescribeAlarms"], resources=[arns.alarms]),
        iam.PolicyStatement(actions=["sns:Publish"], resources=[arns.notify_topics]),
        iam.PolicyStatement(actions=["scheduler:GetSchedule"], resources=[arns.cap_schedules]),
        describes(
            "ec2:DescribeInstances",
            "ec2:DescribeInstanceStatus",
            "ec2:DescribeLaunchTemplateVersions",
        ),
        iam.PolicyStatement(
            actions=FLEET_ACTIONS, resources=[arns.instances], conditions=TRAIN_STACK_TAGGED
        ),
        iam.PolicyStatement(
            actions=FLEET_ACTIONS, resources=[arns.instances], conditions=fleet_tagged(arns)
        ),
        *launch_statements(arns),
        iam.PolicyStatement(
            actions=["states:ListExecutions", "states:StartExecution"],
            resources=[arns.state_machine],
        ),
        # The hard cap ends the run's other executions.
        iam.PolicyStatement(actions=["states:StopExecution"], resources=[arns.executions]),
    ]


def launch_statements(arns: ControllerArns) -> list[iam.PolicyStatement]:
    """RunInstances only from a launch template tagged as TrainStack's, AWS's example policy
    "launch instances only from a specific launch template" with the tagging it needs
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ExamplePolicies_EC2.html,
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/use-launch-templates-to-control-launching-instances.html):
    everything from the template (ec2:IsLaunchTemplateResource), except what a launch in
    another zone names itself, the subnet, security group and placement group TrainStack made
    (its CloudFormation tag) and the interfaces in them."""
    from_template = {"ArnLike": {"ec2:LaunchTemplate": arns.launch_templates}}
    return [
        iam.PolicyStatement(
            actions=["ec2:RunInstances"],
            resources=["*"],
            conditions={**from_template, "Bool": {"ec2:IsLaunchTemplateResource": "true"}},
        ),
        iam.PolicyStatement(
            actions=["ec2:RunInstances"],
            resources=arns.network,
            conditions={**from_template, **TRAIN_STACK_TAGGED},
        ),
        iam.PolicyStatement(
            actions=["ec2:RunInstances"],
            resources=[arns.launched[1]],
            conditions=from_template,
        ),
        iam.PolicyStatement(
            effect=iam.Effect.DENY,
            actions=["ec2:RunInstances"],
            resources=[arns.launch_templates],
            conditions={"StringNotLike": {f"aws:ResourceTag/{FLEET_TAG}": arns.train_stack}},
        ),
        iam.PolicyStatement(
            actions=["ec2:CreateTags"],
            resources=[arns.instances, *arns.launched],
            conditions={"StringEquals": {"ec2:CreateAction": "RunInstances"}},
        ),
        # A launched node's index, on the fleet's instances only and no other key
        # (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_examples_iam-add-tag-user-role.html:
        # "ForAllValues:StringEquals ... the only tag key in the request must be" the one named).
        iam.PolicyStatement(
            actions=["ec2:CreateTags"],
            resources=[arns.instances],
            conditions={
                **fleet_tagged(arns),
                "ForAllValues:StringEquals": {"aws:TagKeys": [NODE_TAG]},
            },
        ),
        # The nodes' role, named in the launch templates' instance profile.
        iam.PolicyStatement(
            actions=["iam:PassRole"],
            resources=[arns.train_roles],
            conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
        ),
    ]
