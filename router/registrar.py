"""Keep vLLM's router (vllm-router, `--enable-igw`) told which vLLM pods serve which model.

vllm-router 0.1.17 routes by the `model` of a request only in its multi-model ("IGW") mode, and
there it learns workers and their model names solely through its `POST /workers` API: its own
Kubernetes discovery watches one label selector and names every pod's model "unknown". This sidecar
is the missing link, and nothing more: every few seconds it reads the EndpointSlices of each model's
Service (`vllm` in `vllm-<model>`), takes the ready endpoints, and makes the router's worker list
equal to them (`POST /workers` with the served model name and the model's routing policy, `DELETE
/workers/<url>` for pods that went away or stopped being ready). The router does the rest: per-model
policy, health checks, circuit breaking, retries before the first byte.

Stdlib only (it runs in the router image beside vllm-router). Run:

    python registrar.py --config /etc/vllm-router/registrar.json

The config (rendered by components/router.py) is
`{"router_url": ..., "interval_seconds": 5, "models": [{"model_id", "namespace", "service",
"port_name", "policy"}]}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG = logging.getLogger("vllm-router-registrar")
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


@dataclass(frozen=True)
class ModelTarget:
    """One model the router serves: where its pods are listed and how the router balances them."""

    model_id: str
    namespace: str
    service: str
    port_name: str
    policy: str


@dataclass(frozen=True)
class Worker:
    url: str
    model_id: str
    policy: str


def ready_endpoint_urls(endpoint_slices: Mapping[str, Any], port_name: str) -> list[str]:
    """`http://<address>:<port>` of every ready, not terminating endpoint in an EndpointSliceList.

    A terminating pod is left out even while it still finishes its streams (serving=true): the
    router must stop sending it new requests the moment it starts to drain, as the ALB does.
    """
    urls: set[str] = set()
    for item in endpoint_slices.get("items") or []:
        ports = [p.get("port") for p in item.get("ports") or [] if p.get("name") == port_name]
        if not ports or ports[0] is None:
            continue
        for endpoint in item.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            if conditions.get("ready") is not True or conditions.get("terminating") is True:
                continue
            for address in endpoint.get("addresses") or []:
                host = f"[{address}]" if ":" in address else address
                urls.add(f"http://{host}:{ports[0]}")
    return sorted(urls)


def desired_workers(
    targets: Iterable[ModelTarget], list_endpoint_slices: Callable[[str, str], Mapping[str, Any]]
) -> dict[str, Worker]:
    """Every worker the router should know, by URL (the router keys workers by URL)."""
    workers: dict[str, Worker] = {}
    for target in targets:
        slices = list_endpoint_slices(target.namespace, target.service)
        for url in ready_endpoint_urls(slices, target.port_name):
            workers[url] = Worker(url=url, model_id=target.model_id, policy=target.policy)
    return workers


class RouterClient:
    """The router's worker API (vllm-router 0.1.17 `GET/POST /workers`, `DELETE /workers/{url}`)."""

    def __init__(self, base_url: str, timeout_seconds: float = 5) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.base_url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    def workers(self) -> dict[str, Worker]:
        listed = self._request("GET", "/workers") or {}
        return {
            w["url"]: Worker(
                url=w["url"],
                model_id=w.get("model_id", ""),
                policy=(w.get("metadata") or {}).get("policy", ""),
            )
            for w in listed.get("workers") or []
        }

    def add(self, worker: Worker) -> None:
        self._request(
            "POST",
            "/workers",
            {"url": worker.url, "model_id": worker.model_id, "labels": {"policy": worker.policy}},
        )

    def remove(self, url: str) -> None:
        self._request("DELETE", "/workers/" + urllib.parse.quote(url, safe=""))


def reconcile(router: RouterClient, desired: Mapping[str, Worker]) -> tuple[list[str], list[str]]:
    """Make the router's workers equal `desired`; returns (added, removed) URLs."""
    current = router.workers()
    added = [url for url, worker in sorted(desired.items()) if current.get(url) != worker]
    removed = [url for url in sorted(current) if url not in desired]
    for url in removed:
        router.remove(url)
    for url in added:
        router.add(desired[url])
    return added, removed


class KubernetesApi:
    """Reads EndpointSlices with the pod's service-account token (RBAC: list in each model namespace)."""

    def __init__(
        self, host: str, port: str, account_dir: Path = SERVICE_ACCOUNT_DIR, timeout_seconds: float = 10
    ) -> None:
        self.base_url = f"https://{host}:{port}"
        self.account_dir = account_dir
        self.context = ssl.create_default_context(cafile=str(account_dir / "ca.crt"))
        self.timeout_seconds = timeout_seconds

    def list_endpoint_slices(self, namespace: str, service: str) -> Mapping[str, Any]:
        selector = urllib.parse.quote(f"{SERVICE_NAME_LABEL}={service}")
        path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        url = f"{self.base_url}{path}?labelSelector={selector}"
        # Re-read every time: the kubelet rotates projected tokens.
        token = (self.account_dir / "token").read_text().strip()
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=self.timeout_seconds, context=self.context) as response:
            result: Mapping[str, Any] = json.loads(response.read())
            return result


def load_targets(config: Mapping[str, Any]) -> list[ModelTarget]:
    return [ModelTarget(**model) for model in config["models"]]


def run_forever(config: Mapping[str, Any], api: KubernetesApi) -> None:
    router = RouterClient(config["router_url"])
    targets = load_targets(config)
    interval = float(config.get("interval_seconds", 5))
    while True:
        try:
            added, removed = reconcile(router, desired_workers(targets, api.list_endpoint_slices))
            if added or removed:
                LOG.info("workers added %s, removed %s", added, removed)
        except (OSError, urllib.error.URLError, ValueError, KeyError) as error:
            # The router may still be starting, or the API briefly unreachable: try again next round.
            LOG.warning("reconcile failed: %s", error)
        time.sleep(interval)


def main(argv: list[str] | None = None) -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = json.loads(args.config.read_text())
    api = KubernetesApi(
        os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    )
    run_forever(config, api)


if __name__ == "__main__":
    main(sys.argv[1:])
