"""PreprocessStack: the preprocessing node in its own single-AZ network, registered with
TeardownStack's preprocessing stop."""

from aws_cdk import (
    CfnOutput,
    Stack,
    Tags,
)
from aws_cdk import aws_s3 as s3
from constructs import Construct

from contract.names import PROJECT, PROJECT_TAG, ZONE_TYPE
from stacks.config import FleetConfig
from stacks.config_values import is_zone_id
from stacks.network import SingleZoneNetwork
from stacks.preprocess.preprocessor import RAW_PREFIX, TRAIN_SHARDS, VAL_SHARDS, Preprocessor
from stacks.teardown.answered import answered
from stacks.teardown.guards import FleetGuards
from stacks.teardown.preprocess_guard import PreprocessGuard


class PreprocessStack(Stack):
    """The preprocessing node in its own single-AZ network, registered with TeardownStack's
    preprocessing stop."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: FleetConfig,
        bucket: s3.IBucket,
        guards: FleetGuards,
        **kwargs,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        Tags.of(self).add(PROJECT_TAG, PROJECT)
        # The volume and the instance need the zone's name. A zone ID (-c az=use1-az4) names it
        # by itself for a new subnet (SingleZoneNetwork reads the name back from the subnet);
        # a given subnet has no such attribute, so a deploy-time answer turns the ID into this account's
        # name at deploy, the zone answer TrainStack uses (Fixed: the subnet decides).
        # Without -c az, the same answer takes the region's first zone that offers the node's type
        # (PreferredZone empty, not Fixed): no zone is assumed to exist or to offer it.
        zone_name, placement = None, config.placement
        if (placement.vpc_id is not None and is_zone_id(placement.az)) or not placement.az_chosen:
            zone_name = answered(
                self,
                "Zone",
                guards=guards,
                resource_type=ZONE_TYPE,
                properties={
                    "InstanceType": config.preprocess.name,
                    "PreferredZone": placement.preferred_zone,
                    "Fixed": str(placement.vpc_id is not None).lower(),
                },
            ).get_att_string("Zone")
        network = SingleZoneNetwork(
            self,
            "Network",
            placement=config.placement,
            private=False,
            deploy_time_zone=zone_name,
        )
        # A drill converts its own dataset, under its own prefixes (contract/drill.py DATASET).
        data = config.drill.dataset if config.drill else None
        node = Preprocessor(
            self,
            "Preprocessor",
            vpc=network.vpc,
            subnet=network.subnet,
            availability_zone=network.availability_zone,
            node_type=config.preprocess,
            guards=guards,
            volume_gib=config.data_volume_gib,
            bucket=bucket,
            output_prefix=config.dataset_prefix,
            download_secret_arn=config.download_secret_arn,
            raw_prefix=data.raw_prefix if data else RAW_PREFIX,
            shards=(data.train_shards, data.val_shards) if data else (TRAIN_SHARDS, VAL_SHARDS),
        )
        PreprocessGuard(
            self,
            "Guard",
            guards=guards,
            instance=node.instance,
            volume=node.cfn_volume,
            snapshot_volume=config.snapshot_data_volume,
        )
        CfnOutput(self, "InstanceId", value=node.instance.ref)
        CfnOutput(
            self,
            "Session",
            description="Open a shell on the node (no SSH keys, no open ports)",
            value=f"aws ssm start-session --region {self.region} --target {node.instance.ref}",
        )
        CfnOutput(self, "LogGroup", value=node.log_group.log_group_name)
        CfnOutput(self, "DataVolumeId", value=node.volume.volume_id)
