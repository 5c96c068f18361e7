"""The real LeaderWorkerSet controller on the fixture's control plane (issue 42): `lws-controller`
v0.10.0 (upstream's manager, built outside this repository: ../shared/tools/lws/README.md) run as a
process beside the API server, the scheduler and the controllers, as the rollouts controller, KEDA's
operator and Karpenter are.

Its admission webhooks are not optional: they set the LeaderWorkerSet API defaults (without them every
reconcile panics) and inject `LWS_LEADER_ADDRESS`, `LWS_GROUP_SIZE` and `LWS_WORKER_INDEX` into the pods.
So the cluster runs with webhook admission on (`start_cluster(..., webhook_admission=True)`) and:
- the API: the CRDs of the pinned `lws` chart, rendered by Helm's engine from the chart cache;
- a serving certificate for 127.0.0.1 signed by the fixture's CA (control_plane.py
  `write_serving_certificate`), in the controller's cert folder; internal certificate management off;
- the controller, with a `-config` file of ours: no leader election, its webhook server on
  127.0.0.1:WEBHOOK_PORT, metrics and health on ports of their own;
- webhook configurations of ours (`webhook_configurations`): the rules of upstream's, each calling
  `https://127.0.0.1:WEBHOOK_PORT/<path>` with the fixture's CA as `caBundle`. Inside the network
  namespace 127.0.0.1 is the controller; nothing is dialled anywhere else.

The stack under test then leaves LWS's chart out (`addons.leader_worker_set: false`: the cluster runs
its own controller): the chart's webhook configurations call `lws-webhook-service.lws-system.svc`,
which the API server resolves to a Service IP that does not exist in the namespace, so with webhook
admission on they would refuse every LeaderWorkerSet and every group pod.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from components.helm.cache import cached_chart_path
from components.helm.engine import render_chart
from components.helm.lock import load_lock
from components.multi_node_addons import LWS_NAMESPACE
from domain.versions import DEFAULT_KUBERNETES_VERSION, LWS_CHART
from tests.cluster.control_plane import Cluster, ClusterError, write_serving_certificate
from tests.cluster.fixtures import REPO

LWS_TOOLS_ENV = "VLLM_PLATFORM_LWS_TOOLS"
"""The folder holding `lws-controller`; by default the shared tools folder beside the repository."""
CONTROLLER = "lws-controller"
WEBHOOK_PORT = 19443
METRICS_PORT = 18280
HEALTH_PORT = 18281
WEBHOOK_PATHS = {
    "leaderworkerset-mutate": "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
    "leaderworkerset-validate": "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
    "pod-mutate": "/mutate--v1-pod",
    "pod-validate": "/validate--v1-pod",
}
"""The paths lws-controller v0.10.0 serves (../shared/tools/lws/README.md). DisaggregatedSet's webhook is
not registered: the stack creates none and its chart value (`enableDisaggregatedSet`) is off."""
GROUP_POD_LABEL = "leaderworkerset.sigs.k8s.io/name"
"""LWS puts it on every pod of a group; the pod webhooks match only those pods."""
CONFIGURATION_NAME = "vllm-platform-test-lws"


def lws_tools() -> Path:
    configured = os.environ.get(LWS_TOOLS_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    return REPO.parent / "shared" / "tools" / "lws"


def controller_binary() -> Path | None:
    path = lws_tools() / CONTROLLER
    return path if path.is_file() and os.access(path, os.X_OK) else None


def missing_reason() -> str | None:
    if controller_binary() is None:
        return (
            f"no executable {CONTROLLER} in {lws_tools()} (set ${LWS_TOOLS_ENV} to the folder of the "
            "LeaderWorkerSet controller v0.10.0 built as its README says)"
        )
    return None


def lws_crds() -> list[dict[str, Any]]:
    """The CRDs of the pinned lws chart, rendered by Helm's engine from the chart cache."""
    objects = render_chart(
        cached_chart_path(load_lock()[LWS_CHART.chart]),
        release="lws",
        namespace=LWS_NAMESPACE,
        values={},
        kubernetes_version=DEFAULT_KUBERNETES_VERSION,
    )
    return [item.object for item in objects if item.kind == "CustomResourceDefinition"]


def install_lws_api(cluster: Cluster) -> None:
    """The CRDs (Established) and the controller's namespace, where it keeps nothing but its identity."""
    crds = lws_crds()
    cluster.apply_objects(
        [*crds, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LWS_NAMESPACE}}]
    )
    cluster.wait_established([crd["metadata"]["name"] for crd in crds])


def _webhook(name: str, path: str, ca_bundle: str, rule: dict[str, Any], *, pods: bool) -> dict[str, Any]:
    webhook: dict[str, Any] = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": f"https://127.0.0.1:{WEBHOOK_PORT}{path}", "caBundle": ca_bundle},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        # The API's most: the controller answers in milliseconds, but beside a busy machine (load 11:
        # the unit tier and this test) a call once took over 10 s and failed the set's creation.
        "timeoutSeconds": 30,
        "rules": [rule],
    }
    if pods:
        webhook["objectSelector"] = {"matchExpressions": [{"key": GROUP_POD_LABEL, "operator": "Exists"}]}
    return webhook


def webhook_configurations(ca_bundle: str) -> list[dict[str, Any]]:
    """LWS's mutating and validating webhooks at the controller's loopback address: for
    LeaderWorkerSets (create, update) and for the pods of groups (create; validation also update)."""
    sets = {
        "apiGroups": ["leaderworkerset.x-k8s.io"],
        "apiVersions": ["v1"],
        "resources": ["leaderworkersets"],
        "operations": ["CREATE", "UPDATE"],
    }
    pods = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION_NAME},
            "webhooks": [
                _webhook(
                    "mleaderworkerset.lws.test",
                    WEBHOOK_PATHS["leaderworkerset-mutate"],
                    ca_bundle,
                    sets,
                    pods=False,
                ),
                _webhook(
                    "mpod.lws.test",
                    WEBHOOK_PATHS["pod-mutate"],
                    ca_bundle,
                    {**pods, "operations": ["CREATE"]},
                    pods=True,
                ),
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION_NAME},
            "webhooks": [
                _webhook(
                    "vleaderworkerset.lws.test",
                    WEBHOOK_PATHS["leaderworkerset-validate"],
                    ca_bundle,
                    sets,
                    pods=False,
                ),
                _webhook(
                    "vpod.lws.test",
                    WEBHOOK_PATHS["pod-validate"],
                    ca_bundle,
                    {**pods, "operations": ["CREATE", "UPDATE"]},
                    pods=True,
                ),
            ],
        },
    ]


def controller_configuration(cert_dir: Path) -> dict[str, Any]:
    """lws-controller's `-config` (apiVersion config.lws.x-k8s.io/v1alpha1)."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": WEBHOOK_PORT, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"127.0.0.1:{METRICS_PORT}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{HEALTH_PORT}"},
    }


_SERVING_PROBE = """
import ssl, sys, urllib.request
context = ssl.create_default_context(cafile=sys.argv[2])
try:
    urllib.request.urlopen(sys.argv[1], context=context, timeout=5)
except urllib.error.HTTPError:
    pass  # any HTTP answer over verified TLS: the server is up
"""


def start_lws_controller(cluster: Cluster) -> subprocess.Popen:
    """The controller as a process (admin kubeconfig), its webhooks registered once it answers TLS.
    Call after install_lws_api."""
    binary = controller_binary()
    if binary is None:
        raise ClusterError(missing_reason() or CONTROLLER)
    pki = cluster.workdir / "pki"
    write_serving_certificate(pki, "lws-webhook", ["IP:127.0.0.1"])
    cert_dir = cluster.workdir / "lws-certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pki / "lws-webhook.crt", cert_dir / "tls.crt")
    shutil.copyfile(pki / "lws-webhook.key", cert_dir / "tls.key")
    config_file = cluster.workdir / "lws-controller.yaml"
    config_file.write_text(yaml.safe_dump(controller_configuration(cert_dir), sort_keys=False))
    process = cluster.netns.start(
        [str(binary), f"-kubeconfig={cluster.kubeconfig}", f"-config={config_file}", "-zap-log-level=2"],
        log=cluster.workdir / "logs" / "lws-controller.log",
        # The namespace the chart would run it in (its downward-API variable).
        env={**os.environ, "NAMESPACE": LWS_NAMESPACE, "POD_NAMESPACE": LWS_NAMESPACE},
    )
    url = f"https://127.0.0.1:{WEBHOOK_PORT}/"  # no webhook's path: a 404, nothing in its log

    def serving() -> bool:
        if process.poll() is not None:
            raise ClusterError(f"{CONTROLLER} exited: {cluster.log('lws-controller')[-3000:]}")
        probe = [sys.executable, "-c", _SERVING_PROBE, url, str(pki / "ca.crt")]
        return cluster.netns.run(probe, timeout=30, check=False).returncode == 0

    cluster.wait_for(
        f"{CONTROLLER}'s webhook server on 127.0.0.1:{WEBHOOK_PORT}", serving, timeout=120, interval=1
    )
    ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
    applied = cluster.apply_objects(webhook_configurations(ca_bundle))
    if applied.returncode != 0:
        raise ClusterError(f"registering LWS's webhooks: {applied.stderr}")
    return process
