"""Register each model's router with the front router, and keep them registered.

Why a sidecar: vllm-router 0.1.17 routes by the `model` of a request only in its multi-model mode
(`--enable-igw`), and there it learns workers and their model names solely through its
`POST /workers` API. In that mode its prefix-aware policy also does not track load (measured:
every new prefix went to the first replica), while its single-model mode does (docs/routing.md).
So a router pod runs one single-model vllm-router per model (upstream's own Kubernetes discovery
finds that model's pods) and a front vllm-router in multi-model mode whose only workers are those
per-model routers on localhost. This sidecar makes the front's worker list equal to that fixed list,
every few seconds, so a restarted front container is re-registered within one interval.

Stdlib only (it runs in the router image). Run:

    python registrar.py --config /etc/vllm-router/registrar.json

The config (rendered by components/router.py) is
`{"router_url": ..., "interval_seconds": 5, "workers": [{"url", "model_id", "policy"}]}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG = logging.getLogger("vllm-router-registrar")


@dataclass(frozen=True)
class Worker:
    url: str
    model_id: str
    policy: str


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
    """Make the router's workers equal `desired` (by URL); returns (added, removed) URLs."""
    current = router.workers()
    added = [url for url, worker in sorted(desired.items()) if current.get(url) != worker]
    removed = [url for url in sorted(current) if url not in desired]
    for url in removed:
        router.remove(url)
    for url in added:
        router.add(desired[url])
    return added, removed


def desired_workers(config: Mapping[str, Any]) -> dict[str, Worker]:
    return {
        w["url"]: Worker(url=w["url"], model_id=w["model_id"], policy=w["policy"]) for w in config["workers"]
    }


def run_forever(config: Mapping[str, Any]) -> None:
    router = RouterClient(config["router_url"])
    desired = desired_workers(config)
    interval = float(config.get("interval_seconds", 5))
    while True:
        try:
            added, removed = reconcile(router, desired)
            if added or removed:
                LOG.info("workers added %s, removed %s", added, removed)
        except (OSError, urllib.error.URLError, ValueError, KeyError) as error:
            # The front router may still be starting or restarting: try again next round.
            LOG.warning("reconcile failed: %s", error)
        time.sleep(interval)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    run_forever(json.loads(args.config.read_text()))


if __name__ == "__main__":
    main(sys.argv[1:])
