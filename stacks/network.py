"""One subnet in one availability zone: in a new VPC, or an existing subnet given in context; and
in a new VPC, the fleet's move slots in other zones."""

from aws_cdk import Acknowledgment, RemovalPolicy, Stack, Tags, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from contract.names import FLEET_TAG
from stacks.config_values import ZONE_LETTERS, Placement, is_zone_id
from stacks.nag import allow_fixed_zone

VPC_CIDR = "10.42.0.0/16"
# Free /20 blocks of VPC_CIDR (the fleet's subnet is 10.42.0.0/20, the public one 10.42.128.0/17)
# for the fleet's move slots, one each: a /20 holds a p5 fleet of 64 nodes with 32 interfaces.
MOVE_CIDRS = tuple(f"10.42.{16 * block}.0/20" for block in range(1, 8))


def move_slots(region: str) -> int:
    """How many other zones a fleet in `region` can move to: one fewer than the zones the region
    has (stacks/config.py ZONE_LETTERS), and for a region outside that table as many as for the
    largest in it. An account may see fewer zones, or fewer may offer the type: the zone check
    then answers the fleet's own zone for the spare slots."""
    letters = ZONE_LETTERS.get(region) or max(ZONE_LETTERS.values(), key=len)
    return min(len(letters) - 1, len(MOVE_CIDRS))


class SingleZoneNetwork(Construct):
    """A subnet for instances that must share one AZ.

    private=True: a private subnet whose only way out is one NAT gateway (the GPU fleet, which
    calls AWS APIs but must never be reachable); private=False: a public subnet and no NAT
    (the preprocessing node, whose ~150 GB download would otherwise pay NAT data charges).
    New VPCs get an S3 gateway endpoint (free S3 traffic) and a flow log of rejected traffic.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        placement: Placement,
        private: bool,
        deploy_time_zone: str | None = None,
    ) -> None:
        """`placement`: the zone, and the user's own VPC and subnet if given.
        `deploy_time_zone` (a token) replaces `az` in the new VPC's subnets: the zone found
        at deploy time; `az` still names the zone at synthesis.

        `az` may be a zone ID (use1-az4, stacks/config.py): without `deploy_time_zone` the new
        subnets take it as AvailabilityZoneId, which AWS::EC2::Subnet accepts instead of
        AvailabilityZone, and `availability_zone` is the name CloudFormation reads back from the
        subnet (Fn::GetAtt AvailabilityZone) for what needs a name (volumes, instances)
        https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-resource-ec2-subnet.html
        A given subnet has no such attribute: its caller passes the name as `deploy_time_zone`."""
        super().__init__(scope, construct_id)
        az, vpc_id, subnet_id = placement.az, placement.vpc_id, placement.subnet_id
        by_id = is_zone_id(az) and deploy_time_zone is None
        # The zone's name in this account, for resources that take no zone ID.
        self.availability_zone: str = deploy_time_zone or az
        if vpc_id and subnet_id:
            # Imported as given, without lookups: synthesis stays offline and deterministic.
            self.vpc = ec2.Vpc.from_vpc_attributes(
                self, "Vpc", vpc_id=vpc_id, availability_zones=[self.availability_zone]
            )
            self.subnet = ec2.Subnet.from_subnet_attributes(
                self, "Subnet", subnet_id=subnet_id, availability_zone=self.availability_zone
            )
            Validations.of(self.subnet).acknowledge(
                Acknowledgment(
                    id="Annotation::@aws-cdk/aws-ec2:noSubnetRouteTableId",
                    reason="Nothing here reads the subnet's route table; the VPC is used as is.",
                )
            )
            return
        subnets = [ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC)]
        if private:
            subnets.append(
                ec2.SubnetConfiguration(
                    name="Fleet", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20
                )
            )
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(VPC_CIDR),
            availability_zones=[az],
            subnet_configuration=subnets,
            nat_gateways=1 if private else 0,
            # Nothing uses the default group; locking it down costs a custom-resource Lambda.
            restrict_default_security_group=False,
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)
            },
        )
        # REJECT only: shows traffic a security group blocked (a rendezvous that cannot connect)
        # without paying to log every allreduce flow.
        self.vpc.add_flow_log(
            "RejectedTraffic",
            traffic_type=ec2.FlowLogTrafficType.REJECT,
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(
                logs.LogGroup(
                    self,
                    "FlowLogs",
                    retention=logs.RetentionDays.ONE_MONTH,
                    removal_policy=RemovalPolicy.DESTROY,
                )
            ),
        )
        for subnet in [*self.vpc.public_subnets, *self.vpc.private_subnets]:
            cfn_subnet: ec2.CfnSubnet = subnet.node.default_child
            allow_fixed_zone(cfn_subnet)
            if deploy_time_zone is not None:
                cfn_subnet.add_property_override("AvailabilityZone", deploy_time_zone)
            elif by_id:
                cfn_subnet.add_property_deletion_override("AvailabilityZone")
                cfn_subnet.add_property_override("AvailabilityZoneId", az)
        subnet_type = ec2.SubnetType.PRIVATE_WITH_EGRESS if private else ec2.SubnetType.PUBLIC
        self.subnet = self.vpc.select_subnets(subnet_type=subnet_type).subnets[0]
        if by_id:
            self.availability_zone = self.subnet.node.default_child.attr_availability_zone

    def move_subnets(self, zones: list[str]) -> list[ec2.CfnSubnet]:
        """A private subnet in each of `zones` (the zone check's answers, one per move slot) for
        the fleet to move to when its zone has no capacity: routed by the fleet subnet's own
        route table, so through the same NAT gateway and S3 gateway endpoint (traffic to the
        NAT crosses zones, at inter-zone data prices), and tagged with the fleet's tag, which
        the run controller may launch into. Subnets cost nothing: "There's no additional charge
        for using a VPC" (https://docs.aws.amazon.com/vpc/latest/userguide/what-is-amazon-vpc.html),
        and the VPC may hold 200
        (https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html)."""
        subnets = []
        for slot, (zone, cidr) in enumerate(zip(zones, MOVE_CIDRS[: len(zones)], strict=True), 1):
            subnet = ec2.CfnSubnet(
                self,
                f"Move{slot}Subnet",
                vpc_id=self.vpc.vpc_id,
                cidr_block=cidr,
                availability_zone=zone,
                map_public_ip_on_launch=False,
            )
            Tags.of(subnet).add(FLEET_TAG, Stack.of(self).stack_id)
            ec2.CfnSubnetRouteTableAssociation(
                self,
                f"Move{slot}Routes",
                subnet_id=subnet.ref,
                route_table_id=self.subnet.route_table.route_table_id,
            )
            subnets.append(subnet)
        return subnets


def web_egress_security_group(
    scope: Construct, construct_id: str, *, vpc: ec2.IVpc, description: str
) -> ec2.SecurityGroup:
    """No ingress; egress only to HTTPS (S3, SSM, CloudFormation, PyPI) and HTTP (apt mirrors,
    which serve signed packages over plain HTTP)."""
    group = ec2.SecurityGroup(
        scope, construct_id, vpc=vpc, description=description, allow_all_outbound=False
    )
    group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs and PyPI")
    group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(80), "HTTP to the apt mirrors")
    return group
