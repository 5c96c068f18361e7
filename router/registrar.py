"""Register each model's router with the front router, and keep them registered.

Why a sidecar: vllm-router 0.1.17 routes by the `model` of a request only in its multi-model mode
(`--enable-igw`), and there it learns workers and their model names solely through its
`POST /workers` API. In that mode its prefix-aware policy also does not track load (measured:
every new prefix went to the first replica), while its single-model mode does (docs/routing.md).
So a router pod runs one single-model vllm-router per model (upstream's own Kubernetes discovery
finds that model's pods) and a front vllm-router in multi-model mode whose only workers are those
per-model routers on localhost. This sidecar makes the front's worker list equal to that fixed list,
every few seconds, so a restarted front container is re-registered within one interval.

It also answers `GET /v1/models` for the unified endpoint (`ModelsServer`, port `models_port`),
because no upstream piece does: the front answers that route in its own shape (`{"models": [...]}`,
not OpenAI's list, so OpenAI SDKs' `models.list()` fails on it) and checks no key, and the router
pod holds no keys to check one with. So the sidecar asks every model's router with the client's
`Authorization` header (and nothing else); each model router forwards it to one of the model's vLLM
pods, which checks the key as on every `/v1` route. The list is the models whose vLLM said 200: a key
lists exactly the models it is valid for.

A model that scales to zero (`scale_to_zero: true`, issue 35) has no vLLM to ask while it sleeps, and
its router holds a request until a replica is up: asking it would cost the list the whole hold. So
its router's worker list (`GET /workers`) is read first; with no worker its wake gate
(`front_url`, router/wake_gate.py; issue 40) is asked instead, which answers `/v1/models` itself from
the keys the model's pods accept, so a sleeping model is listed exactly for the keys that may call it
and nothing wakes it. (A worker without a gate is listed, without asking, to any request that
carries an `Authorization` header.)

Stdlib only (it runs in the router image). Run:

    python registrar.py --config /etc/vllm-router/registrar.json

The config (rendered by components/router.py) is
`{"router_url": ..., "interval_seconds": 5, "models_port": 8090, "workers": [{"url", "model_id",
"policy", "served_names", "scale_to_zero", "front_url"}]}`; `served_names` are the model's name and its
LoRA adapters' names (PlatformConfig.served_names), each routed by the front to the model's router;
`scale_to_zero` (default false) marks a model whose replicas may all be gone; `front_url` (optional)
is where the front routes the model instead of its router: a to-zero model's wake gate
(router/wake_gate.py), which passes only requests with a valid key on to the router's hold.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.server
import json
import logging
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG = logging.getLogger("vllm-router-registrar")


@dataclass(frozen=True)
class Worker:
    url: str
    model_id: str
    policy: str
    served_names: tuple[str, ...] = ()
    """Every `model` the worker serves: model_id, then the model's LoRA adapters; () = model_id only."""
    scale_to_zero: bool = False
    """The model may have no replica; its router then holds requests (issue 35)."""
    front_url: str = ""
    """Where the front routes the model: its wake gate (router/wake_gate.py) for a to-zero model, so
    only a valid key reaches the hold (issue 40); '' = `url`, the model's router itself."""

    @property
    def routed_url(self) -> str:
        return self.front_url or self.url

    @property
    def names(self) -> tuple[str, ...]:
        return self.served_names or (self.model_id,)

    def registered_as(self, listed: Worker | None) -> bool:
        """Whether the front's entry for this URL is this worker (the front lists one id per URL)."""
        return listed is not None and (listed.model_id, listed.policy) == (self.model_id, self.policy)


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

    def models(self) -> set[str]:
        """Every model id the front routes (its own `GET /v1/models` shape: `{"models": [...]}`);
        none while it has no worker (it answers 503 then)."""
        try:
            listed = self._request("GET", MODELS_PATH) or {}
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 503:
                return set()
            raise
        return set(listed.get("models") or [])

    def add(self, worker: Worker) -> None:
        # vllm-router 0.1.17 keeps a model -> workers index: POSTing one URL once per name routes
        # every name to it (measured, tests/e2e/test_lora.py), while GET /workers shows one entry per
        # URL with the last name posted. The model's own name goes last, so that entry is model_id.
        for name in (*worker.names[1:], worker.names[0]):
            self._request(
                "POST",
                "/workers",
                {"url": worker.routed_url, "model_id": name, "labels": {"policy": worker.policy}},
            )

    def remove(self, url: str) -> None:
        self._request("DELETE", "/workers/" + urllib.parse.quote(url, safe=""))


def reconcile(router: RouterClient, desired: Mapping[str, Worker]) -> tuple[list[str], list[str]]:
    """Make the router's workers equal `desired` (by the URL the front routes to, `routed_url`), each
    routed under all its served names; returns (added, removed) URLs.

    A name the front stops serving cannot be taken back: 0.1.17 keeps routing a removed worker's
    names to its URL (measured), where vLLM answers 404 for a name it does not serve.
    """
    current = router.workers()
    routed = router.models() if any(len(worker.names) > 1 for worker in desired.values()) else set()
    added = [
        url
        for url, worker in sorted(desired.items())
        if not worker.registered_as(current.get(url))
        or (len(worker.names) > 1 and not set(worker.names) <= routed)
    ]
    removed = [url for url in sorted(current) if url not in desired]
    for url in removed:
        router.remove(url)
    for url in added:
        router.add(desired[url])
    return added, removed


def desired_workers(config: Mapping[str, Any]) -> dict[str, Worker]:
    """The front's workers, keyed by the URL it routes each model to."""
    workers = [
        Worker(
            url=w["url"],
            model_id=w["model_id"],
            policy=w["policy"],
            served_names=tuple(w.get("served_names") or [w["model_id"]]),
            scale_to_zero=bool(w.get("scale_to_zero", False)),
            front_url=w.get("front_url") or "",
        )
        for w in config["workers"]
    ]
    return {worker.routed_url: worker for worker in workers}


MODELS_PATH = "/v1/models"
WORKERS_PATH = "/workers"
MODEL_ROUTER_TIMEOUT_SECONDS = 5.0
"""How long one model's router may take to answer `/v1/models` (vLLM answers it from memory); one
that hangs costs the list this long, never more, since all are asked at once."""
# No proxy from the environment: the client's key goes to localhost only.
_LOCAL_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def openai_error(message: str, code: str, error_type: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


SLEEPING = 200
"""What a sleeping model counts as in the list: listed, as a 200 from its vLLM would be."""


def model_router_is_empty(worker: Worker, timeout_seconds: float) -> bool:
    """Whether the model's router has no worker at all (vllm-router 0.1.17 `GET /workers`:
    `{"workers": [], "total": 0, ...}` on a single-model router with none; measured). An
    unreachable router is not empty: it is asked as any other, and counts as unreachable."""
    request = urllib.request.Request(worker.url.rstrip("/") + WORKERS_PATH)
    try:
        with _LOCAL_OPENER.open(request, timeout=timeout_seconds) as response:
            listed = json.loads(response.read())
    except urllib.error.HTTPError as error:
        error.close()
        return False
    except (OSError, ValueError) as error:
        LOG.debug("%s: no answer to %s: %s", worker.url, WORKERS_PATH, error)
        return False
    return isinstance(listed, dict) and not listed.get("workers")


def sleeping_entries(worker: Worker) -> list[dict[str, Any]]:
    """OpenAI list entries for a model at zero, in vLLM's shape (its adapters with `parent`)."""
    return [
        {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "vllm",
            "parent": None if name == worker.model_id else worker.model_id,
        }
        for name in worker.names
    ]


def ask_model_router(
    worker: Worker, authorization: str | None, timeout_seconds: float
) -> tuple[int | None, list[dict[str, Any]]]:
    """One model router's `GET /v1/models` with the client's key: (status or None if unreachable,
    the entries for the names it routes: the model and its LoRA adapters, which vLLM lists with
    `parent` set to the model; vLLM may list more names for one process). A to-zero model whose
    router has no worker is not asked (see the module's docstring): its wake gate answers for it from
    the keys its pods accept, without waking it; without a gate, listed for any key, 401 without."""
    url = worker.url
    if worker.scale_to_zero and model_router_is_empty(worker, timeout_seconds):
        if not worker.front_url:
            return (SLEEPING, sleeping_entries(worker)) if authorization else (401, [])
        url = worker.front_url  # router/wake_gate.py answers GET /v1/models itself
    headers = {"Authorization": authorization} if authorization else {}
    request = urllib.request.Request(url.rstrip("/") + MODELS_PATH, headers=headers)
    try:
        with _LOCAL_OPENER.open(request, timeout=timeout_seconds) as response:
            status, listed = response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        error.close()
        return error.code, []
    except (OSError, ValueError) as error:  # refused, timed out, not JSON
        LOG.debug("%s: no answer to %s: %s", worker.url, MODELS_PATH, error)
        return None, []
    entries = listed.get("data") if isinstance(listed, dict) else None
    return status, [e for e in entries or [] if isinstance(e, dict) and e.get("id") in worker.names]


def list_models(
    workers: Sequence[Worker],
    authorization: str | None,
    timeout_seconds: float = MODEL_ROUTER_TIMEOUT_SECONDS,
) -> tuple[int, dict[str, Any]]:
    """(status, body) of `GET /v1/models` for this key: 200 with every model whose vLLM accepted it;
    401 when every model rejected it; 503 when none accepted it and some could not answer (the
    key's own model may be the one without a ready pod, so 401 would be wrong)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(workers))) as pool:
        answers = list(pool.map(lambda w: ask_model_router(w, authorization, timeout_seconds), workers))
    if any(status == 200 for status, _ in answers):
        data: dict[str, dict[str, Any]] = {}
        for status, entries in answers:
            for entry in entries if status == 200 else []:
                data.setdefault(entry["id"], entry)
        return 200, {"object": "list", "data": list(data.values())}
    if answers and all(status in (401, 403) for status, _ in answers):
        return 401, openai_error("Incorrect API key provided.", "invalid_api_key")
    return 503, openai_error("No model could answer; try again.", "service_unavailable", "server_error")


class ModelsHandler(http.server.BaseHTTPRequestHandler):
    """`GET /v1/models`, `GET /v1/models/<id>`, `GET /readiness` and `/health`; 404 for the rest."""

    server: ModelsServer
    server_version = "vllm-platform-models"
    sys_version = ""
    timeout = 30  # a client that stops sending does not hold a thread

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if path in ("/readiness", "/health"):
            self._reply(200, {"status": "ok"})
            return
        if path != MODELS_PATH and not path.startswith(MODELS_PATH + "/"):
            self._not_found()
            return
        status, body = list_models(
            self.server.workers, self.headers.get("Authorization"), self.server.timeout_seconds
        )
        model_id = urllib.parse.unquote(path[len(MODELS_PATH) + 1 :])
        if status == 200 and model_id:
            found = [entry for entry in body["data"] if entry["id"] == model_id]
            if found:
                body = found[0]
            else:  # not a model, or not one this key may use: the same answer for both
                status = 404
                body = openai_error(f"The model `{model_id}` does not exist.", "model_not_found")
        self._reply(status, body)

    def _not_found(self) -> None:
        self._reply(
            404, openai_error("Only GET /v1/models and /v1/models/<id> are served here.", "not_found")
        )

    do_POST = do_PUT = do_PATCH = do_DELETE = _not_found

    def _reply(self, status: int, body: Mapping[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("%s " + format, self.address_string(), *args)


class ModelsServer(http.server.ThreadingHTTPServer):
    """The unified endpoint's `/v1/models`, answered from `workers` (the registrar's list)."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        workers: Sequence[Worker],
        timeout_seconds: float = MODEL_ROUTER_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(address, ModelsHandler)
        self.workers = list(workers)
        self.timeout_seconds = timeout_seconds


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
    config = json.loads(args.config.read_text())
    # On 127.0.0.1: the door (components/router_door.py) forwards GET /v1/models here, nothing else does.
    models = ModelsServer(("127.0.0.1", int(config["models_port"])), list(desired_workers(config).values()))
    threading.Thread(target=models.serve_forever, name="models", daemon=True).start()
    run_forever(config)


if __name__ == "__main__":
    main(sys.argv[1:])
