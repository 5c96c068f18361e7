"""The registrar's `/v1/models` (router/registrar.py ModelsServer) where real model routers cannot
easily be made to misbehave: one unreachable, one hanging, models with different keys; and the
container's command with the rendered ConfigMap.

Each stand-in model router is a real HTTP server on loopback that answers `/v1/models` as vLLM does
(200 with OpenAI's list for its key, 401 otherwise) and records the headers it received. The real
model routers and vLLM servers are in tests/e2e/test_router.py.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from router.registrar import Worker, list_models
from tests.support.vllm_router import models_server
from tests.support.vllm_server import REPO_ROOT, free_port

REGISTRAR = REPO_ROOT / "router" / "registrar.py"


@dataclass
class StandIn:
    """A model router for one model that accepts one key."""

    model_id: str
    key: str
    delay_seconds: float = 0
    received: list[dict[str, str]] = field(default_factory=list)
    adapters: tuple[str, ...] = ()
    """LoRA adapters vLLM lists after the model, with `parent` set to it."""
    workers: tuple[str, ...] | None = None
    """The router's own `GET /workers` list (vllm-router 0.1.17's shape); None: not a router that
    answers it (the registrar must not ask)."""
    paths: list[str] = field(default_factory=list)


def entry(model_id: str) -> dict[str, object]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "vllm"}


def serve(stand_in: StandIn) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            stand_in.paths.append(self.path)
            if self.path == "/workers" and stand_in.workers is not None:
                workers = [{"url": url, "model_id": stand_in.model_id} for url in stand_in.workers]
                self._answer(200, {"workers": workers, "total": len(workers)})
                return
            stand_in.received.append(dict(self.headers))
            time.sleep(stand_in.delay_seconds)
            if self.headers.get("Authorization") == f"Bearer {stand_in.key}":
                # vLLM lists every served name of the process; the registrar keeps the routed one.
                adapters = [{**entry(a), "parent": stand_in.model_id} for a in stand_in.adapters]
                data = [entry(stand_in.model_id), entry("alias"), *adapters]
                status, body = 200, {"object": "list", "data": data}
            else:
                status, body = 401, {"error": "Unauthorized"}
            self._answer(status, body)

        def _answer(self, status: int, body: object) -> None:
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


ModelRouters = dict[str, tuple[StandIn, Worker]]
"""model id → (the stand-in, the registrar's worker for it)."""


def test_a_models_adapters_are_listed_with_their_parent_and_only_its_served_names() -> None:
    with_adapters = StandIn("alpha", "key-a", adapters=("alpha-support", "alpha-sql"))
    server = serve(with_adapters)
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        worker = Worker(url, "alpha", "x", served_names=("alpha", "alpha-support", "alpha-sql"))
        status, body = list_models([worker], "Bearer key-a")
        # A worker registered before adapters existed lists the model alone.
        plain = list_models([Worker(url, "alpha", "x")], "Bearer key-a")
    finally:
        server.shutdown()
        server.server_close()
    assert status == 200
    assert [(e["id"], e.get("parent")) for e in body["data"]] == [
        ("alpha", None),
        ("alpha-support", "alpha"),
        ("alpha-sql", "alpha"),
    ]
    assert plain == (200, {"object": "list", "data": [entry("alpha")]})


@pytest.fixture
def model_routers() -> Iterator[ModelRouters]:
    stand_ins = [StandIn("alpha", "key-a"), StandIn("beta", "key-b"), StandIn("gamma", "key-a")]
    servers = [serve(s) for s in stand_ins]
    yield {
        s.model_id: (s, Worker(f"http://127.0.0.1:{server.server_port}", s.model_id, "round_robin"))
        for s, server in zip(stand_ins, servers, strict=True)
    }
    for server in servers:
        server.shutdown()
        server.server_close()


def workers_of(model_routers: ModelRouters) -> list[Worker]:
    return [worker for _, worker in model_routers.values()]


def unreachable(model_id: str) -> Worker:
    return Worker(f"http://127.0.0.1:{free_port()}", model_id, "round_robin")


def test_a_key_lists_exactly_the_models_that_accept_it(model_routers: ModelRouters) -> None:
    workers = workers_of(model_routers)
    assert list_models(workers, "Bearer key-a") == (
        200,
        {"object": "list", "data": [entry("alpha"), entry("gamma")]},
    )
    assert list_models(workers, "Bearer key-b") == (200, {"object": "list", "data": [entry("beta")]})


def sleeping(model_id: str, parent: str | None = None) -> dict[str, object]:
    return {**entry(model_id), "parent": parent}


def test_a_model_at_zero_is_listed_for_any_key_without_asking_its_held_router() -> None:
    """Its router has no worker and would hold `/v1/models` (here: 30 s); the list does not wait."""
    asleep = StandIn("zeta", "key-z", delay_seconds=30, workers=(), adapters=("zeta-sql",))
    server = serve(asleep)
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        worker = Worker(url, "zeta", "x", served_names=("zeta", "zeta-sql"), scale_to_zero=True)
        started = time.monotonic()
        answers = [list_models([worker], key) for key in ("Bearer key-z", "Bearer any-key", None)]
        elapsed = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    listed = (200, {"object": "list", "data": [sleeping("zeta"), sleeping("zeta-sql", "zeta")]})
    assert answers[:2] == [listed, listed]
    assert answers[2][0] == 401
    assert asleep.received == [] and set(asleep.paths) == {"/workers"}
    # Waiting on the hold would take its whole delay; half of it leaves any machine's overhead room.
    assert elapsed < asleep.delay_seconds / 2, f"the list waited on the hold: {elapsed:.1f}s"


def test_a_model_at_zero_behind_its_wake_gate_is_listed_only_for_the_keys_its_pods_accept(
    tmp_path: Path,
) -> None:
    """Issue 40: with a wake gate (`front_url`), the sleeping model is listed by the gate from the keys
    its pods accept, never for any other key, and its held router is still not asked."""
    from router.wake_gate import Caller, GateConfig, GatedModel, GateServer, KeyRing

    asleep = StandIn("zeta", "key-z", delay_seconds=30, workers=(), adapters=("zeta-sql",))
    router_server = serve(asleep)
    router_url = f"http://127.0.0.1:{router_server.server_port}"
    (tmp_path / "sql.key0").write_text("tk-sql_key\n")
    caller = Caller("sql", ("sql.key0",), frozenset({"zeta-sql"}), "tk-sql_")
    gated = GatedModel("zeta", 0, router_url, ("zeta", "zeta-sql"), (caller,), 60)
    config = GateConfig(tmp_path, (gated,), 1024, 5, frozenset({"/v1/chat/completions"}))
    gate = GateServer(("127.0.0.1", 0), gated, config, KeyRing(tmp_path, gated.callers))
    threading.Thread(target=gate.serve_forever, daemon=True).start()
    try:
        worker = Worker(
            router_url,
            "zeta",
            "x",
            served_names=("zeta", "zeta-sql"),
            scale_to_zero=True,
            front_url=f"http://127.0.0.1:{gate.server_port}",
        )
        answers = [list_models([worker], key) for key in ("Bearer tk-sql_key", "Bearer any-key", None)]
    finally:
        for server in (gate, router_server):
            server.shutdown()
            server.server_close()
    assert answers[0] == (200, {"object": "list", "data": [sleeping("zeta-sql", "zeta")]})
    assert [status for status, _ in answers[1:]] == [401, 401]
    assert asleep.received == [] and set(asleep.paths) == {"/workers"}


def test_a_model_at_zero_with_a_replica_again_is_asked_with_the_key() -> None:
    awake = StandIn("zeta", "key-z", workers=("http://10.0.0.7:8000",))
    server = serve(awake)
    try:
        worker = Worker(f"http://127.0.0.1:{server.server_port}", "zeta", "x", scale_to_zero=True)
        assert list_models([worker], "Bearer key-z") == (200, {"object": "list", "data": [entry("zeta")]})
        assert list_models([worker], "Bearer wrong")[0] == 401
    finally:
        server.shutdown()
        server.server_close()
    assert [headers["Authorization"] for headers in awake.received] == ["Bearer key-z", "Bearer wrong"]


def test_a_sleeping_model_beside_awake_ones_is_added_to_the_keys_list(model_routers: ModelRouters) -> None:
    asleep = StandIn("zeta", "key-z", workers=())
    server = serve(asleep)
    try:
        worker = Worker(f"http://127.0.0.1:{server.server_port}", "zeta", "x", scale_to_zero=True)
        status, body = list_models([*workers_of(model_routers), worker], "Bearer key-b")
    finally:
        server.shutdown()
        server.server_close()
    assert (status, [e["id"] for e in body["data"]]) == (200, ["beta", "zeta"])


def test_only_a_to_zero_models_router_is_asked_for_its_workers(model_routers: ModelRouters) -> None:
    list_models(workers_of(model_routers), "Bearer key-a")
    for stand_in, _ in model_routers.values():
        assert stand_in.paths == ["/v1/models"]


def test_the_rendered_scale_to_zero_flag_reaches_the_worker() -> None:
    from router.registrar import desired_workers

    config = {
        "workers": [
            {"url": "http://127.0.0.1:8100", "model_id": "a", "policy": "x"},
            {"url": "http://127.0.0.1:8101", "model_id": "b", "policy": "x", "scale_to_zero": True},
        ]
    }
    assert [w.scale_to_zero for w in desired_workers(config).values()] == [False, True]


def test_a_key_no_model_accepts_is_401_in_openais_shape(model_routers: ModelRouters) -> None:
    status, body = list_models(workers_of(model_routers), "Bearer nobody's")
    assert status == 401
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "invalid_api_key"
    assert list_models(workers_of(model_routers), None)[0] == 401


def test_no_model_router_reachable_is_503() -> None:
    status, body = list_models([unreachable("alpha"), unreachable("beta")], "Bearer key-a")
    assert status == 503 and body["error"]["code"] == "service_unavailable"


def test_an_unreachable_model_leaves_the_others_listed_and_turns_a_rejection_into_503(
    model_routers: ModelRouters,
) -> None:
    workers = [*workers_of(model_routers), unreachable("delta")]
    assert list_models(workers, "Bearer key-b") == (200, {"object": "list", "data": [entry("beta")]})
    # The key may be delta's, whose router cannot answer now: not "invalid key", but "try again".
    assert list_models(workers, "Bearer wrong")[0] == 503


def test_hanging_model_routers_cost_the_timeout_once(model_routers: ModelRouters) -> None:
    """Two routers that hang (for far longer than the timeout) cost one timeout, not two: they are
    asked at once, and the timeout holds. The bounds are in units of the timeout and the hang, so
    a slow machine's overhead (a timeout's worth of room) does not decide the result."""
    timeout_seconds, hang_seconds = 3.0, 60.0
    slow = [StandIn(name, "key-b", delay_seconds=hang_seconds) for name in ("slow-1", "slow-2")]
    servers = [serve(stand_in) for stand_in in slow]
    try:
        workers = [
            *workers_of(model_routers),
            *(
                Worker(f"http://127.0.0.1:{server.server_port}", stand_in.model_id, "x")
                for server, stand_in in zip(servers, slow, strict=True)
            ),
        ]
        started = time.monotonic()
        answer = list_models(workers, "Bearer key-a", timeout_seconds=timeout_seconds)
        elapsed = time.monotonic() - started
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    assert answer == (200, {"object": "list", "data": [entry("alpha"), entry("gamma")]})
    assert elapsed >= timeout_seconds, f"the hanging routers were not waited for: {elapsed:.1f}s"
    assert elapsed < 2 * timeout_seconds, f"the routers were asked one after another: {elapsed:.1f}s"


@pytest.fixture
def models_url(model_routers: ModelRouters) -> Iterator[str]:
    with models_server(workers_of(model_routers)) as url:
        yield url


def test_only_the_clients_authorization_header_reaches_a_model_router(
    models_url: str, model_routers: ModelRouters
) -> None:
    response = httpx.get(
        f"{models_url}/v1/models",
        headers={
            "Authorization": "Bearer key-b",
            "Cookie": "session=secret",
            "X-Forwarded-For": "203.0.113.9",
        },
        timeout=30,
    )
    assert response.status_code == 200
    for stand_in, _ in model_routers.values():
        (received,) = stand_in.received
        assert received["Authorization"] == "Bearer key-b"
        assert {name.lower() for name in received} <= {
            "authorization",
            "host",
            "user-agent",
            "accept-encoding",
            "connection",
        }


def test_the_server_answers_one_model_404s_the_others_and_the_rest(models_url: str) -> None:
    key = {"Authorization": "Bearer key-a"}
    assert httpx.get(f"{models_url}/v1/models/gamma", headers=key, timeout=30).json() == entry("gamma")
    # beta is a model, but not one of this key's: the same 404 as a name no model serves.
    for name in ("beta", "nonexistent"):
        missing = httpx.get(f"{models_url}/v1/models/{name}", headers=key, timeout=30)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    rejected = httpx.get(f"{models_url}/v1/models/gamma", headers={"Authorization": "Bearer no"}, timeout=30)
    assert rejected.status_code == 401 and rejected.headers["www-authenticate"] == "Bearer"
    for path in ("/readiness", "/health"):
        assert httpx.get(f"{models_url}{path}", timeout=30).status_code == 200
    for method, path in (("GET", "/v1/completions"), ("GET", "/workers"), ("POST", "/v1/models")):
        assert httpx.request(method, f"{models_url}{path}", headers=key, timeout=30).status_code == 404


def test_the_registrar_serves_the_models_list_from_the_rendered_config(tmp_path: Path) -> None:
    """The container's command, with the dev stack's ConfigMap (only the port moved to a free one):
    the models server listens beside the registration loop, whose front is not there."""
    from tests.conftest import rendered

    (config_map,) = rendered("dev").find("ConfigMap", namespace="vllm-router")
    config = json.loads(config_map["data"]["registrar.json"])
    port = free_port()
    config_file = tmp_path / "registrar.json"
    config_file.write_text(json.dumps({**config, "models_port": port}))
    process = subprocess.Popen(
        [sys.executable, str(REGISTRAR), "--config", str(config_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                readiness = httpx.get(f"http://127.0.0.1:{port}/readiness", timeout=5)
                break
            except httpx.TransportError:
                assert process.poll() is None, "the registrar exited"
                assert time.monotonic() < deadline, "the models server did not listen within 30 s"
                time.sleep(0.2)
        assert readiness.status_code == 200
        # No model router runs here: none can answer, whatever the key.
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).status_code == 503
    finally:
        process.terminate()
        process.wait(timeout=30)
