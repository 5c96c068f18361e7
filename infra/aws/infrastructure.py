"""The AWS layer as one component: network → EKS → add-ons → node groups → storage → IRSA roles
(→ the tenants' WAF web ACL, when a tenant has a rate limit).

Like terraform-aws-eks, a small root that wires focused parts together; each part lives in its own
module of infra/aws/ and takes only what it needs. Everything is created through one explicit AWS
provider for `cluster.region`, so the ambient `aws:region` never decides where a cluster lands.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from domain.cluster_context import ClusterContext, KarpenterMultiNodePlacement
from domain.config import PlatformConfig
from domain.multi_node import efa_groups, efa_interfaces_per_node
from domain.service_accounts import EBS_CSI_CONTROLLER
from infra.aws.addons import ManagedAddons, ManagedAddonsArgs, addons_after_nodes, addons_before_nodes
from infra.aws.cluster import EksCluster, EksClusterArgs, admin_principals, kubeconfig
from infra.aws.irsa import ServiceAccountRoles, ServiceAccountRolesArgs, service_account_role_specs
from infra.aws.karpenter import KarpenterAws, KarpenterAwsArgs, runs_karpenter
from infra.aws.network import Network, NetworkArgs
from infra.aws.node_groups import NodeGroups, NodeGroupsArgs
from infra.aws.policies import AwsLocation
from infra.aws.storage import ModelStorage, ModelStorageArgs
from infra.aws.tenant_limits import tenant_web_acl


class AwsInfrastructure(pulumi.ComponentResource):
    kubeconfig: pulumi.Output[str]
    node_group_resources: list[pulumi.Resource]
    """What the Kubernetes provider must wait for: node groups, CoreDNS, and the admins' access
    entries (the identity running Pulumi cannot talk to the API server before its entry exists)."""
    cluster_context: ClusterContext
    cluster_name: pulumi.Output[str]
    model_bucket_name: pulumi.Output[str]
    efs_file_system_id: pulumi.Output[str]

    def __init__(self, name: str, config: PlatformConfig, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:aws:AwsInfrastructure", name, None, opts)
        cluster_config = config.cluster
        cluster_name = cluster_config.name
        bucket_name = config.storage.model_bucket_name
        if cluster_name is None or bucket_name is None:
            raise ValueError(
                "AwsInfrastructure needs a config with stack defaults resolved (resolve_stack_defaults)"
            )
        region = cluster_config.region

        provider = aws.Provider(
            f"{name}-provider",
            region=region,
            default_tags={
                "tags": {
                    "vllm-platform/cluster": cluster_name,
                    "vllm-platform/stack": pulumi.get_stack(),
                    "managed-by": "pulumi",
                }
            },
            opts=pulumi.ResourceOptions(parent=self),
        )
        children = pulumi.ResourceOptions(parent=self, providers=[provider])
        lookups = pulumi.InvokeOptions(provider=provider, parent=self)

        # Plain values at program time: ARNs in policies and resource names depend on them.
        identity = aws.get_caller_identity(opts=lookups)
        partition = aws.get_partition(opts=lookups).partition
        # An assumed-role session's ARN changes per session; access entries need the role's ARN.
        deployer_arn = aws.iam.get_session_context(arn=identity.arn, opts=lookups).issuer_arn
        location = AwsLocation(partition=partition, region=region, account_id=identity.account_id)

        network = Network(
            f"{name}-network",
            NetworkArgs(
                cluster_name=cluster_name,
                region=region,
                vpc_cidr=cluster_config.vpc_cidr,
                availability_zone_count=cluster_config.availability_zone_count,
                single_nat_gateway=cluster_config.single_nat_gateway,
                provider=provider,
                flow_log_retention_days=(
                    cluster_config.vpc_flow_log_retention_days if cluster_config.vpc_flow_logs else None
                ),
            ),
            opts=children,
        )
        cluster = EksCluster(
            f"{name}-eks",
            EksClusterArgs(
                cluster=cluster_config,
                subnet_ids=network.private_subnet_ids,
                admin_principal_arns=admin_principals(cluster_config.admin_principal_arns, deployer_arn),
                partition=partition,
                location=location,
            ),
            opts=children,
        )
        networking_addons = ManagedAddons(
            f"{name}-addons-networking",
            ManagedAddonsArgs(
                cluster_name=cluster.name_output,
                kubernetes_version=cluster_config.kubernetes_version,
                addons=addons_before_nodes(config.security.network_policies),
                provider=provider,
            ),
            opts=children,
        )
        efa_pools = tuple(g for g in efa_groups(config) if config.node_groups.gpu[g].is_karpenter_pool)
        nodes = NodeGroups(
            f"{name}-nodes",
            NodeGroupsArgs(
                cluster_name=cluster.name_output,
                plain_cluster_name=cluster_name,
                kubernetes_version=cluster_config.kubernetes_version,
                node_groups=config.node_groups,
                subnet_ids=network.private_subnet_ids,
                depends_on=networking_addons.addons,
                partition=partition,
                efa_interfaces={
                    group: efa_interfaces_per_node(config, group) for group in efa_groups(config)
                },
                vpc_id=network.vpc_id,
                cluster_security_group_id=cluster.security_group_id,
                efa_pools=efa_pools,
            ),
            opts=children,
        )
        karpenter = None
        if runs_karpenter(config):
            karpenter = KarpenterAws(
                f"{name}-karpenter",
                KarpenterAwsArgs(
                    cluster_name=cluster.name_output,
                    plain_cluster_name=cluster_name,
                    private_subnet_ids=network.private_subnet_ids,
                    cluster_security_group_id=cluster.security_group_id,
                    partition=partition,
                ),
                opts=children,
            )
        storage = ModelStorage(
            f"{name}-storage",
            ModelStorageArgs(
                cluster_name=cluster_name,
                bucket_name=bucket_name,
                efs_throughput_mode=config.storage.efs_throughput_mode,
                vpc_id=network.vpc_id,
                subnet_ids=network.private_subnet_ids,
                node_security_group_id=cluster.security_group_id,
                location=location,
                efs_client_role_arns=[nodes.node_role_arn, *([karpenter.node_role_arn] if karpenter else [])],
            ),
            opts=children,
        )
        roles = ServiceAccountRoles(
            f"{name}-irsa",
            ServiceAccountRolesArgs(
                cluster_name=cluster_name,
                location=location,
                oidc_provider_arn=cluster.oidc_provider_arn,
                oidc_issuer_url=cluster.oidc_issuer_url,
                model_bucket_kms_key_arn=storage.bucket_kms_key_arn,
                roles=service_account_role_specs(config, location),
            ),
            opts=children,
        )

        dns_addons = ManagedAddons(
            f"{name}-addons-dns",
            ManagedAddonsArgs(
                cluster_name=cluster.name_output,
                kubernetes_version=cluster_config.kubernetes_version,
                addons=addons_after_nodes(roles.role_arns.get(EBS_CSI_CONTROLLER.key)),
                provider=provider,
                depends_on=list(nodes.groups.values()),
            ),
            opts=children,
        )
        self.kubeconfig = pulumi.Output.all(cluster.endpoint, cluster.certificate_authority_data).apply(
            lambda values: kubeconfig(cluster_name, region, values[0], values[1])
        )
        self.node_group_resources = [*nodes.groups.values(), *dns_addons.addons, *cluster.admin_access]
        self.cluster_name = cluster.name_output
        self.model_bucket_name = storage.bucket_name
        self.efs_file_system_id = storage.efs_file_system_id
        web_acl = tenant_web_acl(f"{name}-tenant-limits", config, children)
        self.cluster_context = ClusterContext(
            cluster_name=cluster_name,
            region=region,
            kubernetes_version=cluster_config.kubernetes_version,
            efs_file_system_id=storage.efs_file_system_id,
            vpc_id=network.vpc_id,
            load_balancer_source_cidrs=network.layout.load_balancer_cidrs(config.ingress.scheme),
            service_account_role_arns=roles.role_arns,
            web_acl_arn=web_acl.arn if web_acl is not None else None,
            karpenter_node_role=karpenter.node_role_name if karpenter else None,
            karpenter_interruption_queue=karpenter.queue_name if karpenter else None,
            karpenter_multi_node={
                pool: KarpenterMultiNodePlacement(
                    # A placement group's id is its name (EC2 names them; the provider's `id`).
                    placement_group=nodes.placement_groups[pool].id,
                    subnet_id=network.private_subnet_ids[0],
                    efa_security_group_id=nodes.efa_security_group.id,
                )
                for pool in efa_pools
                if nodes.efa_security_group is not None
            },
        )
        self.register_outputs(
            {
                "cluster_name": self.cluster_name,
                "model_bucket_name": self.model_bucket_name,
                "efs_file_system_id": self.efs_file_system_id,
                "vpc_id": network.vpc_id,
                "service_account_role_arns": roles.role_arns,
            }
        )
