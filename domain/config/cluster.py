"""Cluster and node-group settings."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from domain.catalogue.gpu_instances import gpu_instance_types, lookup_instance_type
from domain.config.base import Cidr, Labels, StrictModel, dns_label
from domain.config.errors import ConfigProblem
from domain.versions import DEFAULT_KUBERNETES_VERSION, SUPPORTED_KUBERNETES_VERSIONS

ControlPlaneLogType = Literal["api", "audit", "authenticator", "controllerManager", "scheduler"]


def _check_vpc_cidr(value: str) -> str:
    try:
        network = ipaddress.IPv4Network(value)
    except ValueError as error:
        raise ValueError(f"must be an IPv4 CIDR such as '10.0.0.0/16' ({error})") from None
    if not 16 <= network.prefixlen <= 20:
        raise ValueError("must be a /16 to /20 block so every AZ gets a /20 or larger node subnet")
    return value


class ClusterConfig(StrictModel):
    """The Kubernetes cluster: created on EKS (mode `eks`) or an existing one."""

    mode: Literal["eks", "existing"] = "eks"
    """`eks`: create the VPC, EKS cluster and node groups. `existing`: deploy onto the cluster of a
    kubeconfig; no AWS resources are created."""
    name: Annotated[str, dns_label(40)] | None = None
    """Cluster name; defaults to `vllm-<stack>`."""
    region: Annotated[str, Field(pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$")] = "us-west-2"
    """AWS region of every resource (the stack file's `aws:region` is not read)."""
    kubernetes_version: str = DEFAULT_KUBERNETES_VERSION
    """EKS control-plane and node version; one of the supported versions in domain/versions.py."""
    vpc_cidr: Annotated[str, AfterValidator(_check_vpc_cidr)] = "10.0.0.0/16"
    """VPC address block (/16 to /20); split into public and private subnets per AZ."""
    availability_zone_count: Annotated[int, Field(ge=2, le=4)] = 3
    """AZs the VPC, node subnets and EFS mount targets span."""
    single_nat_gateway: bool = False
    """One NAT gateway for all AZs (cheaper, not zone-redundant): for dev stacks."""
    endpoint_public_access: bool = False
    """The API server is private by default; reach it through a VPN/bastion or set this and
    `public_access_cidrs`."""
    public_access_cidrs: list[Cidr] = []
    """CIDRs allowed to reach a public API endpoint (required when it is public)."""
    public_access_from_anywhere: bool = False
    """Opt-in for a public API endpoint open to every address (`0.0.0.0/0` in public_access_cidrs):
    without it such a CIDR is an error, since one line would expose the cluster's API server."""
    vpc_flow_logs: bool = True
    """Mode `eks`: VPC flow logs (all traffic, accepted and rejected) to CloudWatch Logs, so who
    talked to a pod or node can be answered after the fact."""
    vpc_flow_log_retention_days: Literal[7, 14, 30, 60, 90, 180, 365] = 90
    """Days CloudWatch keeps the VPC flow logs."""
    control_plane_logging: list[ControlPlaneLogType] = ["api", "audit", "authenticator"]
    """EKS control-plane log types sent to CloudWatch."""
    admin_principal_arns: list[
        Annotated[str, Field(pattern=r"^arn:aws[-a-z]*:iam::\d{12}:(role|user)/.+$")]
    ] = []
    """IAM roles/users granted cluster-admin through EKS access entries."""
    kubeconfig_path: str | None = None
    """`existing` mode: kubeconfig file to use (default: the ambient KUBECONFIG)."""
    kubeconfig_context: str | None = None
    """`existing` mode: context in that kubeconfig."""

    @field_validator("kubernetes_version")
    @classmethod
    def _supported_version(cls, value: str) -> str:
        if value not in SUPPORTED_KUBERNETES_VERSIONS:
            raise ValueError(
                f"must be one of {', '.join(SUPPORTED_KUBERNETES_VERSIONS)} (EKS standard support)"
            )
        return value

    @model_validator(mode="after")
    def _access_settings_match_mode(self) -> ClusterConfig:
        if self.endpoint_public_access and not self.public_access_cidrs:
            raise ConfigProblem(
                "a public API endpoint needs the CIDRs allowed to reach it, e.g. ['203.0.113.0/24']; "
                "or leave endpoint_public_access false",
                at=("public_access_cidrs",),
            )
        for index, cidr in enumerate(self.public_access_cidrs):
            if ipaddress.IPv4Network(cidr).prefixlen == 0 and not self.public_access_from_anywhere:
                raise ConfigProblem(
                    "opens the Kubernetes API endpoint to the whole internet: list your own networks "
                    "(e.g. '203.0.113.0/24'), or set cluster.public_access_from_anywhere: true to mean it",
                    at=("public_access_cidrs", index),
                )
        if self.mode == "eks" and (self.kubeconfig_path or self.kubeconfig_context):
            raise ConfigProblem(
                "kubeconfig settings apply only to mode 'existing'; in mode 'eks' the stack builds the "
                "kubeconfig from the cluster it creates",
                at=("kubeconfig_path" if self.kubeconfig_path else "kubeconfig_context",),
            )
        return self


class TaintConfig(StrictModel):
    """A node taint."""

    key: Annotated[str, Field(min_length=1, max_length=253)]
    """Taint key, e.g. `nvidia.com/gpu`; in mode `eks` at most 63 characters in all (EKS's limit, from
    botocore's model, checked at validate time)."""
    value: Annotated[str, Field(max_length=63)] = ""
    """Taint value; empty means a key-only taint (tolerated with `Exists`)."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    """`NoSchedule`, `PreferNoSchedule` or `NoExecute`."""

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


DEFAULT_GPU_TAINT = TaintConfig(key="nvidia.com/gpu", value="true", effect="NoSchedule")


class LocalNvmeConfig(StrictModel):
    """Instance-store NVMe for the node-local model copy."""

    enabled: bool = True
    """Assemble the instance-store NVMe disks (RAID0 when several) and mount them for the model cache."""
    mount_path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9/_.-]+$")] = "/mnt/nvme"
    """Where the NVMe array is mounted; models live in `<mount_path>/vllm-models`."""


FAST_IMAGE_PULL_MIN_THROUGHPUT_MIBPS = 600
"""AWS: with SOCI parallel pull, below 600 MiB/s of root-volume throughput pulls get slower, not
faster (the disk, not the network, limits a parallel pull); its benchmark used 1000 MiB/s, 16000 IOPS."""
GP3_MIBPS_PER_IOPS = 0.25
"""gp3 allows at most 0.25 MiB/s of throughput per provisioned IOPS."""


class ImagePullConfig(StrictModel):
    """How a new GPU node gets the ~10 GB vLLM image (docs/aws.md, 'The vLLM image on a new node').
    The pre-pull DaemonSet (addons.image_prepull) starts the pull as soon as the node joins; these
    settings make that pull itself faster."""

    fast_image_pull: bool = True
    """SOCI parallel pull/unpack: AL2023 through nodeadm's `FastImagePull` feature gate, Bottlerocket
    through `settings.container-runtime.snapshotter = "soci"` with `pull-mode =
    "parallel-pull-unpack"`. Large layers are fetched in chunks over many connections and unpacked
    concurrently; a full pull (no lazy loading), of any image, with nothing to build. Marked
    experimental by the EKS AMI project; nodeadm ignores it below 4 vCPUs / 7 GiB (every GPU
    instance is above). Needs `root_volume_throughput_mibps` >= 600."""
    parallel_image_pulls: Annotated[int, Field(ge=1, le=10)] = 3
    """AL2023: kubelet `maxParallelImagePulls` with `serializeImagePulls: false`, so the vLLM image,
    the preloader's and the add-ons' images pull at once on a new node instead of one after another
    (the kubelet's default: 1, serial). Bottlerocket nodes keep serial pulls."""
    max_concurrent_downloads: Annotated[int, Field(ge=1, le=32)] = 8
    """containerd's layers of one image downloaded at once (its default: 3), for pulls that do not go
    through SOCI's parallel mode (which has its own, larger, limits)."""
    image_snapshot_id: Annotated[str, Field(pattern=r"^snap-[0-9a-f]{8,17}$")] | None = None
    """An EBS snapshot of a containerd image store that already holds the pinned vLLM image: new
    nodes get their image volume from it and skip the pull. Bottlerocket: the data volume
    (/dev/xvdb), its documented way. AL2023: a second volume (/dev/xvdb) mounted at
    /var/lib/containerd before containerd starts. Make it on a node of this group (same AMI, same
    `fast_image_pull`) after the pre-pull, for every new image pin; a snapshot without the pinned
    image only costs the pull it was meant to save."""
    root_volume_throughput_mibps: Annotated[int, Field(ge=125, le=1000)] = 1000
    """gp3 throughput of the volume containerd unpacks into (the root volume; Bottlerocket's data
    volume): a parallel pull is disk-bound. gp3 baseline 125; extra throughput is billed monthly."""
    root_volume_iops: Annotated[int, Field(ge=3000, le=16000)] = 16000
    """gp3 IOPS of that volume (baseline 3000)."""

    @model_validator(mode="after")
    def _volume_fast_enough(self) -> ImagePullConfig:
        if self.root_volume_throughput_mibps > self.root_volume_iops * GP3_MIBPS_PER_IOPS:
            raise ConfigProblem(
                f"gp3 allows at most {GP3_MIBPS_PER_IOPS} MiB/s per IOPS: "
                f"{self.root_volume_throughput_mibps} MiB/s needs root_volume_iops of at least "
                f"{int(self.root_volume_throughput_mibps / GP3_MIBPS_PER_IOPS)}",
                at=("root_volume_iops",),
                value=self.root_volume_iops,
            )
        if self.fast_image_pull and self.root_volume_throughput_mibps < FAST_IMAGE_PULL_MIN_THROUGHPUT_MIBPS:
            raise ConfigProblem(
                f"SOCI parallel pull on a volume below {FAST_IMAGE_PULL_MIN_THROUGHPUT_MIBPS} MiB/s pulls "
                "slower than a plain pull (AWS); raise root_volume_throughput_mibps to "
                f"{FAST_IMAGE_PULL_MIN_THROUGHPUT_MIBPS} or more (1000 is what AWS measured with), or set "
                "fast_image_pull: false",
                at=("root_volume_throughput_mibps",),
                value=self.root_volume_throughput_mibps,
            )
        return self


GRAVITON_FAMILY = re.compile(r"^[a-z]+\d+[a-z]*g[a-z]*\.")
"""EC2 families of AWS Graviton (arm64) processors: a `g` after the generation (m7g, c7gn, r8g)."""


class SystemNodeGroupConfig(StrictModel):
    """The system node group."""

    instance_types: Annotated[list[str], Field(min_length=1)] = ["m7i.xlarge"]
    """EC2 instance types, in order of preference."""
    capacity_type: Literal["on_demand", "spot"] = "on_demand"
    """`on_demand` or `spot`."""
    min_size: Annotated[int, Field(ge=1)] = 2
    """Fewest nodes."""
    desired_size: Annotated[int, Field(ge=1)] = 2
    """Nodes at creation (later changes are the autoscaler's)."""
    max_size: Annotated[int, Field(ge=1)] = 4
    """Most nodes."""
    disk_size_gib: Annotated[int, Field(ge=20)] = 50
    """Root volume size in GiB."""
    labels: Labels = {}
    """Extra Kubernetes labels on the nodes; in mode `eks`, keys and values of 1-63 characters in all."""

    @model_validator(mode="after")
    def _sizes_ordered(self) -> SystemNodeGroupConfig:
        check_size_order(self.min_size, self.desired_size, self.max_size)
        graviton = [bool(GRAVITON_FAMILY.match(name)) for name in self.instance_types]
        if any(graviton) and not all(graviton):
            arm = [name for name, is_arm in zip(self.instance_types, graviton, strict=True) if is_arm]
            x86 = [name for name, is_arm in zip(self.instance_types, graviton, strict=True) if not is_arm]
            raise ConfigProblem(
                f"mixes Graviton (arm64: {', '.join(arm)}) and x86 ({', '.join(x86)}) instance types; one "
                "node group runs one AMI architecture: list only arm64 or only x86 types",
                at=("instance_types",),
            )
        return self


KarpenterCapacityType = Literal["reserved", "spot", "on-demand"]
KARPENTER_CAPACITY_ORDER: tuple[KarpenterCapacityType, ...] = ("reserved", "spot", "on-demand")
"""The order Karpenter's AWS provider launches in when a NodePool allows several capacity types:
reserved capacity first (priced at zero while a reservation has room), then the cheaper of spot and
on-demand, which is spot wherever it is offered (aws/karpenter-provider-aws v1.14.1, docs
concepts/nodepools.md "karpenter.sh/capacity-type" and concepts/scheduling.md "Reserved capacity")."""


class NodeClassRefConfig(StrictModel):
    """A node class the cluster already has (mode `existing`, where the stack creates no AWS
    resources and so no EC2NodeClass)."""

    group: Annotated[str, Field(min_length=1, max_length=253)] = "karpenter.k8s.aws"
    """API group of the node class (`karpenter.k8s.aws` for EC2NodeClass)."""
    kind: Annotated[str, Field(min_length=1, max_length=63)] = "EC2NodeClass"
    """Its kind."""
    name: Annotated[str, dns_label(63)]
    """Its name (cluster-scoped)."""


class KarpenterPoolConfig(StrictModel):
    """How a GPU group with `provisioner: karpenter` becomes a Karpenter NodePool and EC2NodeClass
    (components/karpenter.py, docs/autoscaling.md "Karpenter GPU pools"). Ignored by managed groups."""

    capacity_types: Annotated[list[KarpenterCapacityType], Field(min_length=1)] = ["on-demand"]
    """`reserved` (On-Demand Capacity Reservations and Capacity Blocks for ML, named in
    `capacity_reservation_ids`), `spot`, `on-demand`, in the order Karpenter tries them (reserved,
    spot, on-demand: `validate` refuses another order, since Karpenter would not follow it). No `spot`
    on a pool holding a multi-node model (issue 50)."""
    capacity_reservation_ids: list[Annotated[str, Field(pattern=r"^cr-[0-9a-z]+$")]] = []
    """Capacity reservations (`cr-...`, ODCRs or Capacity Blocks) the pool may launch into; needed by
    `reserved`. Rendered as the EC2NodeClass's `capacityReservationSelectorTerms`."""
    placement_group: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    """Name of an EC2 placement group every node of the pool launches into (`placementGroupSelector`);
    a cluster placement group keeps a multi-node replica on one network spine."""
    max_gpus: Annotated[int, Field(ge=1)] | None = None
    """The NodePool's limit in `nvidia.com/gpu`: Karpenter launches no node past it. Null: the group's
    `max_size` × the most GPUs any of its instance types has."""
    ami_version: Annotated[str, Field(pattern=r"^(latest|v\d{8}|v\d+\.\d+\.\d+)$")] = "latest"
    """The EKS-optimised AMI release (`al2023@<version>` or `bottlerocket@<version>` alias; Karpenter
    picks the NVIDIA variant for GPU instance types). `latest`: a new AMI drifts the nodes, which are
    replaced only once no serving pod holds them; pin a release (format `v20240625`, upstream's
    example) to update on your own schedule."""
    consolidation_policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized"] = "WhenEmpty"
    """`WhenEmpty`: only nodes without serving pods are removed. Serving pods carry
    `karpenter.sh/do-not-disrupt`, so `WhenEmptyOrUnderutilized` spares them too, but may move other
    pods of the pool."""
    consolidate_after_seconds: Annotated[int, Field(ge=0, le=86400)] = 300
    """How long a node stays without new pods before it is consolidated (removed when empty): the
    grace for a model that scales back up soon after going to zero."""
    expire_after_hours: Annotated[int, Field(ge=1)] | None = 720
    """Node lifetime (Karpenter's default, 30 days); null: `Never`. An expired node that still holds a
    serving pod is cordoned but the pod is not evicted (do-not-disrupt, no terminationGracePeriod):
    it goes at the model's next rollout or scale-in. A pool holding a multi-node model needs null:
    expiry is forceful and a group's nodes expire together (`validate` says so; issue 50)."""
    disruption_budget_nodes: Annotated[str, Field(pattern=r"^(\d+|\d+%)$")] = "10%"
    """At most this many nodes (or share of the pool) disrupted at once by consolidation, drift or
    expiry."""
    termination_grace_period_minutes: Annotated[int, Field(ge=1)] | None = None
    """Karpenter's `terminationGracePeriod`: with it set, drift and expiry delete pods that carry
    `karpenter.sh/do-not-disrupt` once it runs out (upstream concepts/disruption.md), so `validate`
    refuses it on a pool that serves a model. Null (no bound) is the only value for serving pools."""
    node_class: NodeClassRefConfig | None = None
    """Mode `existing`: the node class the cluster already has (the stack creates none there). Mode
    `eks`: leave null; the stack creates an EC2NodeClass named after the group."""

    @model_validator(mode="after")
    def _capacity_types_as_karpenter_orders_them(self) -> KarpenterPoolConfig:
        if len(set(self.capacity_types)) != len(self.capacity_types):
            raise ConfigProblem("lists a capacity type twice; keep one", at=("capacity_types",))
        ordered = sorted(self.capacity_types, key=KARPENTER_CAPACITY_ORDER.index)
        if self.capacity_types != ordered:
            raise ConfigProblem(
                "Karpenter launches reserved capacity first, then spot wherever it is offered, then "
                f"on-demand; list them in that order ({ordered}), or drop the types it should not use",
                at=("capacity_types",),
                value=self.capacity_types,
            )
        if "reserved" in self.capacity_types and not self.capacity_reservation_ids:
            raise ConfigProblem(
                "`reserved` needs the reservations to launch into: list their ids (cr-...) in "
                "capacity_reservation_ids, or remove `reserved`",
                at=("capacity_types",),
                value=self.capacity_types,
            )
        if self.capacity_reservation_ids and "reserved" not in self.capacity_types:
            raise ConfigProblem(
                "reservations are used only for capacity type `reserved`; add it first to "
                "capacity_types, or remove the ids",
                at=("capacity_reservation_ids",),
                value=self.capacity_reservation_ids,
            )
        return self


class GpuNodeGroupConfig(StrictModel):
    instance_types: Annotated[list[str], Field(min_length=1)]
    """GPU instance types from domain/catalogue/gpu_instances.yaml, all with the same GPU model."""
    capacity_type: Literal["on_demand", "spot"] = "on_demand"
    """`on_demand` or `spot` (not for a group holding a multi-node model: one interruption stops a
    whole group; `validate` refuses it, issue 50)."""
    min_size: Annotated[int, Field(ge=0)] = 0
    """Fewest nodes (0 lets the group scale to zero)."""
    desired_size: Annotated[int, Field(ge=0)] = 1
    """Nodes at creation (later changes are the Cluster Autoscaler's)."""
    max_size: Annotated[int, Field(ge=1)] = 2
    """Most nodes; bounds how far model autoscaling can go."""
    disk_size_gib: Annotated[int, Field(ge=80)] = 200
    """Root volume: the vLLM image alone is 10–25 GB, plus containerd's unpacked layers."""
    taints: Annotated[list[TaintConfig], Field(min_length=1)] = [DEFAULT_GPU_TAINT]
    """Node taints; every GPU workload tolerates exactly these. Default `nvidia.com/gpu=true:NoSchedule`."""
    labels: Labels = {}
    """Extra Kubernetes labels (the stack adds `vllm-platform/gpu-group` and `vllm-platform/gpu-model`).
    In mode `eks`, keys and values of 1-63 characters in all (EKS refuses a longer prefixed key and an
    empty value; botocore's model, checked at validate time)."""
    local_nvme: LocalNvmeConfig = LocalNvmeConfig()
    """Instance-store NVMe assembled and mounted for the node-local model copy."""
    ami_type: Literal["AL2023_x86_64_NVIDIA", "BOTTLEROCKET_x86_64_NVIDIA"] = "AL2023_x86_64_NVIDIA"
    """EKS-optimised accelerated AMI (NVIDIA driver and container toolkit included)."""
    image_pull: ImagePullConfig = ImagePullConfig()
    """How new nodes get the vLLM image: SOCI parallel pull, parallel kubelet pulls, a fast root
    volume, optionally a snapshot that already holds the image."""
    provisioner: Literal["managed", "karpenter"] = "managed"
    """`managed`: an EKS managed node group scaled by the Cluster Autoscaler. `karpenter`: a Karpenter
    NodePool + EC2NodeClass (settings in `karpenter`), which launches any of `instance_types` in any
    capacity type and zone that has room. Both kinds can live in one stack (docs/autoscaling.md)."""
    karpenter: KarpenterPoolConfig = KarpenterPoolConfig()
    """The pool's settings when `provisioner: karpenter`."""

    @model_validator(mode="after")
    def _instance_types_known_and_uniform(self) -> GpuNodeGroupConfig:
        check_size_order(self.min_size, self.desired_size, self.max_size)
        if self.ami_type.startswith("BOTTLEROCKET") and self.local_nvme.enabled:
            raise ConfigProblem(
                "assembling instance-store NVMe disks is implemented for AL2023 nodes only (local_nvme is on "
                "by default); set local_nvme.enabled: false on this Bottlerocket group, or ami_type: "
                "AL2023_x86_64_NVIDIA",
                at=("local_nvme", "enabled"),
                value=True,
            )
        known = gpu_instance_types()
        gpu_models = set()
        for index, name in enumerate(self.instance_types):
            instance = lookup_instance_type(name)
            if instance is None:
                import difflib

                close = difflib.get_close_matches(name, known, n=3)
                hint = f"did you mean {', '.join(close)}? " if close else ""
                raise ConfigProblem(
                    f"unknown GPU instance type: {hint}the catalogue (domain/catalogue/gpu_instances.yaml) "
                    f"knows {', '.join(sorted({i.split('.')[0] for i in known}))} families",
                    at=("instance_types", index),
                )
            gpu_models.add(instance.gpu.name)
        if len(gpu_models) > 1:
            raise ConfigProblem(
                "all instance types of one GPU group must carry the same GPU model "
                f"(found {', '.join(sorted(gpu_models))}): "
                "capacity plans and vLLM's compile cache are per GPU model; split them into separate groups",
                at=("instance_types",),
            )
        taint_keys = [(taint.key, taint.effect) for taint in self.taints]
        if len(set(taint_keys)) != len(taint_keys):
            raise ConfigProblem("two taints with the same key and effect; keep one", at=("taints",))
        if self.provisioner == "karpenter" and self.min_size > 0:
            raise ConfigProblem(
                "a Karpenter pool keeps no nodes without pods: min_size must be 0 (a model's own "
                "min_replicas keeps its nodes); for capacity that stays up whatever runs, use a "
                "managed group (provisioner: managed)",
                at=("min_size",),
                value=self.min_size,
            )
        return self

    @property
    def is_karpenter_pool(self) -> bool:
        return self.provisioner == "karpenter"

    @property
    def max_gpus_per_node(self) -> int:
        return max(instance.gpus_per_node for instance in self.gpu_instances)

    @property
    def pool_gpu_limit(self) -> int:
        """The NodePool's `nvidia.com/gpu` limit (karpenter.max_gpus, default max_size × the most GPUs)."""
        return self.karpenter.max_gpus or self.max_size * self.max_gpus_per_node

    @property
    def gpu_instances(self):
        return [lookup_instance_type(name) for name in self.instance_types]

    @property
    def gpu_model(self):
        return self.gpu_instances[0].gpu

    @property
    def min_gpus_per_node(self) -> int:
        return min(instance.gpus_per_node for instance in self.gpu_instances)


def check_size_order(min_size: int, desired_size: int, max_size: int) -> None:
    if min_size > max_size:
        raise ConfigProblem(
            f"min_size {min_size} is larger than max_size {max_size}; raise max_size",
            at=("min_size",),
            value=min_size,
        )
    if not min_size <= desired_size <= max_size:
        raise ConfigProblem(
            f"desired_size must lie between min_size {min_size} and max_size {max_size}",
            at=("desired_size",),
            value=desired_size,
        )


class NodeGroupsConfig(StrictModel):
    """Managed node groups: one system group and the GPU groups models run on."""

    system: SystemNodeGroupConfig = SystemNodeGroupConfig()
    """The system group for controllers, Prometheus and add-ons (no GPUs, no taint)."""
    gpu: Annotated[dict[Annotated[str, dns_label(30)], GpuNodeGroupConfig], Field(min_length=1)]
    """GPU node groups keyed by name; models refer to them by that name."""

    @model_validator(mode="after")
    def _managed_groups_and_pools_claim_different_nodes(self) -> NodeGroupsConfig:
        # A pod that tolerates a managed group's taints and selects its labels would also fit a pool
        # with the same ones: the Cluster Autoscaler and Karpenter would both add a node for it.
        managed = {name: group for name, group in self.gpu.items() if not group.is_karpenter_pool}
        for name, pool in self.gpu.items():
            if not pool.is_karpenter_pool:
                continue
            for other, group in managed.items():
                same_taints = {str(t) for t in pool.taints} == {str(t) for t in group.taints}
                if same_taints and dict(pool.labels) == dict(group.labels):
                    raise ConfigProblem(
                        f"this Karpenter pool claims the same taints and labels as managed group "
                        f"'{other}': a pod that fits one fits the other, and the Cluster Autoscaler and "
                        "Karpenter would both add a node for it; give the pool a label of its own "
                        "(e.g. labels: {vllm-platform/provisioner: karpenter}) or a taint of its own",
                        at=("gpu", name, "labels"),
                        value=dict(pool.labels),
                    )
        return self
