"""DrillExperiments: a drill's experiments (-c drill=true, issue 49) as AWS FIS experiment
templates in TrainStack, the role FIS plays them with, and the head's role that starts them.

Each experiment of the plan (contract/drill.py) is one `AWS::FIS::ExperimentTemplate` (the CDK
has only the L1, aws_cdk.aws_fis.CfnExperimentTemplate). Its targets are this run's only: an
instance by the run's tags (the fleet's tag holding TrainStack's id, and the role tag of a
training node or the head's node tag), running, one of them (COUNT(1)); the controller's role
and the fleet's subnet by ARN. Tags and ARNs cannot be mixed in one target, and "If no targets
are found, the experiment fails"
(https://docs.aws.amazon.com/fis/latest/userguide/targets.html): a mistagged fleet fails the
experiment, it never hits another run. A stop condition on the run controller's tick-errors
alarm ends any experiment while the controller is failing
(https://docs.aws.amazon.com/fis/latest/userguide/stop-conditions.html).

FIS's role may do only the planned actions on those targets: each action's permissions from
the actions reference (https://docs.aws.amazon.com/fis/latest/userguide/fis-actions-reference.html),
scoped by tag or ARN; where an action takes no resource (the Describe calls, ec2:InjectApiError)
the resource is "*", bounded by the condition keys FIS sets (ec2:FisActionId, ec2:FisTargetArns;
fis:Service, fis:Operations, fis:Targets:
https://docs.aws.amazon.com/fis/latest/userguide/security_iam_id-based-policy-examples.html#security-iam-policy-examples-ec2,
https://docs.aws.amazon.com/service-authorization/latest/reference/list_awsfaultinjectionservice.html).
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_fis as fis
from aws_cdk import aws_iam as iam
from constructs import Construct

from contract import drill
from contract.names import FLEET_TAG, HEAD_NODE, NODE_TAG, ROLE_TAG, TRAIN_ROLE
from stacks.drill_plan import DrillPlan
from stacks.nag import SSM_MANAGED_POLICY, acknowledge_ssm_policy, acknowledge_wildcard_resources
from stacks.teardown.controller_policy import describes

STOP_SOURCE = "aws:cloudwatch:alarm"
# FIS's service-linked role resolves the targets; the account may not have it before its first
# experiment, and StartExperiment creates it (AWS's "Start an experiment" example policy).
FIS_SERVICE = "fis.amazonaws.com"
# disrupt-connectivity clones the subnet's network ACL, tagged so, and deletes the clone after.
FIS_TAG = "managedByFIS"


@dataclass(frozen=True)
class DrillTargets:
    """Where a drill's faults land, as TrainStack holds them (tokens resolved at deploy)."""

    fleet_tag: str  # the FLEET_TAG value of the run's instances: TrainStack's id
    vpc_id: str
    subnet_id: str  # the fleet's subnet (where the nodes and the head are)
    zone: str  # the fleet's zone: the deploy-time zone answer, for `{zone}` parameters
    controller_role_arn: str  # the run controller's tick and steps (TeardownStack)
    stop_alarm_arn: str  # the run controller's TickErrorsAlarm (TeardownStack)


class DrillExperiments(Construct):
    """One FIS experiment template per planned experiment (`templates`, by name), FIS's role,
    and node.json's `drill` object (`document`) with each template's id."""

    def __init__(
        self, scope: Construct, construct_id: str, *, plan: DrillPlan, targets: DrillTargets
    ) -> None:
        super().__init__(scope, construct_id)
        self._targets = targets
        self.head_policy: iam.Policy | None = None  # head_profile's
        stack = Stack.of(self)
        self.role = iam.Role(
            self,
            "FisRole",
            assumed_by=iam.ServicePrincipal(
                FIS_SERVICE,
                # The confused deputy's guard: only this account's experiments may assume it
                # (https://docs.aws.amazon.com/resilience-hub/latest/userguide/next-gen-resilience-testing-iam-single-account.html;
                # FIS's own page on its service role,
                # https://docs.aws.amazon.com/fis/latest/userguide/getting-started-iam-service-role.html).
                conditions={
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {"aws:SourceArn": self._fis_arn("experiment")},
                },
            ),
            description="horovod-fleet drill: the faults of the run's FIS experiments, only on its "
            "own instances, subnet and run controller",
        )
        policy = iam.Policy(self, "FisPolicy", roles=[self.role], statements=self._statements(plan))
        acknowledge_wildcard_resources(
            policy,
            [self._ec2_arn(kind) for kind in ("instance", "network-acl")]
            + [self._fis_arn("experiment"), self._prefix_lists(), "*"],
            "The run's instances only by its tags (the fleet's tag of this TrainStack, the role "
            "or node tag); the network ACLs FIS clones and tags managedByFIS, and the association "
            "it restores; the managed prefix lists the S3 cut reads; the API-error actions only "
            "with FIS's condition keys naming the action, the service, the operations and the "
            "run controller's role; the read-only Describe calls, which take no resource.",
        )
        self.templates = {
            experiment.name: self._template(experiment, policy) for experiment in plan.experiments
        }
        self.document = plan.document({name: t.ref for name, t in self.templates.items()})

    def head_profile(self, fleet_policy: iam.Policy) -> iam.CfnInstanceProfile:
        """The head's own role in a drill: the nodes' policy, and starting, reading and stopping
        the drill's experiments, which no node may."""
        role = iam.Role(
            self,
            "HeadRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="horovod-fleet drill: the head, which also starts the drill's experiments",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(SSM_MANAGED_POLICY)],
        )
        acknowledge_ssm_policy(role)
        fleet_policy.attach_to_role(role)
        experiments = self._fis_arn("experiment")
        starter = iam.Policy(
            self,
            "HeadPolicy",
            roles=[role],
            statements=[
                # StartExperiment authorizes against the template and the new experiment, and
                # FIS's service-linked role is made at the account's first experiment (AWS's
                # "Start an experiment" example, https://docs.aws.amazon.com/fis/latest/userguide/security_iam_id-based-policy-examples.html#security-iam-policy-examples-start-experiment).
                iam.PolicyStatement(
                    actions=["fis:StartExperiment"],
                    resources=[
                        *(
                            self._fis_arn("experiment-template", t.ref)
                            for t in self.templates.values()
                        ),
                        experiments,
                    ],
                ),
                iam.PolicyStatement(
                    actions=["fis:GetExperiment", "fis:StopExperiment"], resources=[experiments]
                ),
                iam.PolicyStatement(
                    actions=["iam:CreateServiceLinkedRole"],
                    resources=["*"],
                    conditions={"StringEquals": {"iam:AWSServiceName": FIS_SERVICE}},
                ),
            ],
        )
        acknowledge_wildcard_resources(
            starter,
            [experiments, "*"],
            "Experiment ids are made when the head starts one, from the drill's own templates "
            "only; the service-linked role only of FIS (iam:AWSServiceName), as AWS's example "
            "policy for starting an experiment has it.",
        )
        self.head_policy = starter
        return iam.CfnInstanceProfile(self, "HeadProfile", roles=[role.role_name])

    def _template(self, experiment: drill.Experiment, policy: iam.Policy):
        """The experiment's FIS template: one target per kind its actions aim at, its actions
        at once, the controller's alarm as its stop condition, and no target means failure."""
        kinds = sorted({action.target for action in experiment.actions})
        template = fis.CfnExperimentTemplate(
            self,
            "".join(part.title() for part in experiment.name.split("-")),
            description=f"horovod-fleet drill: {experiment.what}",
            role_arn=self.role.role_arn,
            targets={kind: self._target(kind) for kind in kinds},
            actions={
                action.name: fis.CfnExperimentTemplate.ExperimentTemplateActionProperty(
                    action_id=action.action_id,
                    parameters={k: self._value(v) for k, v in action.parameters} or None,
                    targets={drill.TARGETS[action.target][1]: action.target},
                )
                for action in experiment.actions
            },
            stop_conditions=[
                fis.CfnExperimentTemplate.ExperimentTemplateStopConditionProperty(
                    source=STOP_SOURCE, value=self._targets.stop_alarm_arn
                )
            ],
            experiment_options=fis.CfnExperimentTemplate.ExperimentTemplateExperimentOptionsProperty(
                empty_target_resolution_mode="fail"
            ),
            tags={"Name": f"horovod-fleet-drill-{experiment.name}"},
        )
        # The role's permissions exist before any template names it.
        template.add_resource_dependency(policy.node.default_child)
        return template

    def _target(self, kind: str) -> fis.CfnExperimentTemplate.ExperimentTemplateTargetProperty:
        resource_type = drill.TARGETS[kind][0]
        if kind == drill.CONTROLLER_ROLE:
            arns = [self._targets.controller_role_arn]
        elif kind == drill.FLEET_SUBNET:
            arns = [self._ec2_arn("subnet", self._targets.subnet_id)]
        else:
            return fis.CfnExperimentTemplate.ExperimentTemplateTargetProperty(
                resource_type=resource_type,
                resource_tags=self._tags(kind),
                # DescribeInstances lists recently terminated instances too (targets page).
                filters=[
                    fis.CfnExperimentTemplate.ExperimentTemplateTargetFilterProperty(
                        path="State.Name", values=["running"]
                    )
                ],
                selection_mode="COUNT(1)",
            )
        return fis.CfnExperimentTemplate.ExperimentTemplateTargetProperty(
            resource_type=resource_type, resource_arns=arns, selection_mode="ALL"
        )

    def _tags(self, kind: str) -> dict[str, str]:
        """The run's instance of this kind: the fleet's tag, and a training node's role tag or
        the head's node tag (several tags must all match, the targets page)."""
        own = {NODE_TAG: HEAD_NODE} if kind == drill.HEAD else {ROLE_TAG: TRAIN_ROLE}
        return {FLEET_TAG: self._targets.fleet_tag, **own}

    def _value(self, value: str) -> str:
        return self._targets.zone if value == drill.ZONE else value

    def _statements(self, plan: DrillPlan) -> list[iam.PolicyStatement]:
        """What FIS needs for the plan's actions, and nothing for an action it does not play."""
        statements: list[iam.PolicyStatement] = []
        played = {(a.action_id, a.target): a for e in plan.experiments for a in e.actions}
        # Without startInstancesAfterDuration a stop needs no ec2:StartInstances (nor the KMS
        # grant that restarting an encrypted volume does): the instance stays stopped.
        on_instances = {drill.TERMINATE: "ec2:TerminateInstances",
                        drill.STOP: "ec2:StopInstances",
                        drill.SPOT_INTERRUPTION: "ec2:SendSpotInstanceInterruptions"}  # fmt: skip
        for (action_id, kind), action in sorted(played.items()):
            if action_id in on_instances:
                statements.append(self._on_instances(on_instances[action_id], kind))
            elif action_id == drill.INSUFFICIENT_CAPACITY:
                statements.append(self._capacity_error())
            elif action_id == drill.THROTTLE:
                statements.append(self._throttle(dict(action.parameters)))
            elif action_id == drill.DISRUPT_CONNECTIVITY:
                statements += self._disrupt_connectivity()
        if any(action_id in on_instances for action_id, _ in played):
            statements.append(describes("ec2:DescribeInstances"))
        return statements

    def _on_instances(self, action: str, kind: str) -> iam.PolicyStatement:
        return iam.PolicyStatement(
            actions=[action],
            resources=[self._ec2_arn("instance")],
            conditions={
                "StringEquals": {f"aws:ResourceTag/{k}": v for k, v in self._tags(kind).items()}
            },
        )

    def _capacity_error(self) -> iam.PolicyStatement:
        """InsufficientInstanceCapacity injected into the controller's calls: this action on the
        controller's role only (AWS's example has the two conditions in two statements, either
        of which allows; here both must hold)."""
        return iam.PolicyStatement(
            actions=["ec2:InjectApiError"],
            resources=["*"],
            conditions={
                "StringEquals": {"ec2:FisActionId": drill.INSUFFICIENT_CAPACITY},
                "ForAllValues:ArnLike": {"ec2:FisTargetArns": [self._targets.controller_role_arn]},
            },
        )

    def _throttle(self, parameters: dict[str, str]) -> iam.PolicyStatement:
        """Throttling of the planned service's planned operations of the controller's role
        (fis:Service is a String, fis:Operations and fis:Targets ArrayOfString: the service
        authorization reference above)."""
        return iam.PolicyStatement(
            actions=["fis:InjectApiThrottleError"],
            resources=[self._fis_arn("experiment")],
            conditions={
                "StringEquals": {"fis:Service": parameters["service"]},
                "ForAllValues:StringEquals": {
                    "fis:Operations": parameters["operations"].split(","),
                    "fis:Targets": [self._targets.controller_role_arn],
                },
            },
        )

    def _disrupt_connectivity(self) -> list[iam.PolicyStatement]:
        """aws:network:disrupt-connectivity's permissions (the actions reference): a clone of the
        subnet's network ACL in the fleet's VPC, tagged managedByFIS, associated with the fleet's
        subnet for the duration, then the original association back and the clone deleted; as
        the managed policy AWSFaultInjectionSimulatorNetworkAccess scopes them
        (https://docs.aws.amazon.com/aws-managed-policy/latest/reference/AWSFaultInjectionSimulatorNetworkAccess.html),
        here to the fleet's VPC and subnet."""
        acl = self._ec2_arn("network-acl")
        vpc = self._ec2_arn("vpc", self._targets.vpc_id)
        tagged = {"StringEquals": {f"ec2:ResourceTag/{FIS_TAG}": "true"}}
        return [
            iam.PolicyStatement(
                actions=["ec2:CreateNetworkAcl"],
                resources=[acl],
                conditions={"StringEquals": {f"aws:RequestTag/{FIS_TAG}": "true"}},
            ),
            iam.PolicyStatement(actions=["ec2:CreateNetworkAcl"], resources=[vpc]),
            iam.PolicyStatement(
                actions=["ec2:CreateTags"],
                resources=[acl],
                conditions={
                    "StringEquals": {
                        "ec2:CreateAction": "CreateNetworkAcl",
                        f"aws:RequestTag/{FIS_TAG}": "true",
                    }
                },
            ),
            iam.PolicyStatement(
                actions=["ec2:CreateNetworkAclEntry", "ec2:DeleteNetworkAcl"],
                resources=[acl, vpc],
                conditions=tagged,
            ),
            iam.PolicyStatement(
                actions=["ec2:ReplaceNetworkAclAssociation"],
                resources=[self._ec2_arn("subnet", self._targets.subnet_id), acl],
            ),
            iam.PolicyStatement(
                actions=["ec2:GetManagedPrefixListEntries"], resources=[self._prefix_lists()]
            ),
            describes(
                "ec2:DescribeManagedPrefixLists",
                "ec2:DescribeNetworkAcls",
                "ec2:DescribeSubnets",
                "ec2:DescribeVpcs",
            ),
        ]

    def _ec2_arn(self, kind: str, name: str = "*") -> str:
        return Stack.of(self).format_arn(service="ec2", resource=kind, resource_name=name)

    def _prefix_lists(self) -> str:
        """The region's managed prefix lists, AWS's own among them (the S3 cut reads S3's)."""
        return Stack.of(self).format_arn(
            service="ec2", resource="prefix-list", resource_name="*", account="*"
        )

    def _fis_arn(self, kind: str, name: str = "*") -> str:
        return Stack.of(self).format_arn(
            service="fis",
            resource=kind,
            resource_name=name,
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )
