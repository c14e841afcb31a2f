"""TrainStack: the fleet of one run, its network, and the guard that deletes it when done."""

from aws_cdk import CfnOutput, Stack, Tags
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from contract.drill import TEMPLATES_OUTPUT_KEY
from contract.names import (
    DATASET_TYPE,
    HEAD_TEMPLATE_OUTPUT_KEY,
    HEARTBEAT_TAG,
    MIN_NODES_OUTPUT_KEY,
    NODES_OUTPUT_KEY,
    NODES_TAG,
    NOTIFY_OUTPUT_KEY,
    NOTIFY_TOPIC_PREFIX,
    PROJECT,
    PROJECT_TAG,
    REPLACEMENT_OUTPUT_KEY,
    REPLACEMENTS_PER_NODE,
    REPLACEMENTS_TYPE,
    ROLE_TAG,
    RUN_TAG,
    STARTUP_GRACE_TAG,
    TRAIN_ROLE,
    ZONE_TYPE,
    ZONES_OUTPUT_KEY,
)
from stacks import root_volume
from stacks.config import FleetConfig
from stacks.instance_types import HEAD_TYPE
from stacks.network import SingleZoneNetwork, move_slots
from stacks.teardown.answered import answered
from stacks.teardown.guards import FleetGuards
from stacks.teardown.run_guard import RunGuard
from stacks.train.code_guard import code_guard
from stacks.train.dashboard import RunDashboard
from stacks.train.drill import DrillExperiments, DrillTargets
from stacks.train.fleet import SIGNAL_TIMEOUT, GpuFleet
from stacks.train.head import Head
from stacks.train.image_check import baked_image
from stacks.train.node_document import HEARTBEAT_TIMEOUT_S, STARTUP_GRACE_S
from stacks.train.run_record import run_check, run_record

# How long the head's elastic driver waits for at least minNodes nodes' slots after a reset (and
# for every node's at the start) before the attempt ends (HOROVOD_ELASTIC_TIMEOUT, 600 s in
# Horovod 0.28.1, horovod/runner/elastic/driver.py ELASTIC_TIMEOUT_SECS). A replacement takes
# minutes to boot and pull its data, so waiting longer only bills the survivors: fewer than
# minNodes left is the relaunch's, at once.
ELASTIC_TIMEOUT_S = 120


def elastic_settings(config: FleetConfig) -> dict:
    """The head's elastic horovodrun settings, in every node's node.json (docs/contracts.md):
    the fewest nodes a reset trains on, how many resets an attempt allows (every node lost and
    joined again as often as the controller replaces it, and lost once more), the wait above."""
    return {
        "min_nodes": config.min_nodes,
        "reset_limit": config.nodes * (2 * REPLACEMENTS_PER_NODE + 1),
        "elastic_timeout_s": ELASTIC_TIMEOUT_S,
    }


class TrainStack(Stack):
    """The fleet of one run, its network, and the guard that deletes it when done, capped or idle."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: FleetConfig,
        bucket: s3.IBucket,
        guards: FleetGuards,
        image_id: str | None,
        image_version: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        Tags.of(self).add(PROJECT_TAG, PROJECT)
        Tags.of(self).add(RUN_TAG, config.run)
        self._controller_tags(config)
        # Construct ids and their order are the template's logical ids: the parts below keep
        # the ids and scope the one constructor had, so a split changes no resource.
        fixed_zone = config.placement.vpc_id is not None or config.capacity_reservation is not None
        slots = 0 if fixed_zone else move_slots(config.region)
        zone = self._zone(config, guards, fixed_zone, slots)
        prerequisites = [zone]  # answered before any instance launches
        if image_id is None:  # ImageStack's image (image_check.py), else -c ami=
            # Answered before any instance launches: each names its ImageId (no DependsOn needed).
            image_id = baked_image(self, guards=guards, version=image_version or "").get_att_string(
                "ImageId"
            )
        network = SingleZoneNetwork(
            self,
            "Network",
            placement=config.placement,
            private=True,
            deploy_time_zone=None if fixed_zone else zone.get_att_string("Zone"),
        )
        move_zones = [zone.get_att_string(f"Zone{slot}") for slot in range(1, slots + 1)]
        move_subnets = network.move_subnets(move_zones)
        drill = self._drill(config, guards, zone, network)
        fleet = GpuFleet(
            self,
            "Fleet",
            vpc=network.vpc,
            subnet=network.subnet,
            gpu=config.gpu,
            nodes=config.nodes,
            image_id=image_id,
            bucket=bucket,
            dataset_prefix=config.dataset_prefix,
            run=config.run,
            trainer=config.trainer,
            capacity_reservation=config.capacity_reservation,
            market=config.market,
            benchmark=config.benchmark_plan,
            max_hours=config.max_hours,
            notify_topic=self._notifications(config.run, config.notify_email),
            move_slots=slots,
            elastic=elastic_settings(config),
            # A drill's roots load lazily: an initialization's charge would double its cost.
            init_rate=None if drill else root_volume.init_rate(config.nodes),
            drill=drill.document if drill else None,
        )
        if drill:  # what its experiments aim at: a training node, never the head
            for node in fleet.instances:
                Tags.of(node).add(ROLE_TAG, TRAIN_ROLE)
        head = Head(
            self,
            "Head",
            subnet=network.subnet,
            security_group=fleet.security_group,
            profile=drill.head_profile(fleet.policy) if drill else fleet.profile,
            policy=fleet.policy,
            code=fleet.code,
            image_id=image_id,
            bucket=bucket,
            log_group_name=fleet.log_group.log_group_name,
            run=config.run,
            fleet_document=fleet.fleet_document,
            signal_timeout=SIGNAL_TIMEOUT,
            init_rate=None if drill else root_volume.head_init_rate(config.nodes),
        )
        if config.benchmark in (None, "data"):
            prerequisites.append(self._dataset_check(config, bucket, guards))
        # A redeploy of the run with other training values, refused before any launch.
        prerequisites.append(run_check(self, guards=guards, config=config, bucket=bucket))
        for instance in (*fleet.instances, head.instance):
            instance.node.add_dependency(*prerequisites)
        guard = self._guards(config, guards, bucket, fleet, head, drill)
        self._relaunch_places(config, guards, zone, network, fleet, move_zones, move_subnets)
        CfnOutput(
            self,
            "HeadTemplate",
            description="The launch template the run controller launches the head from again",
            value=head.replacement.ref,
        ).override_logical_id(HEAD_TEMPLATE_OUTPUT_KEY)
        dashboard = RunDashboard(
            self,
            "Watch",
            run=config.run,
            gpu=config.gpu,
            nodes=config.nodes,
            max_hours=config.max_hours,
            instances=fleet.instances,
            idle_alarm=guard.idle_alarm,
        )
        self._outputs(config, bucket, head, dashboard)

    def _guards(
        self,
        config: FleetConfig,
        guards: FleetGuards,
        bucket: s3.IBucket,
        fleet: GpuFleet,
        head: Head,
        drill,
    ) -> RunGuard:
        """The code guard, the run's guard (its hard cap and idle alarm) and the run's record."""
        # Updated before every node, the head and the replacement template: a deploy that would
        # change what a live fleet runs is refused there, before any node restarts on its old
        # code. The head's user data differs from node 0's only in its role and signal.
        code = code_guard(
            self, guards=guards, run=config.run, bucket=bucket.bucket_name, fleet=fleet
        )
        head.instance.add_resource_dependency(code.node.default_child)
        head.replacement.add_resource_dependency(code.node.default_child)
        if drill:
            head.instance.add_resource_dependency(drill.head_policy.node.default_child)
        guard = RunGuard(
            self,
            "Guard",
            guards=guards,
            run_name=config.run,
            max_hours=config.max_hours,
            max_restarts=0 if config.benchmark else config.max_restarts,
            instances=[*fleet.instances, head.instance],
        )
        # runs/<run>/config.json, once every node and the head are up (run_record.py).
        run_record(
            self,
            guards=guards,
            config=config,
            bucket=bucket,
            after=[*fleet.instances, head.instance],
        )
        return guard

    def _drill(self, config: FleetConfig, guards: FleetGuards, zone, network):
        """-c drill=true: the plan's FIS experiment templates, aimed at this run's instances,
        its subnet and the run controller's role (None: no drill, and nothing of it here)."""
        if config.drill is None:
            return None
        drill = DrillExperiments(
            self,
            "Drill",
            plan=config.drill,
            targets=DrillTargets(
                fleet_tag=self.stack_id,
                vpc_id=network.vpc.vpc_id,
                subnet_id=network.subnet.subnet_id,
                zone=zone.get_att_string("Zone"),
                controller_role_arn=guards.controller_role.role_arn,
                stop_alarm_arn=guards.tick_errors_alarm.alarm_arn,
            ),
        )
        CfnOutput(
            self,
            "DrillExperiments",
            description="The drill's FIS experiment templates, by experiment, in their order",
            value=self.to_json_string({n: t.ref for n, t in drill.templates.items()}),
        ).override_logical_id(TEMPLATES_OUTPUT_KEY)
        return drill

    def _controller_tags(self, config: FleetConfig) -> None:
        """What the run controller's tick reads from the stack while it is still being created,
        when it has no outputs (controller/train_stack.py): stack-level tags,
        which the CDK CLI passes to CreateStack (with @aws-cdk/core:explicitStackTags, only
        tags set on the stack itself are). Only values that cannot change while a fleet lives
        (each is in node.json, which the code guard keeps): CloudFormation applies stack tags to
        the resources, and a changed stack tag has replaced a resource
        (https://github.com/aws-cloudformation/cloudformation-coverage-roadmap/issues/538).
        maxRestarts and maxHours, which a deploy may change over a live fleet, stay outputs and
        the cap's schedule."""
        for tag, value in {
            RUN_TAG: config.run,
            NODES_TAG: config.nodes,
            HEARTBEAT_TAG: HEARTBEAT_TIMEOUT_S,
            STARTUP_GRACE_TAG: STARTUP_GRACE_S,
        }.items():
            self.tags.set_tag(tag, str(value))

    def _zone(self, config: FleetConfig, guards: FleetGuards, fixed: bool, slots: int):
        """The fleet's zone, answered at deploy. Not every zone offers every GPU type, and zone
        names differ between accounts: the answer is the placement's zone if it offers the type, else one
        that does. A given subnet or capacity reservation fixes the zone; then the type must be
        there. That zone may be a zone ID (use1-az4): the answer is this account's zone name.
        It also answers the zone of each move slot (Zone1, ...): where the fleet may go when
        its zone has no capacity. Which zones offer the type is known only at deploy, and
        CloudFormation cannot make a resource per element of a deploy-time list, so the slots
        are as many as the region has other zones, and a slot no other zone fills answers the
        fleet's own zone (a spare subnet and group, which cost nothing)."""
        return answered(
            self,
            "Zone",
            guards=guards,
            resource_type=ZONE_TYPE,
            properties={
                "InstanceType": config.gpu.name,
                # Empty without -c az: the region's first zone that offers both types.
                "PreferredZone": config.placement.preferred_zone,
                "Fixed": str(fixed).lower(),
                # The head stays in the deployed zone: that zone must offer its type too.
                "HeadInstanceType": HEAD_TYPE.name,
                "MoveSlots": str(slots),
                # What the answer holds. A new attribute changes this, so CloudFormation sends
                # the stacks deployed before it an Update, whose answer has it, instead of
                # failing on the attribute their stored answer lacks.
                "Answers": ",".join(["Zone", "Zones", *(f"Zone{s}" for s in range(1, slots + 1))]),
            },
        )

    def _dataset_check(self, config: FleetConfig, bucket: s3.IBucket, guards: FleetGuards):
        """The nodes pull the dataset at boot: without its manifest none of them could train, so
        the deploy fails before the first instance launches (answered at deploy)."""
        return answered(
            self,
            "Dataset",
            guards=guards,
            resource_type=DATASET_TYPE,
            properties={
                "Bucket": bucket.bucket_name,
                "Key": f"{config.dataset_prefix}manifest.json",
            },
        )

    def _relaunch_places(self, config, guards, zone, network, fleet, move_zones, move_subnets):
        """What a relaunch needs from the stack: the replacement template, where it may launch,
        and the resource that ends the nodes it launched when the stack goes."""
        # The run controller launches the nodes EC2 terminated from the replacement template, out
        # of CloudFormation's sight: this resource, deleted before any of the fleet's, has the
        # run controller's cleanup terminate those instances first (their interfaces would hold up the delete).
        replacements = answered(
            self,
            "Replacements",
            guards=guards,
            resource_type=REPLACEMENTS_TYPE,
            properties={"Run": config.run},
        )
        replacements.node.add_dependency(fleet, network)
        CfnOutput(
            self, "ReplacementTemplate", value=fleet.replacement_template.ref
        ).override_logical_id(REPLACEMENT_OUTPUT_KEY)
        CfnOutput(self, "Nodes", value=str(config.nodes)).override_logical_id(NODES_OUTPUT_KEY)
        CfnOutput(self, "MinNodes", value=str(config.min_nodes)).override_logical_id(
            MIN_NODES_OUTPUT_KEY
        )
        # Where a relaunch may launch the fleet, in the order it tries them: the deployed zone's
        # own subnet and group first (the launch templates name them), then each move slot's
        # (docs/contracts.md). Only the first when the zone is fixed.
        places = [
            (zone.get_att_string("Zone"), network.subnet.subnet_id, fleet.placement_group),
            *(
                (name, subnet.ref, group)
                for name, subnet, group in zip(
                    move_zones, move_subnets, fleet.move_groups, strict=True
                )
            ),
        ]
        CfnOutput(
            self,
            "Zones",
            value=self.to_json_string(
                {
                    "zones": [
                        {"zone": name, "subnet": subnet, "group": group.placement_group_name}
                        for name, subnet, group in places
                    ]
                }
            ),
        ).override_logical_id(ZONES_OUTPUT_KEY)

    def _outputs(self, config: FleetConfig, bucket: s3.IBucket, head: Head, dashboard) -> None:
        """Where the user looks: the dashboard, the watch command, the results, the logs and a
        shell on the head."""
        CfnOutput(self, "Dashboard", value=dashboard.url)
        CfnOutput(self, "WatchCommand", value=dashboard.watch_command)
        CfnOutput(self, "Results", value=f"s3://{bucket.bucket_name}/runs/{config.run}/")
        if config.benchmark:
            results = f"s3://{bucket.bucket_name}/runs/{config.run}/"
            CfnOutput(
                self,
                "Benchmark",
                description="The benchmark's table (JSON, Markdown, chart), written by the head",
                value=" ".join(f"{results}benchmark.{ext}" for ext in ("json", "md", "png")),
            )
        CfnOutput(self, "LogGroup", value=head.log_group_name)
        CfnOutput(
            self,
            "HeadSession",
            description="Open a shell on the head, which runs horovodrun",
            value=f"aws ssm start-session --region {self.region} --target {head.instance.ref}",
        )

    def _notifications(self, run: str, email: str | None) -> sns.Topic | None:
        """With notifyEmail: a topic the leader publishes its start and end mails to, and the
        address subscribed (AWS mails a confirmation link first)."""
        if email is None:
            return None
        topic = sns.Topic(
            self,
            "Notifications",
            # The run controller may publish to topics of this prefix only (TeardownStack).
            topic_name=f"{NOTIFY_TOPIC_PREFIX}{run}",
            display_name="horovod-fleet",
            enforce_ssl=True,
            master_key=kms.Alias.from_alias_name(self, "SnsKey", "alias/aws/sns"),
        )
        topic.add_subscription(subscriptions.EmailSubscription(email))
        CfnOutput(self, NOTIFY_OUTPUT_KEY, value=topic.topic_arn)
        return topic
