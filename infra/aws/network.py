"""The VPC: private node subnets, public subnets for NAT and internet-facing ALBs, one AZ each.

Layout (`subnet_layout`): the VPC is cut into the smallest power of two of equal blocks that is
larger than the AZ count; each AZ gets one whole block as its private subnet (the VPC CNI gives
every pod a VPC address, so node subnets need the room), and the next block is cut in four for
the public subnets, which hold only NAT gateways and load-balancer ENIs. Internal load balancers
get subnets of their own, of the public subnets' size, from the first free space after those
(`internal_load_balancer_cidrs`): in the node subnets their ENIs would share addresses with every
pod, and a NetworkPolicy admitting the load balancer would then admit every pod too (issue 15).
What is left over stays unallocated for later subnets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws.policies import flow_log_delivery_policy, service_trust_policy, to_json

MAX_AVAILABILITY_ZONES = 4
MIN_LOAD_BALANCER_SUBNET_PREFIX = 27
_PUBLIC_SPLIT_BITS = 2  # one block in four pieces: room for a public subnet per AZ, up to 4 AZs


@dataclass(frozen=True)
class SubnetLayout:
    private_cidrs: tuple[str, ...]
    public_cidrs: tuple[str, ...]
    internal_load_balancer_cidrs: tuple[str, ...]

    def load_balancer_cidrs(self, scheme: str) -> tuple[str, ...]:
        """Where the ENIs of an ALB of this scheme live: the only sources of its traffic to pods."""
        return self.public_cidrs if scheme == "internet-facing" else self.internal_load_balancer_cidrs


def subnet_layout(vpc_cidr: str, availability_zone_count: int) -> SubnetLayout:
    """CIDRs of the private and public subnet of each AZ (index i = the i-th AZ)."""
    if not 1 <= availability_zone_count <= MAX_AVAILABILITY_ZONES:
        raise ValueError(
            f"availability_zone_count must be 1 to {MAX_AVAILABILITY_ZONES}, not {availability_zone_count}"
        )
    vpc = ipaddress.IPv4Network(vpc_cidr)
    # 2**bits blocks is the smallest power of two > count: count private blocks + one public block.
    bits = availability_zone_count.bit_length()
    blocks = list(vpc.subnets(prefixlen_diff=bits))
    public_pieces = list(blocks[availability_zone_count].subnets(prefixlen_diff=_PUBLIC_SPLIT_BITS))
    private = blocks[:availability_zone_count]
    public = public_pieces[:availability_zone_count]
    taken = [*private, *public]
    # The public subnets' size where the free space allows (3 AZs leave one such piece), else the
    # largest smaller size that gives one per AZ; an ALB needs a /27 at least.
    internal: list[ipaddress.IPv4Network] = []
    for prefix in range(public[0].prefixlen, MIN_LOAD_BALANCER_SUBNET_PREFIX + 1):
        internal = [
            piece
            for piece in vpc.subnets(new_prefix=prefix)
            if not any(piece.overlaps(used) for used in taken)
        ][:availability_zone_count]
        if len(internal) == availability_zone_count:
            break
    return SubnetLayout(
        private_cidrs=tuple(str(block) for block in private),
        public_cidrs=tuple(str(piece) for piece in public),
        internal_load_balancer_cidrs=tuple(str(piece) for piece in internal),
    )


def nat_gateway_count(availability_zone_count: int, single_nat_gateway: bool) -> int:
    return 1 if single_nat_gateway else availability_zone_count


@dataclass(frozen=True)
class NetworkArgs:
    cluster_name: str
    region: str
    vpc_cidr: str
    availability_zone_count: int
    single_nat_gateway: bool
    provider: aws.Provider
    """For the availability-zone look-up (invokes do not inherit the parent's provider)."""
    flow_log_retention_days: int | None = None
    """Send VPC flow logs to CloudWatch for this many days; None: no flow logs."""


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    private_subnet_ids: list[pulumi.Output[str]]
    public_subnet_ids: list[pulumi.Output[str]]
    internal_load_balancer_subnet_ids: list[pulumi.Output[str]]
    layout: SubnetLayout
    private_route_table_ids: list[pulumi.Output[str]]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:aws:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        count = args.availability_zone_count
        layout = subnet_layout(args.vpc_cidr, count)
        zones = aws.get_availability_zones_output(
            state="available",
            # Regular AZs only: Local/Wavelength Zones lack most GPU instance types and EKS support.
            filters=[{"name": "opt-in-status", "values": ["opt-in-not-required"]}],
            opts=pulumi.InvokeOutputOptions(provider=args.provider, parent=self),
        )
        zone_names = [
            zones.names.apply(lambda names, index=index: _zone_at(names, index, count, args.region))
            for index in range(count)
        ]
        cluster_tag = {f"kubernetes.io/cluster/{args.cluster_name}": "shared"}

        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.vpc_cidr,
            # EKS private endpoint and EFS mount-target names resolve through VPC DNS.
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags={"Name": args.cluster_name},
            opts=child,
        )
        internet_gateway = aws.ec2.InternetGateway(
            f"{name}-igw", vpc_id=vpc.id, tags={"Name": args.cluster_name}, opts=child
        )

        public_subnets = [
            aws.ec2.Subnet(
                f"{name}-public-{index}",
                vpc_id=vpc.id,
                cidr_block=layout.public_cidrs[index],
                availability_zone=zone_names[index],
                # Nothing launched here needs a public IP of its own: NAT has an EIP, ALBs manage theirs.
                map_public_ip_on_launch=False,
                tags={
                    "Name": f"{args.cluster_name}-public-{index}",
                    "kubernetes.io/role/elb": "1",
                    **cluster_tag,
                },
                opts=child,
            )
            for index in range(count)
        ]
        private_subnets = [
            aws.ec2.Subnet(
                f"{name}-private-{index}",
                vpc_id=vpc.id,
                cidr_block=layout.private_cidrs[index],
                availability_zone=zone_names[index],
                # Not tagged internal-elb: internal ALBs go to their own subnets below.
                tags={"Name": f"{args.cluster_name}-private-{index}", **cluster_tag},
                opts=child,
            )
            for index in range(count)
        ]
        # Only internal ALB ENIs: no route beyond the VPC is needed (the main route table is local).
        internal_load_balancer_subnets = [
            aws.ec2.Subnet(
                f"{name}-internal-lb-{index}",
                vpc_id=vpc.id,
                cidr_block=layout.internal_load_balancer_cidrs[index],
                availability_zone=zone_names[index],
                tags={
                    "Name": f"{args.cluster_name}-internal-lb-{index}",
                    "kubernetes.io/role/internal-elb": "1",
                    **cluster_tag,
                },
                opts=child,
            )
            for index in range(count)
        ]

        public_route_table = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": internet_gateway.id}],
            tags={"Name": f"{args.cluster_name}-public"},
            opts=child,
        )
        for index, subnet in enumerate(public_subnets):
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{index}",
                subnet_id=subnet.id,
                route_table_id=public_route_table.id,
                opts=child,
            )

        nat_gateways = []
        for index in range(nat_gateway_count(count, args.single_nat_gateway)):
            address = aws.ec2.Eip(
                f"{name}-nat-{index}",
                domain="vpc",
                tags={"Name": f"{args.cluster_name}-nat-{index}"},
                opts=child,
            )
            nat_gateways.append(
                aws.ec2.NatGateway(
                    f"{name}-nat-{index}",
                    allocation_id=address.id,
                    subnet_id=public_subnets[index].id,
                    tags={"Name": f"{args.cluster_name}-nat-{index}"},
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[internet_gateway]),
                )
            )

        # One private route table per AZ even with a single NAT gateway, so switching
        # single_nat_gateway only retargets routes instead of replacing tables.
        private_route_tables = []
        for index, subnet in enumerate(private_subnets):
            nat = nat_gateways[index % len(nat_gateways)]
            table = aws.ec2.RouteTable(
                f"{name}-private-{index}",
                vpc_id=vpc.id,
                routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
                tags={"Name": f"{args.cluster_name}-private-{index}"},
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{index}", subnet_id=subnet.id, route_table_id=table.id, opts=child
            )
            private_route_tables.append(table)

        # Model weights come from S3: a gateway endpoint keeps that traffic (hundreds of GB per
        # cold start of a large model) off the NAT gateways, which bill per GB; it costs nothing.
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{args.region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[table.id for table in private_route_tables],
            tags={"Name": f"{args.cluster_name}-s3"},
            opts=child,
        )

        if args.flow_log_retention_days is not None:
            _flow_logs_of(self, name, vpc, args)
        self.vpc_id = vpc.id
        self.private_subnet_ids = [subnet.id for subnet in private_subnets]
        self.public_subnet_ids = [subnet.id for subnet in public_subnets]
        self.internal_load_balancer_subnet_ids = [subnet.id for subnet in internal_load_balancer_subnets]
        self.layout = layout
        self.private_route_table_ids = [table.id for table in private_route_tables]
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "private_subnet_ids": self.private_subnet_ids,
                "public_subnet_ids": self.public_subnet_ids,
            }
        )


def _flow_logs_of(network: Network, name: str, vpc: aws.ec2.Vpc, args: NetworkArgs) -> None:
    child = pulumi.ResourceOptions(parent=network)
    log_group = aws.cloudwatch.LogGroup(
        f"{name}-flow-logs",
        name=f"/vllm-platform/{args.cluster_name}/vpc-flow-logs",
        retention_in_days=args.flow_log_retention_days,
        opts=child,
    )
    role = aws.iam.Role(
        f"{name}-flow-logs",
        assume_role_policy=to_json(service_trust_policy("vpc-flow-logs.amazonaws.com")),
        opts=child,
    )
    aws.iam.RolePolicy(
        f"{name}-flow-logs",
        role=role.id,
        policy=log_group.arn.apply(lambda arn: to_json(flow_log_delivery_policy(arn))),
        opts=child,
    )
    aws.ec2.FlowLog(
        f"{name}-flow-logs",
        vpc_id=vpc.id,
        traffic_type="ALL",
        log_destination_type="cloud-watch-logs",
        log_destination=log_group.arn,
        iam_role_arn=role.arn,
        max_aggregation_interval=60,
        tags={"Name": f"{args.cluster_name}-vpc-flow-logs"},
        opts=child,
    )


def _zone_at(names: Sequence[str], index: int, count: int, region: str) -> str:
    if len(names) < count:
        raise pulumi.RunError(
            f"cluster.availability_zone_count is {count}, but region {region} offers only {len(names)} "
            f"available zones ({', '.join(names)}); lower availability_zone_count"
        )
    return names[index]
