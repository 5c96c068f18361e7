"""A real Kubernetes control plane with KWOK nodes, inside a loopback-only network namespace.

etcd, kube-apiserver (its own CA and certificates, RBAC and the Node authorizer on, the default
admission chain including PodSecurity and ResourceQuota), kube-controller-manager, kube-scheduler
and KWOK, each built by tools/build.sh. What is switched off, and why:
- the webhook admission plugins (MutatingAdmissionWebhook, ValidatingAdmissionWebhook): the charts
  register admission webhooks whose pods KWOK only pretends to run, so every call to them would
  fail (issue 33: "never patch the charts"). `start_cluster(..., webhook_admission=True)` keeps them
  on for a test whose stack installs no chart webhook and which serves the webhooks it registers
  itself from a process on loopback (tests/cluster/lws.py, tests/test_deploy_multi_node.py);
- the controllers that talk to a cloud (service load balancers, routes, node IPAM).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import tools
from tests.cluster.netns import NetworkNamespace

PROGRAMS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok"]
API_PORT = 6443
ETCD_PORT = 2379
SERVICE_CIDR = "10.96.0.0/12"
POD_CIDR = "10.0.0.1/16"
KWOK_NODE_LABEL = ("kwok.x-k8s.io/node", "fake")
"""Nodes KWOK manages carry this label (and only those)."""
STAGES_FILE = Path(__file__).with_name("kwok-stages.yaml")
DISABLED_ADMISSION_PLUGINS = ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")
DISABLED_CONTROLLERS = (
    "node-ipam-controller",
    "service-lb-controller",
    "node-route-controller",
    "cloud-node-lifecycle-controller",
)
START_TIMEOUT_SECONDS = 120.0
CRD_ESTABLISHED_SECONDS = 300.0
"""How long CRDs may take to be Established (`Cluster.wait_established`)."""
FIRST_KINDS = ("CustomResourceDefinition", "Namespace")
"""Applied before the rest of a render: what other objects are of, or live in."""


class ClusterError(RuntimeError):
    pass


@dataclass
class Cluster:
    """A running control plane: run kubectl (or any client) inside its namespace."""

    netns: NetworkNamespace
    workdir: Path
    kubeconfig: Path
    nodes: list[dict[str, Any]] = field(default_factory=list)

    def kubectl(
        self, *args: str, timeout: float = 120.0, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        kubectl = tools.program("kubectl")
        assert kubectl is not None
        return self.netns.run(
            [str(kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            timeout=timeout,
            check=check,
            input=input,
        )

    def get(self, kind: str, *, namespace: str | None = None, name: str | None = None) -> Any:
        """`kubectl get -o json`: one object (with `name`) or the list of items."""
        where = ["-n", namespace] if namespace else ["-A"]
        result = json.loads(self.kubectl("get", kind, *([name] if name else []), *where, "-o", "json").stdout)
        return result if name else result["items"]

    def get_selected(self, kind: str, selector: str) -> list[Any]:
        return json.loads(self.kubectl("get", kind, "-A", "-l", selector, "-o", "json").stdout)["items"]

    def apply_objects(self, objects: Iterable[dict[str, Any]], *, field_manager: str = "vllm-platform-test"):
        """Server-side apply of a batch of objects (one kubectl call)."""
        documents = yaml.safe_dump_all(list(objects), sort_keys=False)
        return self.kubectl(
            "apply",
            "--server-side",
            f"--field-manager={field_manager}",
            "--force-conflicts",
            "-f",
            "-",
            input=documents,
            timeout=300,
            check=False,
        )

    def apply_in_dependency_order(
        self, objects: Sequence[dict[str, Any]], *, once_crds_established: Callable[[], None] | None = None
    ) -> list[subprocess.CompletedProcess[str]]:
        """CRDs and Namespaces first, then, once every CRD is Established, everything else (what
        `kubectl apply` of a whole render needs); one result per batch."""
        first = [obj for obj in objects if obj["kind"] in FIRST_KINDS]
        results = [self.apply_objects(first)]
        self.wait_established()
        if once_crds_established:
            once_crds_established()
        results.append(self.apply_objects([obj for obj in objects if obj["kind"] not in FIRST_KINDS]))
        return results

    def wait_established(self, names: Sequence[str] = (), timeout: float = CRD_ESTABLISHED_SECONDS) -> None:
        """Wait until the CRDs `names` (every CRD without names) are Established. Bounded by
        `timeout`; on a busy machine the API server's establishing controller took over 60 s (CI,
        2026-12-06), so the bound is generous and the error names what was not Established."""
        targets = [f"crd/{name}" for name in names] or ["crd", "--all"]
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(1, int(deadline - time.monotonic()))
            result = self.kubectl(
                "wait",
                "--for=condition=Established",
                *targets,
                f"--timeout={remaining}s",
                timeout=remaining + 60,
                check=False,
            )
            # A CRD created a moment ago has no status.conditions yet, and `kubectl wait` gives up at
            # once on it (".status.conditions accessor error: <nil>") instead of waiting: seen on a
            # busy machine (2026-12-07). Asked again until the deadline; any other error ends it.
            not_yet = "accessor error" in result.stderr and "<nil>" in result.stderr
            if result.returncode == 0 or not not_yet or time.monotonic() >= deadline:
                break
            time.sleep(1)
        if result.returncode != 0:
            conditions = self.kubectl(
                "get",
                "crd",
                "-o",
                "custom-columns=NAME:.metadata.name,ESTABLISHED:.status.conditions[?(@.type=='Established')].status",
                check=False,
            )
            raise ClusterError(
                f"CRDs not Established within {timeout:.0f} s: {result.stderr.strip()}\n{conditions.stdout}"
            )

    def log(self, name: str) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for(self, what: str, condition, timeout: float = 120.0, interval: float = 1.0):
        """Poll `condition()` until it returns something truthy; bounded by `timeout`."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = condition()
            if last:
                return last
            time.sleep(interval)
        raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def _openssl(workdir: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=workdir, check=True, capture_output=True, timeout=60)


def write_certificates(pki: Path) -> None:
    """A CA, the API server's serving certificate, an admin client certificate (system:masters)
    and the service-account signing key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        pki,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=vllm-platform-test-ca",
    )
    sans = ",".join(
        [
            "IP:127.0.0.1",
            "IP:10.96.0.1",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
    )
    (pki / "apiserver.ext").write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    (pki / "admin.ext").write_text("extendedKeyUsage=clientAuth\n")
    _signed_certificate(pki, "apiserver", "/CN=kube-apiserver", "apiserver.ext")
    _signed_certificate(pki, "admin", "/O=system:masters/CN=vllm-platform-test-admin", "admin.ext")
    _openssl(pki, "genrsa", "-out", "sa.key", "2048")
    _openssl(pki, "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")


def _signed_certificate(pki: Path, name: str, subject: str, extensions: str) -> None:
    """`<name>.key` and `<name>.crt` in `pki`: a new key pair for `subject`, signed by the fixture's CA
    with the extensions file `extensions` (in `pki`)."""
    _openssl(pki, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject)  # fmt: skip
    _openssl(pki, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", extensions)  # fmt: skip


def write_serving_certificate(pki: Path, name: str, sans: Sequence[str]) -> None:
    """`<name>.crt` and `<name>.key` in `pki`, a server certificate for `sans` (e.g. "IP:127.0.0.1")
    signed by the fixture's CA (write_certificates made it), for a webhook server of a test."""
    (pki / f"{name}.ext").write_text(f"subjectAltName={','.join(sans)}\nextendedKeyUsage=serverAuth\n")
    _signed_certificate(pki, name, f"/CN={name}", f"{name}.ext")


def write_kubeconfig(path: Path, pki: Path) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kwok",
                "cluster": {
                    "server": f"https://127.0.0.1:{API_PORT}",
                    "certificate-authority": str(pki / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")},
            }
        ],
        "contexts": [{"name": "kwok-admin", "context": {"cluster": "kwok", "user": "admin"}}],
        "current-context": "kwok-admin",
    }
    path.write_text(yaml.safe_dump(config))


def _binary(name: str) -> str:
    path = tools.program(name)
    if path is None:
        raise ClusterError(tools.missing_reason([name]) or name)
    return str(path)


def start_cluster(
    netns: NetworkNamespace,
    workdir: Path,
    nodes: Sequence[dict[str, Any]],
    *,
    webhook_admission: bool = False,
) -> Cluster:
    """Start the control plane and KWOK in `netns`, register `nodes`, wait until all are Ready.
    `webhook_admission`: keep the webhook admission plugins on (off by default: see the module)."""
    pki = workdir / "pki"
    logs = workdir / "logs"
    write_certificates(pki)
    kubeconfig = workdir / "admin.kubeconfig"
    write_kubeconfig(kubeconfig, pki)
    cluster = Cluster(netns=netns, workdir=workdir, kubeconfig=kubeconfig)

    netns.start(
        [
            _binary("etcd"),
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{ETCD_PORT}",
            f"--advertise-client-urls=http://127.0.0.1:{ETCD_PORT}",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=default=http://127.0.0.1:2380",
            "--unsafe-no-fsync",
        ],
        log=logs / "etcd.log",
    )
    netns.start(
        [
            _binary("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={API_PORT}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            *(
                []
                if webhook_admission
                else [f"--disable-admission-plugins={','.join(DISABLED_ADMISSION_PLUGINS)}"]
            ),
            "--allow-privileged=true",
            "--profiling=false",
        ],
        log=logs / "kube-apiserver.log",
    )
    cluster.wait_for(
        "the API server's /readyz",
        lambda: cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0,
        timeout=START_TIMEOUT_SECONDS,
    )
    netns.start(
        [
            _binary("kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            "--secure-port=10257",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*," + ",".join(f"-{name}" for name in DISABLED_CONTROLLERS),
            # Namespaces and garbage collection finish quickly in tests.
            "--concurrent-namespace-syncs=10",
            # A pod create that loses a race (the StatefulSet controller's second create of a pod,
            # "already exists") has already been charged by ResourceQuota admission; the quota
            # controller gives the charge back only at its next full sync, 5 min by default, longer
            # than a step waits. A model namespace's GPU quota has room for one surge set only, so
            # one such charge held a second group's worker out (CI, 2026-12-07). 30 s here; a real
            # control plane keeps 5 min (docs/multi-node.md).
            "--resource-quota-sync-period=30s",
        ],
        log=logs / "kube-controller-manager.log",
    )
    netns.start(
        [
            _binary("kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            "--secure-port=10259",
            "--leader-elect=false",
        ],
        log=logs / "kube-scheduler.log",
    )
    netns.start(
        [
            _binary("kwok"),
            f"--kubeconfig={kubeconfig}",
            f"--config={STAGES_FILE}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-label-selector={KWOK_NODE_LABEL[0]}={KWOK_NODE_LABEL[1]}",
            # Node leases, renewed like a kubelet's: the node lifecycle controller lifts the not-ready
            # taint the API server puts on every new node, and keeps the nodes Ready.
            "--node-lease-duration-seconds=40",
            f"--cidr={POD_CIDR}",
            "--node-ip=10.0.0.1",
            "--server-address=127.0.0.1:10247",
        ],
        log=logs / "kwok.log",
    )

    # The default ServiceAccount exists once the controller manager runs its token controllers.
    cluster.wait_for(
        "the controller manager (default ServiceAccount)",
        lambda: cluster.kubectl("get", "serviceaccount", "default", check=False, timeout=10).returncode == 0,
        timeout=START_TIMEOUT_SECONDS,
    )
    if nodes:
        applied = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump_all(list(nodes)), timeout=120)
        assert applied.returncode == 0, applied.stderr
        cluster.nodes = list(nodes)
        cluster.wait_for(
            f"{len(nodes)} KWOK nodes Ready",
            lambda: _ready_node_count(cluster) == len(nodes),
            timeout=START_TIMEOUT_SECONDS,
        )
    return cluster


def _ready_node_count(cluster: Cluster) -> int:
    count = 0
    for node in cluster.get("nodes"):
        conditions = node.get("status", {}).get("conditions", [])
        count += any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return count


def start_rollouts_controller(cluster: Cluster) -> None:
    """Argo Rollouts' controller, run as a process against the cluster (the chart's controller pod is
    only KWOK's), so canary Rollouts get real ReplicaSets and pods. Start it once its CRDs exist."""
    cluster.netns.start(
        [
            _binary("rollouts-controller"),
            f"--kubeconfig={cluster.kubeconfig}",
            "--leader-elect=false",
            "--metricsport=18090",
            "--healthzPort=18091",
            "--loglevel=info",
        ],
        log=cluster.workdir / "logs" / "rollouts-controller.log",
    )


KEDA_NAMESPACE = "keda"
"""Where the pinned KEDA chart installs its operator (components/cluster_addons.py)."""


def start_keda_operator(cluster: Cluster, *, http_timeout_ms: int = 3000) -> None:
    """KEDA's operator, run as a process against the cluster (the chart's operator pod is only
    KWOK's), so ScaledObjects get a real scale loop: its Prometheus scalers, activation, cooldown and
    the 0 <-> 1 scaling it does itself, and the HPA it creates for 1 <-> N. Start it once its CRDs
    exist. What it cannot have here:
    - a ServiceAccount: it runs with the fixture's admin kubeconfig, as the rollouts controller does;
    - cert rotation and webhook/APIService patching (`--enable-cert-rotation=false`, the default): they
      serve KEDA's admission webhooks and metrics adapter, whose pods KWOK only pretends to run;
    - its gRPC metrics service's own certificates: that server (which KEDA's metrics adapter dials;
      the adapter does not run here) must load `ca.crt`, `tls.crt`, `tls.key` from `--cert-dir` or the
      operator exits, so it is given the fixture CA and the API server's pair."""
    pki = cluster.workdir / "pki"
    certs = cluster.workdir / "keda-certs"
    certs.mkdir(parents=True, exist_ok=True)
    for source, target in (("ca.crt", "ca.crt"), ("apiserver.crt", "tls.crt"), ("apiserver.key", "tls.key")):
        shutil.copyfile(pki / source, certs / target)
    cluster.netns.start(
        [
            _binary("keda-operator"),
            f"--kubeconfig={cluster.kubeconfig}",
            "--leader-elect=false",
            "--enable-cert-rotation=false",
            f"--cert-dir={certs}",
            "--metrics-bind-address=127.0.0.1:18080",
            "--health-probe-bind-address=127.0.0.1:18081",
            "--metrics-service-bind-address=127.0.0.1:19666",
            "--zap-log-level=info",
        ],
        log=cluster.workdir / "logs" / "keda-operator.log",
        env={
            **os.environ,
            # Every namespace, as the chart's operator watches; its cluster-scoped objects' Secrets
            # (ClusterTriggerAuthentication) live in the chart's namespace.
            "WATCH_NAMESPACE": "",
            "POD_NAMESPACE": KEDA_NAMESPACE,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE,
            "KEDA_HTTP_DEFAULT_TIMEOUT": str(http_timeout_ms),
        },
    )
