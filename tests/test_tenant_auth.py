"""The API-key middleware with tenants (issue 26), driven as an ASGI server drives it, over key files
in a folder as the Secrets Store CSI driver mounts them; and its usage counters in prometheus_client,
in one process and in the multiprocess mode vLLM uses with --api-server-count > 1.
tests/e2e/test_tenants.py runs the same module inside the real vLLM 0.32.0 server and vllm-router."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from components import server_auth
from domain import tenant_metrics
from infra.stack_checks import load_stack
from tests.support.auth_module import WORST_BODY_BYTES, empty_objects_body, load_auth_module

ALPHA, BETA = "tiny-alpha", "tiny-beta"
KEY_A, KEY_B = "sk-team-a_0123456789abcdef", "sk-team-b_fedcba9876543210"
GAMMA = "text"
"""An adapter named like a chat content-part type (validate refuses such names; the check holds anyway)."""
KEY_C = "sk-team-c_aaaabbbbccccdddd"
OPERATOR_KEY = "op-0123456789abcdef0123"
MAX_BODY_BYTES = 100_000
SPEC = {
    "served_names": [ALPHA, BETA, GAMMA],
    "tenants": {
        "team-a": {"models": [ALPHA], "key_prefix": "sk-team-a_"},
        "team-b": {"models": [BETA], "key_prefix": "sk-team-b_", "max_in_flight": 1},
        "team-c": {"models": [GAMMA], "key_prefix": "sk-team-c_"},
    },
}


@dataclass
class Pod:
    """The pod's two mounts (tenants file, key folder) and the middleware module loaded over them."""

    folder: Path
    module: ModuleType
    now: list[float] = field(default_factory=lambda: [0.0])
    app: list[Any] = field(default_factory=lambda: [None])
    """The app behind the middleware for the current request (one middleware for the pod's life)."""
    middleware: Any = None
    registry: Any = None

    def __post_init__(self) -> None:
        async def current_app(scope: Any, receive: Any, send: Any) -> None:
            await self.app[0](scope, receive, send)

        self.middleware = self.module.ApiKeyMiddleware(current_app)
        self.middleware.tenant_keys.clock = lambda: self.now[0]
        self.middleware.tenant_keys._read_at = self.now[0]  # read at start, on the test's clock
        if self.middleware.operator_key is not None:
            self.middleware.operator_key.clock = lambda: self.now[0]

    @property
    def keys(self) -> Path:
        return self.folder / "keys"

    def write_key(self, file_name: str, key: str) -> None:
        # As the driver updates a mount: a new file renamed over the old one.
        (self.keys / f".{file_name}.tmp").write_text(key + "\n")
        os.replace(self.keys / f".{file_name}.tmp", self.keys / file_name)

    def later(self, seconds: float) -> None:
        self.now[0] += seconds

    def salt(self, tenant: str, clients: str = "") -> str:
        """The salt vLLM must see for `tenant`: HMAC-SHA256 of its name under the secret in the pod's
        shared folder (issue 49), then `;` and the client's own salt."""
        secret = (self.folder / "shm" / self.module.CACHE_SALT_SECRET_FILE).read_bytes()
        return f"{hmac.new(secret, tenant.encode(), hashlib.sha256).hexdigest()};{clients}"

    def in_flight(self, tenant: str) -> int:
        return int(self.middleware.in_flight.held(tenant))


def _load(monkeypatch: pytest.MonkeyPatch, folder: Path) -> ModuleType:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_PLATFORM_TENANTS", str(folder / "tenants.json"))
    monkeypatch.setenv("VLLM_PLATFORM_TENANT_MOUNT", str(folder / "keys"))
    monkeypatch.setenv("VLLM_PLATFORM_OPERATOR_KEY_FILE", str(folder / "keys" / "platform-operator.key"))
    monkeypatch.setenv("VLLM_PLATFORM_MAX_BODY_BYTES", str(MAX_BODY_BYTES))
    monkeypatch.setenv("VLLM_PLATFORM_STATE_DIR", str(folder / "shm"))  # as the pod's /dev/shm
    return load_auth_module(monkeypatch, "vllm_platform_auth_tenants")


@pytest.fixture
def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pod]:
    (tmp_path / "tenants.json").write_text(json.dumps(SPEC))
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "team-a.key0").write_text(KEY_A + "\n")
    (tmp_path / "keys" / "team-b.key0").write_text(KEY_B)
    (tmp_path / "keys" / "team-c.key0").write_text(KEY_C)
    (tmp_path / "keys" / "platform-operator.key").write_text(OPERATOR_KEY + "\n")
    # The AWS provider's JSON copy of a store entry sits beside the key files: never a key.
    (tmp_path / "keys" / "entry-0.json").write_text(json.dumps({"value": "sk-team-a_from-json"}))
    module = _load(monkeypatch, tmp_path)
    # Fresh counters per test, read from this registry.
    import prometheus_client
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    monkeypatch.setattr(module, "_METRICS", None)

    for kind in ("Counter", "Gauge"):
        original = getattr(prometheus_client, kind)
        monkeypatch.setattr(
            prometheus_client,
            kind,
            lambda *a, _original=original, **k: _original(*a, registry=registry, **k),
        )
    yield Pod(tmp_path, module, registry=registry)


@dataclass
class Answer:
    status: int | None
    body: bytes
    reached: bool
    app_body: bytes | None
    """What the app read from `receive`: the request body as vLLM would see it."""


def _call(
    pod: Pod,
    method: str,
    path: str,
    key: str | None,
    body: bytes = b"",
    app_answer: tuple[int, bytes, bytes] = (200, b"application/json", b'{"ok": true}'),
    chunks: int = 1,
    headers: list[tuple[bytes, bytes]] | None = None,
    sent: list[dict[str, Any]] | None = None,
    while_answering: Callable[[], None] | None = None,
) -> Answer:
    """One request through the middleware (body sent in `chunks` parts) to an app that reads the whole
    body, calls `while_answering` and answers `app_answer` (status, content type, body)."""
    headers = [*([(b"authorization", f"Bearer {key}".encode())] if key is not None else []), *(headers or [])]
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers}
    size = max(1, -(-len(body) // chunks))
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    incoming = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]
    state: dict[str, Any] = {"reached": False, "app_body": None}
    sent = [] if sent is None else sent

    async def app(scope: Any, receive: Any, send: Any) -> None:
        state["reached"] = True
        received = b""
        while True:
            message = await receive()
            received += message.get("body", b"")
            if not message.get("more_body"):
                break
        state["app_body"] = received
        if while_answering is not None:
            while_answering()
        status, content_type, answer = app_answer
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]}
        )
        for line in answer.splitlines(keepends=True) if content_type == b"text/event-stream" else [answer]:
            await send({"type": "http.response.body", "body": line, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    pod.app[0] = app
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(pod.middleware(scope, receive, send))
    finally:
        loop.close()
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), None)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Answer(status, body, state["reached"], state["app_body"])


def _call_with_headers(
    pod: Pod, method: str, path: str, key: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> Answer:
    return _call(pod, method, path, key, body, headers=headers)


def _completion(model: str | None, **extra: Any) -> bytes:
    payload = {"prompt": "hi", "max_tokens": 2, **extra}
    if model is not None:
        payload["model"] = model
    return json.dumps(payload).encode()


def test_a_tenant_reaches_its_model_and_vllm_reads_the_body_unchanged(pod: Pod) -> None:
    """Unchanged but for the tenant's cache salt; byte for byte where the stack shares the cache."""
    body = _completion(ALPHA, prompt="x" * 5000)
    answer = _call(pod, "POST", "/v1/completions", KEY_A, body, chunks=7)
    assert answer.status == 200 and answer.reached and answer.app_body is not None
    assert json.loads(answer.app_body) == {**json.loads(body), "cache_salt": pod.salt("team-a")}
    _share_the_prefix_cache(pod)
    answer = _call(pod, "POST", "/v1/completions", KEY_A, body, chunks=7)
    assert answer.status == 200 and answer.app_body == body


def _share_the_prefix_cache(pod: Pod) -> None:
    """The tenants file as `security.tenants_share_prefix_cache: true` renders it, re-read."""
    (pod.folder / "tenants.json").write_text(json.dumps({**SPEC, "isolated_prefix_cache": False}))
    pod.later(pod.module.RELOAD_SECONDS)


def _salt_seen_by_vllm(pod: Pod, path: str, key: str, body: dict[str, Any]) -> object:
    answer = _call(pod, "POST", path, key, json.dumps(body).encode())
    assert answer.status == 200 and answer.app_body is not None, answer.body
    return json.loads(answer.app_body).get("cache_salt")


def test_each_tenant_gets_a_cache_salt_of_its_own_that_no_client_can_replace(pod: Pod) -> None:
    chat = {"model": ALPHA, "messages": [{"role": "user", "content": "hi"}]}
    assert _salt_seen_by_vllm(pod, "/v1/chat/completions", KEY_A, chat) == pod.salt("team-a")
    assert _salt_seen_by_vllm(pod, "/v1/completions", KEY_B, {"model": BETA}) == pod.salt("team-b")
    # A client's own salt splits its tenant's cache further; it never yields another tenant's salt.
    stolen = {"model": ALPHA, "prompt": "x", "cache_salt": pod.salt("team-b")}
    assert _salt_seen_by_vllm(pod, "/v1/completions", KEY_A, stolen) == pod.salt("team-a", pod.salt("team-b"))
    refused = _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA, cache_salt=["x"]))
    assert refused.status == 400 and not refused.reached
    # Routes whose vLLM request takes no salt get none; the operator's requests are not a tenant's.
    assert _salt_seen_by_vllm(pod, "/tokenize", KEY_A, {"model": ALPHA, "prompt": "x"}) is None
    assert _call(pod, "POST", "/v1/completions", OPERATOR_KEY, _completion(ALPHA)).app_body == _completion(
        ALPHA
    )
    # An empty object, or one in UTF-16: encoded again rather than spliced.
    assert _salt_seen_by_vllm(pod, "/v1/completions", KEY_A, {}) == pod.salt("team-a")
    utf16 = _call_with_headers(
        pod,
        "POST",
        "/v1/completions",
        KEY_A,
        _completion(ALPHA).decode().encode("utf-16"),
        [(b"content-type", b"application/json")],
    )
    assert utf16.app_body is not None and json.loads(utf16.app_body)["cache_salt"] == pod.salt("team-a")


def test_with_a_shared_prefix_cache_the_clients_salt_passes_as_sent(pod: Pod) -> None:
    _share_the_prefix_cache(pod)
    assert _salt_seen_by_vllm(pod, "/v1/completions", KEY_A, {"model": ALPHA, "cache_salt": "mine"}) == "mine"
    assert _salt_seen_by_vllm(pod, "/v1/completions", KEY_A, {"model": ALPHA}) is None


def test_a_tenant_naming_another_tenants_model_gets_403_in_openais_shape(pod: Pod) -> None:
    answer = _call(pod, "POST", "/v1/chat/completions", KEY_A, _completion(BETA))
    assert answer.status == 403 and not answer.reached
    error = json.loads(answer.body)["error"]
    assert error["code"] == "model_not_allowed" and BETA in error["message"]
    assert _call(pod, "POST", "/v1/completions", KEY_B, _completion(BETA)).status == 200
    assert _call(pod, "POST", "/v1/completions", KEY_B, _completion(ALPHA)).status == 403


def test_a_request_without_a_model_means_vllms_default_the_first_served_name(pod: Pod) -> None:
    assert _call(pod, "POST", "/tokenize", KEY_A, _completion(None)).reached
    assert _call(pod, "POST", "/tokenize", KEY_B, _completion(None)).status == 403


def test_a_body_that_names_no_model_in_json_needs_every_name_of_the_pod(pod: Pod) -> None:
    multipart = b'--x\r\nContent-Disposition: form-data; name="model"\r\n\r\ntiny-beta\r\n--x--\r\n'
    assert _call(pod, "POST", "/v1/audio/transcriptions", KEY_A, multipart).status == 403


def test_a_name_this_pod_does_not_serve_gets_404_before_vllm(pod: Pod) -> None:
    # vLLM would answer the same 404; answered here, no name the check did not resolve reaches it.
    answer = _call(pod, "POST", "/v1/completions", KEY_A, _completion("no-such-model"))
    assert answer.status == 404 and not answer.reached
    assert json.loads(answer.body)["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    "key",
    [None, "wrong", KEY_A + "x", "sk-team-a_from-json", "sk-team-a_"],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/completions"), ("GET", "/v1/models"), ("POST", "/invocations"), ("GET", "/openapi.json")],
)
def test_an_unknown_key_gets_401_on_every_route(pod: Pod, key: str | None, method: str, path: str) -> None:
    answer = _call(pod, method, path, key, _completion(ALPHA) if method == "POST" else b"")
    assert answer.status == 401 and not answer.reached
    assert json.loads(answer.body)["error"]["code"] == "invalid_api_key"


def test_health_and_metrics_stay_open(pod: Pod) -> None:
    assert _call(pod, "GET", "/health", None).reached
    assert _call(pod, "GET", "/metrics", None).reached
    assert not _call(pod, "POST", "/health", None).reached


def test_a_revoked_key_stops_working_without_a_restart(pod: Pod) -> None:
    assert _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA)).status == 200
    pod.write_key("team-a.key0", "sk-team-a_the-replacement-0000")  # the store entry rewritten
    # Within the reload interval the last reading answers (the files are not read per request) ...
    assert _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA)).status == 200
    # ... after it, the same middleware (no restart) has read the new key.
    pod.later(pod.module.RELOAD_SECONDS)
    assert _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA)).status == 401
    assert (
        _call(pod, "POST", "/v1/completions", "sk-team-a_the-replacement-0000", _completion(ALPHA)).status
        == 200
    )
    (pod.keys / "team-a.key0").write_text("")  # an emptied entry: no key of team-a at all
    pod.later(pod.module.RELOAD_SECONDS)
    assert (
        _call(pod, "POST", "/v1/completions", "sk-team-a_the-replacement-0000", _completion(ALPHA)).status
        == 401
    )


def test_a_second_key_works_beside_the_first_while_a_key_rotates(pod: Pod) -> None:
    pod.write_key("team-a.key1", "sk-team-a_next-key-1111")
    pod.later(pod.module.RELOAD_SECONDS)
    for key in (KEY_A, "sk-team-a_next-key-1111"):
        assert _call(pod, "POST", "/v1/completions", key, _completion(ALPHA)).status == 200


def test_a_key_without_the_tenants_prefix_is_refused(pod: Pod) -> None:
    """The WAF's rate rule matches the prefix: a key without it would escape the tenant's limit."""
    pod.write_key("team-a.key1", "no-prefix-key-2222")
    pod.later(pod.module.RELOAD_SECONDS)
    assert _call(pod, "POST", "/v1/completions", "no-prefix-key-2222", _completion(ALPHA)).status == 401


def test_the_models_list_holds_only_the_tenants_names(pod: Pod) -> None:
    listing = {
        "object": "list",
        "data": [{"id": ALPHA, "object": "model"}, {"id": BETA, "object": "model"}],
    }
    answer = _call(
        pod, "GET", "/v1/models", KEY_B, app_answer=(200, b"application/json", json.dumps(listing).encode())
    )
    assert answer.status == 200
    assert [entry["id"] for entry in json.loads(answer.body)["data"]] == [BETA]
    # vLLM 0.32.0 has no /v1/models/<name>: like every route not on the allow-list, operator only.
    assert _call(pod, "GET", f"/v1/models/{BETA}", KEY_B).status == 403


def test_a_tenant_not_allowed_on_every_name_gets_no_websocket(pod: Pod) -> None:
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("reached vLLM")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "websocket",
        "path": "/v1/realtime",
        "headers": [(b"authorization", f"Bearer {KEY_A}".encode())],
    }
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(pod.module.ApiKeyMiddleware(app)(scope, None, send))
    finally:
        loop.close()
    assert sent == [{"type": "websocket.close", "code": 1008}]


def _samples(pod: Pod, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for metric in pod.registry.collect()
        for sample in metric.samples
        if sample.name == family
    }


def test_usage_is_counted_per_tenant_from_a_stream_and_a_json_answer(pod: Pod) -> None:
    stream = (
        b'data: {"choices":[{"text":"a"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n\n'
        b"data: [DONE]\n\n"
    )
    answer = _call(
        pod,
        "POST",
        "/v1/completions",
        KEY_A,
        _completion(ALPHA, stream=True),
        app_answer=(200, b"text/event-stream", stream),
    )
    assert answer.body == stream  # passed through byte for byte
    single = json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}).encode()
    _call(
        pod,
        "POST",
        "/v1/completions",
        KEY_A,
        _completion(ALPHA),
        app_answer=(200, b"application/json", single),
    )
    _call(
        pod, "POST", "/v1/completions", KEY_B, _completion(BETA), app_answer=(400, b"application/json", b"{}")
    )
    requests = _samples(pod, tenant_metrics.TENANT_REQUESTS)
    assert requests == {
        (("code", "200"), ("model", ALPHA), ("tenant", "team-a")): 2.0,
        (("code", "400"), ("model", BETA), ("tenant", "team-b")): 1.0,
    }
    tokens = _samples(pod, tenant_metrics.TENANT_TOKENS)
    assert tokens[(("kind", "prompt"), ("model", ALPHA), ("tenant", "team-a"))] == 12.0
    assert tokens[(("kind", "completion"), ("model", ALPHA), ("tenant", "team-a"))] == 5.0
    assert _samples(pod, tenant_metrics.TENANT_REQUESTS_IN_FLIGHT) == {
        (("tenant", "team-a"),): 0.0,
        (("tenant", "team-b"),): 0.0,
    }
    # The names and labels are the catalogue's (domain/tenant_metrics.py); never a key.
    for family, labels in tenant_metrics.SERIES_LABELS.items():
        for sample_labels in _samples(pod, family):
            assert tuple(name for name, _ in sample_labels) == tuple(sorted(labels))
    assert not any(KEY_A in str(s) or KEY_B in str(s) for s in pod.registry.collect())


def test_a_name_the_pod_does_not_serve_never_becomes_a_label(pod: Pod) -> None:
    answer = _call(pod, "POST", "/v1/completions", KEY_A, _completion("made-up-name-12345"))
    assert answer.status == 404
    assert _samples(pod, tenant_metrics.TENANT_REQUESTS) == {}
    _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA))
    assert list(_samples(pod, tenant_metrics.TENANT_REQUESTS)) == [
        (("code", "200"), ("model", ALPHA), ("tenant", "team-a"))
    ]


def test_no_key_in_the_folder_stops_the_server_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tenants.json").write_text(json.dumps(SPEC))
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "team-a.key0").write_text("")
    with pytest.raises(RuntimeError, match="refuses to start a server without an API key"):
        _load(monkeypatch, tmp_path)


MULTIPROCESS_WORKER = textwrap.dedent(
    """
    import asyncio, importlib.util, json, sys
    spec = importlib.util.spec_from_file_location("vllm_platform_auth", sys.argv[1])
    module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module
    spec.loader.exec_module(module)

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body",
                    "body": json.dumps({"usage": {"prompt_tokens": 4, "completion_tokens": 1}}).encode()})

    async def one():
        body = json.dumps({"model": "tiny-alpha", "prompt": "hi"}).encode()
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "root_path": "",
                 "headers": [(b"authorization", b"Bearer " + sys.argv[2].encode())]}
        sent = []
        async def receive():
            return {"type": "http.request", "body": body}
        async def send(message):
            sent.append(message)
        await module.ApiKeyMiddleware(app)(scope, receive, send)
        assert sent[0]["status"] == 200, sent

    for _ in range(int(sys.argv[3])):
        asyncio.run(one())
    """
)


def test_counters_add_up_over_api_server_processes_in_multiprocess_mode(tmp_path: Path) -> None:
    """vLLM with --api-server-count > 1 sets PROMETHEUS_MULTIPROC_DIR before its API server processes
    start and serves /metrics through prometheus_client's MultiProcessCollector: each process's
    counts land in that folder and the collector sums them."""
    (tmp_path / "tenants.json").write_text(json.dumps(SPEC))
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "team-a.key0").write_text(KEY_A)
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
        "VLLM_PLATFORM_TENANTS": str(tmp_path / "tenants.json"),
        "VLLM_PLATFORM_TENANT_MOUNT": str(tmp_path / "keys"),
    }
    env.pop("VLLM_API_KEY", None)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", MULTIPROCESS_WORKER, str(server_auth.MODULE_FILE), KEY_A, str(n)], env=env
        )
        for n in (2, 3)
    ]
    assert [worker.wait(timeout=120) for worker in workers] == [0, 0]
    code = (
        "import json, sys\n"
        "from prometheus_client import CollectorRegistry, multiprocess\n"
        "registry = CollectorRegistry(); multiprocess.MultiProcessCollector(registry)\n"
        "print(json.dumps({s.name + str(sorted(s.labels.items())): s.value "
        "for m in registry.collect() for s in m.samples}))\n"
    )
    collected = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert collected.returncode == 0, collected.stderr
    values = json.loads(collected.stdout)
    requests = [v for k, v in values.items() if k.startswith(tenant_metrics.TENANT_REQUESTS + "[")]
    prompt = [v for k, v in values.items() if k.startswith(tenant_metrics.TENANT_TOKENS) and "'prompt'" in k]
    assert requests == [5.0] and prompt == [20.0]


# --- issue 34: the served name decided once, routes by allow-list, robust input, concurrency ---------

GENERATING_ROUTES = [
    path for path, kind in server_auth.inference_routes().items() if path not in ("/tokenize", "/detokenize")
]


@pytest.mark.parametrize("path", GENERATING_ROUTES)
@pytest.mark.parametrize("model", ["", None])
def test_an_empty_or_absent_model_is_the_default_name_on_every_inference_route(
    pod: Pod, path: str, model: str | None
) -> None:
    # vLLM serves the default (the first served name, ALPHA) for "" and for no model at all.
    assert _call(pod, "POST", path, KEY_B, _completion(model)).status == 403
    assert _call(pod, "POST", path, KEY_A, _completion(model)).reached


def test_invocations_are_judged_by_the_sagemaker_adapter_header_that_vllm_uses(pod: Pod) -> None:
    def invoke(key: str, adapter: bytes | None, model: str | None) -> Answer:
        headers = [] if adapter is None else [(b"X-Amzn-SageMaker-Adapter-Identifier", adapter)]
        return _call_with_headers(pod, "POST", "/invocations", key, _completion(model), headers)

    assert invoke(KEY_A, BETA.encode(), ALPHA).status == 403  # the body's own name does not count
    assert invoke(KEY_B, BETA.encode(), ALPHA).reached
    assert invoke(KEY_B, b"", BETA).status == 403  # an empty header: vLLM's default, ALPHA
    # No header: vLLM sets the body's model to None, its default (ALPHA), whatever the body named.
    assert invoke(KEY_B, None, BETA).status == 403
    assert invoke(KEY_A, None, BETA).reached


def test_a_chat_content_part_named_like_another_tenants_adapter_is_refused(pod: Pod) -> None:
    # vLLM applies an adapter named like a content part's type to a request for the base.
    chat = {"model": ALPHA, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    answer = _call(pod, "POST", "/v1/chat/completions", KEY_A, json.dumps(chat).encode())
    assert answer.status == 403 and GAMMA in json.loads(answer.body)["error"]["message"]
    plain = {"model": ALPHA, "messages": [{"role": "user", "content": "hi"}]}
    assert _call(pod, "POST", "/v1/chat/completions", KEY_A, json.dumps(plain).encode()).reached


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("POST", "/adapters"),
        ("DELETE", "/adapters/tiny-alpha"),
        ("POST", "/scale_elastic_ep"),
        ("POST", "/inference/v1/abort_requests"),
        ("POST", "/start_profile"),
        ("GET", "/openapi.json"),
        ("POST", "/a/route/a/future/vllm/adds"),
        ("GET", "/v1/completions"),
    ],
)
def test_every_other_route_needs_the_operator_key(pod: Pod, method: str, path: str) -> None:
    body = _completion(ALPHA) if method != "GET" else b""
    answer = _call(pod, method, path, KEY_A, body)
    assert answer.status == 403 and not answer.reached
    assert json.loads(answer.body)["error"]["code"] == "operator_route"
    assert _call(pod, method, path, OPERATOR_KEY, body).reached


def test_the_operator_key_is_re_read_and_an_emptied_one_is_revoked(pod: Pod) -> None:
    assert _call(pod, "POST", "/v1/load_lora_adapter", OPERATOR_KEY, b"{}").reached
    (pod.keys / "platform-operator.key").write_text("")
    pod.later(pod.module.RELOAD_SECONDS)
    assert _call(pod, "POST", "/v1/load_lora_adapter", OPERATOR_KEY, b"{}").status == 401


def test_a_deeply_nested_body_gets_400_not_a_500(pod: Pod) -> None:
    depth = 200_000
    deep = b'{"model": "tiny-alpha", "prompt": ' + b"[" * depth + b"]" * depth + b"}"
    pod.middleware.max_body_bytes = len(deep) + 1
    answer = _call(pod, "POST", "/v1/completions", KEY_A, deep)
    assert answer.status == 400 and not answer.reached
    shallow_but_deep = b'{"model": "tiny-alpha", "prompt": ' + b"[" * 65 + b"]" * 65 + b"}"
    assert _call(pod, "POST", "/v1/completions", KEY_A, shallow_but_deep).status == 400


@pytest.mark.parametrize(
    "body",
    [b'{"model": ', b"[1, 2]", b"\xff\xfe{"],
)
def test_a_malformed_json_body_gets_400_before_vllm(pod: Pod, body: bytes) -> None:
    answer = _call_with_headers(
        pod, "POST", "/v1/completions", KEY_A, body, [(b"content-type", b"application/json")]
    )
    assert answer.status == 400 and not answer.reached


def test_a_key_given_twice_is_read_as_vllm_reads_it_the_last_copy(pod: Pod) -> None:
    # vLLM 0.32.0 parses every body with json.loads (FastAPI -> Starlette's Request.json), where the
    # last copy of a key wins; the middleware parses the same bytes the same way, so a name smuggled
    # in a first copy is never the one vLLM serves (tests/e2e/test_tenant_isolation.py: the real server).
    last_is_beta = b'{"model": "tiny-alpha", "model": "tiny-beta", "prompt": "x"}'
    answer = _call(pod, "POST", "/v1/completions", KEY_A, last_is_beta)
    assert answer.status == 403 and b"tiny-beta" in answer.body and not answer.reached
    last_is_alpha = b'{"model": "tiny-beta", "model": "tiny-alpha", "prompt": "x"}'
    answer = _call(pod, "POST", "/v1/completions", KEY_A, last_is_alpha)
    assert answer.status == 200 and json.loads(answer.app_body)["model"] == "tiny-alpha"


def test_a_body_past_the_limit_gets_413(pod: Pod) -> None:
    big = _completion(ALPHA, prompt="x" * MAX_BODY_BYTES)
    answer = _call(pod, "POST", "/v1/completions", KEY_A, big, chunks=20)
    assert answer.status == 413 and not answer.reached
    declared = [(b"content-length", str(MAX_BODY_BYTES + 1).encode())]
    assert _call_with_headers(pod, "POST", "/v1/completions", KEY_A, b"{}", declared).status == 413
    assert _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA, prompt="x" * 1000)).reached


def test_a_tenant_past_its_in_flight_share_gets_429_with_retry_after(pod: Pod) -> None:
    assert pod.middleware.in_flight.take("team-b", 1, 1)  # one request of team-b being answered now
    sent: list[dict[str, Any]] = []
    answer = _call(pod, "POST", "/v1/completions", KEY_B, _completion(BETA), sent=sent)
    assert answer.status == 429 and not answer.reached
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert (b"retry-after", b"1") in start["headers"]
    assert _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA)).reached  # no limit
    pod.middleware.in_flight.give("team-b", 1)
    assert _call(pod, "POST", "/v1/completions", KEY_B, _completion(BETA)).reached
    assert pod.in_flight("team-b") == 0  # released when the answer is sent


# Issue 40: no tenant can stall the others. The body checks do no Python step per JSON value (C-speed
# bytes methods per chunk, as the body arrives), refuse a body past the value count or depth before
# the rest is read, take the tenant's share before reading, and leave vLLM's own parse for a later
# turn of the event loop. Measured on the real server: bench/tenant_stall/.


def _random_json(rng: random.Random, depth: int) -> Any:
    """Values whose strings hold what a byte scanner could mistake for structure."""
    tricky = ["", ",", "[{", "}]", '"', "\\", '\\"', "a,b", "é", "\\\\", "x" * 50]
    kind = rng.choice(["list", "dict", "str", "num", "lit"] if depth > 0 else ["str", "num", "lit"])
    if kind == "list":
        return [_random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    if kind == "dict":
        return {
            "".join(rng.choices(tricky, k=2)) + str(i): _random_json(rng, depth - 1)
            for i in range(rng.randint(0, 4))
        }
    if kind == "str":
        return "".join(rng.choices(tricky, k=rng.randint(0, 5)))
    return rng.choice([0, -1.5e10, 123456, True, False, None])


def _shape_of(value: Any, depth: int = 1) -> tuple[int, int, int]:
    """(array elements + object members + the value itself, empty containers, depth) of a value."""
    if isinstance(value, dict | list):
        items = list(value.values()) if isinstance(value, dict) else value
        inner = [_shape_of(item, depth + 1) for item in items]
        return (
            1 + sum(count for count, _, _ in inner),
            (not items) + sum(empty for _, empty, _ in inner),
            max([depth, *(deepest for _, _, deepest in inner)]),
        )
    return 1, 0, depth - 1


@pytest.mark.parametrize("seed", range(40))
def test_the_chunked_scanner_counts_values_and_depth_as_the_parser_reads_them(pod: Pod, seed: int) -> None:
    rng = random.Random(seed)
    value = _random_json(rng, depth=5)
    text = json.dumps(value, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5).encode()
    shape = pod.module.JsonShape(max_values=10**9)
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(1, 30))))
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        shape.feed(text[start:end])  # cut anywhere: inside strings, between a backslash and its byte
    values, empty, deepest = _shape_of(value)
    # Every value counted (empty containers once more: each costs a parse like a value), and the
    # nesting followed exactly: back at level 0, outside any string.
    assert shape.values == values + empty, text
    assert (shape.depth, shape.in_string, shape.carry) == (0, False, b"")
    limit = pod.module.MAX_JSON_DEPTH
    nested = json.dumps([[value]] * 2).encode()
    wrapped = b"[" * (limit - deepest - 2) + nested + b"]" * (limit - deepest - 2)
    pod.module.JsonShape(10**9).feed(wrapped)  # exactly MAX_JSON_DEPTH deep: passes
    with pytest.raises(pod.module.Refused, match="nests deeper"):
        pod.module.JsonShape(10**9).feed(b"[" + wrapped + b"]")
    # The same cut anywhere: each chunk's nesting bound (matched pairs stripped level by level) or
    # its exact walk, carried from chunk to chunk, decides as one pass over the whole body would.
    for body, deeper in ((wrapped, False), (b"[" + wrapped + b"]", True)):
        cuts = sorted(rng.sample(range(len(body) + 1), k=min(len(body) + 1, rng.randint(1, 12))))
        shape = pod.module.JsonShape(10**9)
        try:
            for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True):
                shape.feed(body[start:end])
            refused = False
        except pod.module.Refused as error:
            assert "nests deeper" in error.message
            refused = True
        assert refused is deeper, body


def test_the_issues_worst_body_is_refused_after_a_few_chunks_with_no_python_step_per_value(
    pod: Pod,
) -> None:
    """The probe's body (16 MiB of empty objects within a tenant's share) took 5.5 s of Python on the
    event loop. Now it is refused with 413 once the default value count is passed, a small part of
    the way in, and the check's Python work is a few calls per 64 KiB chunk, whatever the values."""
    body = empty_objects_body(WORST_BODY_BYTES, ALPHA)
    pod.middleware.max_body_bytes = WORST_BODY_BYTES
    chunk = 64 * 1024
    incoming = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    read: list[bytes] = []
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {KEY_A}".encode())],
    }

    async def receive() -> dict[str, Any]:
        read.append(incoming[len(read)])
        return {"type": "http.request", "body": read[-1], "more_body": len(read) < len(incoming)}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the body reached vLLM")

    pod.app[0] = app
    python_calls = [0]

    middleware_file = pod.module.__file__

    def profile(frame: Any, event: str, arg: Any) -> None:
        # The middleware's own Python calls (the event loop's, while the tenant's pacing sleeps
        # between chunks, are per chunk too, and not the check's).
        if event == "call" and frame.f_code.co_filename == middleware_file:
            python_calls[0] += 1

    loop = asyncio.new_event_loop()
    sys.setprofile(profile)
    try:
        loop.run_until_complete(pod.middleware(scope, receive, send))
    finally:
        sys.setprofile(None)
        loop.close()
    assert sent[0]["status"] == 413
    assert b"JSON values" in b"".join(m.get("body", b"") for m in sent[1:])
    # The rest is never read: the connection closes (uvicorn would otherwise read and drop it).
    assert (b"connection", b"close") in sent[0]["headers"]
    values_per_chunk = chunk // 3
    assert len(read) <= pod.module.DEFAULT_MAX_JSON_VALUES // values_per_chunk + 2 < len(incoming) / 10
    assert python_calls[0] < 30 * len(read), (python_calls[0], len(read))  # ~22,000 values per chunk


def test_a_tenant_past_its_share_gets_429_before_any_of_its_body_is_read(pod: Pod) -> None:
    assert pod.middleware.in_flight.take("team-b", 1, 1)
    received: list[int] = []
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {KEY_B}".encode())],
    }

    async def receive() -> dict[str, Any]:
        received.append(1)
        return {"type": "http.request", "body": _completion(BETA), "more_body": False}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(pod.middleware(scope, receive, send))
    finally:
        loop.close()
    assert sent[0]["status"] == 429 and received == []
    assert (b"connection", b"close") in sent[0]["headers"]


def test_a_request_being_read_holds_its_tenants_share_until_it_is_answered(pod: Pod) -> None:
    seen: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(pod.in_flight("team-b"))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    pod.app[0] = app
    loop = asyncio.new_event_loop()
    try:
        for body in (_completion(BETA), b"[" * 70 + b"]" * 70, _completion("no-such-model")):
            sent: list[dict[str, Any]] = []

            async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
                sent.append(message)

            async def receive(body: bytes = body) -> dict[str, Any]:
                seen.append(pod.in_flight("team-b"))  # taken while the body is read
                return {"type": "http.request", "body": body, "more_body": False}

            scope = {
                "type": "http",
                "method": "POST",
                "path": "/v1/completions",
                "root_path": "",
                "headers": [(b"authorization", f"Bearer {KEY_B}".encode())],
            }
            loop.run_until_complete(pod.middleware(scope, receive, send))
            assert pod.in_flight("team-b") == 0  # given back, refused or answered
    finally:
        loop.close()
    assert seen == [1, 1, 1, 1]  # read and served; read (400); read (404)


def test_the_event_loop_answers_health_between_the_check_and_vllms_own_parse(pod: Pod) -> None:
    """vLLM parses the body again on the same loop: the middleware yields in between, so a probe that
    arrived while the body was being checked is answered before vLLM starts on it."""
    order: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        order.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    pod.app[0] = app

    async def ignore(message: dict[str, Any]) -> None:
        return None

    async def no_body() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    def scope(method: str, path: str, key: str | None) -> dict[str, Any]:
        headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
        return {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers}

    async def main() -> None:
        probes: list[asyncio.Task[None]] = []

        async def receive() -> dict[str, Any]:
            # The probe arrives as the last chunk does: it is queued behind the check.
            probes.append(
                asyncio.ensure_future(pod.middleware(scope("GET", "/health", None), no_body, ignore))
            )
            return {"type": "http.request", "body": _completion(ALPHA), "more_body": False}

        await pod.middleware(scope("POST", "/v1/completions", KEY_A), receive, ignore)
        await asyncio.gather(*probes)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert order == ["/health", "/v1/completions"]


@dataclass
class PacerClock:
    """A fake clock for BodyPacer: time passes only while a tenant waits for its turn."""

    now: float = 100.0
    slept: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)  # as a real sleep, the loop runs the others meanwhile


def _paced(pod: Pod) -> tuple[PacerClock, list[tuple[str, float, float]]]:
    """The pod's pacer on a fake clock, and its charges as they come: (tenant, loop seconds, time)."""
    clock = PacerClock()
    pacer = pod.middleware.pacer
    pacer.clock, pacer.sleep = clock, clock.sleep
    charged: list[tuple[str, float, float]] = []
    original = pacer.charge

    def charge(tenant: str, seconds: float) -> None:
        charged.append((tenant, seconds, clock.now))
        original(tenant, seconds)

    pacer.charge = charge
    return clock, charged


def test_the_pacer_keeps_one_tenants_work_to_its_share_of_the_loop(pod: Pod) -> None:
    clock = PacerClock()
    pacer = pod.module.BodyPacer(share=0.25, clock=clock, sleep=clock.sleep)

    async def main() -> None:
        await pacer.turn("team-a")  # nothing charged yet: at once
        pacer.charge("team-a", 0.020)
        # Its next piece waits until the 20 ms fit a quarter of the time since; charges add up.
        assert pacer.wait("team-a") == pytest.approx(0.080)
        pacer.charge("team-a", 0.020)
        assert pacer.wait("team-a") == pytest.approx(0.160)
        assert pacer.wait("team-b") == 0.0  # another tenant is not held by team-a's work
        await pacer.turn("team-a")
        await pacer.turn("team-b")

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert clock.slept == [pytest.approx(0.160)]
    clock.now += 1.0  # once team-a's work fits its share again, it goes at once
    assert pacer.wait("team-a") == 0.0
    unpaced = pod.module.BodyPacer(share=1.0, clock=clock)  # share 1: no pacing
    unpaced.charge("team-a", 5.0)
    assert unpaced.wait("team-a") == 0.0
    assert pod.module.DEFAULT_TENANT_LOOP_SHARE == pod.middleware.pacer.share == 0.25


def test_the_pacer_is_charged_with_the_time_the_middleware_spent_on_the_body(pod: Pod) -> None:
    _, charged = _paced(pod)
    _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA))  # the first call's one-time costs
    charged.clear()
    small = _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA))
    small_charges = len(charged)
    large = _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA, prompt=[7] * 30_000), chunks=9)
    assert small.status == large.status == 200
    # Each chunk's scan, then the parse and checks, then vLLM's work beyond its parse (none for a
    # completion), each charged to the tenant.
    assert small_charges == 2 and len(charged) == 2 + 9 + 1
    assert {tenant for tenant, _, _ in charged} == {"team-a"}
    # 30,000 token IDs cost the scan and parse far more than a one-line body (CPU time of the loop:
    # 27-33x on a quiet machine; 5x leaves room for a busy one's cold caches).
    small_cost = sum(seconds for _, seconds, _ in charged[:2])
    assert sum(seconds for _, seconds, _ in charged[2:]) > 5 * small_cost > 0
    # A body the scan refuses is charged with what the scan cost, and paced like any other.
    too_deep = b'{"model": "tiny-alpha", "prompt": ' + b"[" * 70 + b"]" * 70 + b"}"
    assert _call(pod, "POST", "/v1/completions", KEY_B, too_deep).status == 400
    assert charged[-1][0] == "team-b" and charged[-1][1] > 0


def test_a_body_refused_before_its_end_also_pays_for_the_connection_it_closes(pod: Pod) -> None:
    """Issue 49: 16 MiB bodies refused at their first chunk came back at 270 a second, each closing its
    connection; the next one's accept and set-up, outside the middleware's clock, took another
    tenant's completion to 2.3-2.7x idle. Such a refusal is charged CLOSED_CONNECTION_SECONDS more."""
    _, charged = _paced(pod)
    digits = b'{"model": "tiny-beta", "prompt": [' + b"9" * 5000 + b"]}"
    refused = _call(pod, "POST", "/v1/completions", KEY_A, digits + b" " * 200_000, chunks=4)
    assert refused.status == 400 and not refused.reached
    closed = pod.module.CLOSED_CONNECTION_SECONDS
    assert [seconds for _, seconds, _ in charged].count(closed) == 1
    assert pod.middleware.pacer.wait("team-a") >= closed / pod.middleware.pacer.share
    # A refusal that read the whole body closes nothing: no such charge.
    charged.clear()
    whole = _call(pod, "POST", "/v1/completions", KEY_B, _completion("no-such-model"))
    assert whole.status == 404 and closed not in [seconds for _, seconds, _ in charged]


@pytest.mark.parametrize(
    ("model", "status"), [(BETA, 403), ("no-such-model", 404)], ids=["not-its-model", "not-served"]
)
def test_a_body_refused_after_its_parse_is_charged_and_delays_the_tenants_next_body(
    pod: Pod, model: str, status: int
) -> None:
    """Issue 49: 16 MiB of huge integers naming a model the tenant may not use cost 0.39 s of parse
    each, never paced, since the 403 came after the parse and only bodies passed to vLLM waited."""
    clock, charged = _paced(pod)
    refused = _call(pod, "POST", "/v1/completions", KEY_A, _completion(model, prompt=[7] * 30_000), chunks=9)
    assert refused.status == status and not refused.reached
    parse = charged[-1]  # after the 9 chunks' scans: the parse and checks that ended in the refusal
    assert len(charged) == 10 and parse[0] == "team-a" and parse[1] > max(c[1] for c in charged[:9])
    pacer = pod.middleware.pacer
    assert pacer.wait("team-a") == pytest.approx(parse[1] / pacer.share) and parse[1] > 0
    # The tenant's next body waits until all of it fits its share; another tenant's waits only for
    # its own pieces. Team-a owes a second more here, so that this does not compare two measured CPU
    # times (a one-line body's checks against 30,000 IDs' parse: 9-18x apart, even on a quiet machine).
    pacer.charge("team-a", 1.0)
    owed = pacer.wait("team-a")
    clock.slept.clear()
    assert _call(pod, "POST", "/v1/completions", KEY_B, _completion(BETA)).status == 200
    waited = sum(clock.slept)
    own = sum(seconds for tenant, seconds, _ in charged if tenant == "team-b") / pacer.share
    assert waited <= own + 1e-9 and own < 1.0 < owed
    clock.slept.clear()
    assert _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA)).status == 200
    assert clock.slept[0] == pytest.approx(owed - waited)  # before its first chunk is scanned


def test_a_tenants_parallel_connections_take_turns_on_its_one_clock(pod: Pod) -> None:
    """Issue 49: the scans and parses of several connections' bodies interleaved on the loop before
    any pacing applied. Every piece now waits for the tenant's turn, whichever connection it is of:
    no piece starts before the work charged ahead of it fits the tenant's share of the time since."""
    clock, charged = _paced(pod)
    body = _completion(ALPHA, prompt=[7] * 30_000)
    chunks = [body[i : i + 20_000] for i in range(0, len(body), 20_000)]
    reads: list[str] = []
    answers: list[int] = []

    def request(name: str, key: str) -> Any:
        pending = list(chunks)

        async def receive() -> dict[str, Any]:
            await asyncio.sleep(0)  # the network: the loop runs the other connection meanwhile
            reads.append(name)
            part = pending.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(pending)}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answers.append(message["status"])

        headers = [(b"authorization", f"Bearer {key}".encode())]
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/completions",
            "root_path": "",
            "headers": headers,
        }
        return pod.middleware(scope, receive, send)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    pod.app[0] = app

    async def main() -> None:
        await asyncio.gather(request("first", KEY_A), request("second", KEY_A))

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert answers == [200, 200]
    assert reads.index("second") < len(reads) - 1 - reads[::-1].index("first")  # they overlapped
    share = pod.middleware.pacer.share
    owed = 0.0
    for tenant, seconds, started in charged:
        assert tenant == "team-a"
        assert started - 100.0 >= owed - 1e-9, (started, owed)
        owed += seconds / share
    assert len(charged) == 2 * (len(chunks) + 1) and sum(clock.slept) > 0


def test_a_conversation_longer_than_the_models_context_gets_400_naming_the_limit(pod: Pod) -> None:
    """Issue 49: a chat of ~37,000 one-token messages cost vLLM's validation and template far more
    than the middleware's parse. Every message renders to at least one token, so a conversation of
    more messages than `--max-model-len` could never run: refused before vLLM works on it."""
    message = {"role": "user", "content": "hi"}
    chat = json.dumps({"model": ALPHA, "messages": [message] * 5}).encode()
    assert pod.middleware.max_model_len is None  # no bound rendered: vLLM judges
    assert _call(pod, "POST", "/v1/chat/completions", KEY_A, chat).status == 200
    pod.middleware.max_model_len = 4
    answer = _call(pod, "POST", "/v1/chat/completions", KEY_A, chat)
    assert answer.status == 400 and not answer.reached
    error = json.loads(answer.body)["error"]
    assert error["code"] == "context_length_exceeded"
    assert "5 messages" in error["message"] and "context of 4 tokens" in error["message"]
    fits = json.dumps({"model": ALPHA, "messages": [message] * 4}).encode()
    assert _call(pod, "POST", "/v1/chat/completions", KEY_A, fits).status == 200
    batch = json.dumps({"model": ALPHA, "messages": [[message] * 2, [message] * 5]}).encode()
    assert _call(pod, "POST", "/v1/chat/completions/batch", KEY_A, batch).status == 400
    responses = json.dumps({"model": ALPHA, "input": [message] * 5}).encode()
    assert _call(pod, "POST", "/v1/responses", KEY_A, responses).status == 400
    assert pod.module.max_model_len({pod.module.MAX_MODEL_LEN_ENV: "32768"}) == 32768


def test_each_models_pods_get_its_context_as_the_message_bound(pod: Pod) -> None:
    prod = load_stack("prod")
    for model in prod.models:
        env = {e["name"]: e["value"] for e in server_auth.environment(prod, model)}
        assert env[pod.module.MAX_MODEL_LEN_ENV] == str(model.vllm.max_model_len)
    assert pod.module.MAX_MODEL_LEN_ENV not in {e["name"] for e in server_auth.environment(prod)}


def test_vllms_work_per_chat_message_and_content_part_is_charged_before_vllm_gets_the_body(
    pod: Pod,
) -> None:
    items = pod.module.chat_items
    parts = {
        "role": "user",
        "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
    }
    message = {"role": "user", "content": "hi"}
    assert items("/v1/chat/completions", {"messages": [message, message, parts]}) == (3, 5)
    assert items("/v1/chat/completions/batch", {"messages": [[message], [message, parts]]}) == (2, 5)
    assert items("/v1/responses", {"input": [message] * 3}) == (3, 3)
    assert items("/v1/responses", {"input": "hi"}) == (0, 0)
    assert items("/v1/completions", {"prompt": "hi"}) == (0, 0)
    assert items("/v1/audio/transcriptions", None) == (0, 0)
    clock, charged = _paced(pod)
    seen: list[int] = []
    chat = json.dumps({"model": ALPHA, "messages": [message] * 999 + [parts]}).encode()
    answer = _call(
        pod, "POST", "/v1/chat/completions", KEY_A, chat, while_answering=lambda: seen.append(len(charged))
    )
    assert answer.status == 200
    per_item = pod.module.VLLM_SECONDS_PER_CHAT_ITEM
    assert charged[-1][1] > 1002 * per_item and seen == [len(charged)]  # with the parse's own cost
    # The tenant's next body waits for it too.
    assert _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA)).status == 200
    assert sum(clock.slept) >= 1002 * per_item / pod.middleware.pacer.share


def test_a_number_with_more_digits_than_any_client_writes_is_refused_by_the_scan(pod: Pod) -> None:
    """Issue 49: Python converts an integer's digits in time that grows with their square, so 16 MiB
    of 4,299-digit integers cost 0.39 s of parse. The scan refuses a run of more than 64 digits
    outside strings, wherever the chunks cut it, before anything parses it."""
    limit = pod.module.MAX_JSON_NUMBER_DIGITS
    assert limit == 64

    def scan(*chunks: bytes) -> bool:
        shape = pod.module.JsonShape(10**9)
        try:
            for chunk in chunks:
                shape.feed(chunk)
        except pod.module.Refused as refused:
            assert refused.status == 400 and f"more than {limit} digits" in refused.message
            return False
        return True

    digits = b"9" * limit
    assert scan(b'{"seed": ' + digits + b', "x": -1.' + digits + b"e+" + digits + b"}")
    assert not scan(b'{"seed": ' + digits + b"9}")
    assert not scan(b'{"t": 1.' + digits + b"9}") and not scan(b'{"t": 1e' + digits + b"9}")
    assert not scan(b'{"seed": ' + digits[:40], digits[40:], b"9}")  # cut anywhere
    assert not scan(b'{"seed": 9', b"", digits, b"}")
    assert scan(b'{"seed": ' + digits[:40], b"," + digits[:40] + b"]}")
    assert scan(b'{"prompt": "' + b"9" * 10_000 + b'"}')  # digits in a string are text
    assert scan(json.dumps({"prompt": list(range(10**6, 10**6 + 20_000)), "seed": 2**64 - 1}).encode())
    # The probe's body: a few thousand 4,299-digit integers naming a model the tenant may not use.
    huge = b'{"model": "tiny-beta", "prompt": [' + b",".join([b"9" * 4299] * 23) + b"]}"
    _, charged = _paced(pod)
    answer = _call(pod, "POST", "/v1/completions", KEY_A, huge, chunks=8)
    assert answer.status == 400 and not answer.reached
    assert f"more than {limit} digits".encode() in answer.body
    # The first chunk's scan, and no parse; and the connection it closes (CLOSED_CONNECTION_SECONDS).
    scans = [seconds for _, seconds, _ in charged if seconds != pod.module.CLOSED_CONNECTION_SECONDS]
    assert len(charged) == 2 and len(scans) == 1 and scans[0] > 0


# --- issue 49: shares over the pod's processes, counted in sequences; a salt no caller computes ------


def test_a_requests_sequences_are_its_prompts_times_n_as_vllm_runs_them(pod: Pod) -> None:
    sequences = pod.module.request_sequences
    message = {"role": "user", "content": "hi"}
    assert sequences("/v1/completions", {"prompt": "x"}) == 1
    assert sequences("/v1/completions", {"prompt": ["x"] * 256}) == 256  # the probe's batch
    assert sequences("/v1/completions", {"prompt": [1, 2, 3]}) == 1  # one prompt of token ids
    assert sequences("/v1/completions", {"prompt": [[1, 2], [3]], "n": 4}) == 8
    assert sequences("/v1/completions", {"prompt": "x", "prompt_embeds": ["e1", "e2"]}) == 3
    assert sequences("/v1/completions", {"prompt": "x", "n": 5, "use_beam_search": True}) == 5
    assert sequences("/invocations", {"prompt": ["a", "b"], "n": 2}) == 4
    assert sequences("/v1/chat/completions", {"messages": [message, message], "n": 3}) == 3
    assert sequences("/v1/chat/completions/batch", {"messages": [[message]] * 3}) == 3
    assert sequences("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"n": 5}}) == 5
    assert sequences("/generative_scoring", {"query": "q", "items": ["a", "b", "c"]}) == 3
    assert sequences("/v1/systemone", {"state": "s", "questions": {"a": {}, "b": {}}}) == 2
    assert sequences("/v1/embeddings", {"input": ["a", "b"]}) == 2
    assert sequences("/v1/embeddings", {"input": [[1, 2], [3]]}) == 2
    assert sequences("/v1/embeddings", {"input": "a"}) == 1
    assert sequences("/v1/score", {"text_1": "q", "text_2": ["a", "b", "c"]}) == 3  # paired, one to N
    assert sequences("/v1/score", {"text_1": ["q", "r"], "text_2": ["a", "b"]}) == 2  # N to N
    assert sequences("/v1/rerank", {"query": "q", "documents": ["a", "b"]}) == 2
    # One conversation, whatever `n` says on a route that takes none.
    assert sequences("/v1/responses", {"input": ["x", "y"], "n": 9}) == 1
    # What vLLM refuses still counts as the one request it is; a body not read (audio) too.
    for n in (0, -3, True, "4", None, 2.5):
        assert sequences("/v1/completions", {"prompt": "x", "n": n}) == 1, n
    assert sequences("/v1/completions", {"prompt": []}) == 1
    assert sequences("/v1/audio/transcriptions", None) == 1


def _with_team_a_share(pod: Pod, share: int) -> None:
    spec = json.loads(json.dumps(SPEC))
    spec["tenants"]["team-a"]["max_in_flight"] = share
    (pod.folder / "tenants.json").write_text(json.dumps(spec))
    pod.later(pod.module.RELOAD_SECONDS)


def test_a_share_counts_each_prompt_times_n_and_releases_exactly_what_it_took(pod: Pod) -> None:
    """Issue 49: 8 requests of 256 prompts each, within a share of 8 requests, slowed another tenant
    ~220x. A request now takes one sequence of the share while its body is read, then all of its
    sequences; one that could never fit gets 400, one that does not fit now 429 with Retry-After."""
    _with_team_a_share(pod, 4)
    whole = _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA, prompt=["a"] * 5))
    assert whole.status == 400 and not whole.reached
    assert json.loads(whole.body)["error"]["code"] == "too_many_sequences"
    assert pod.in_flight("team-a") == 0

    held: list[int] = []
    fits = _completion(ALPHA, prompt=["a", "b"], n=2)  # 4 sequences: the whole share
    answer = _call(
        pod,
        "POST",
        "/v1/completions",
        KEY_A,
        fits,
        while_answering=lambda: held.append(pod.in_flight("team-a")),
    )
    assert answer.status == 200 and held == [4] and pod.in_flight("team-a") == 0

    assert pod.middleware.in_flight.take("team-a", 3, 4)  # three sequences in flight elsewhere
    sent: list[dict[str, Any]] = []
    over = _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA, prompt=["a", "b"]), sent=sent)
    assert over.status == 429 and not over.reached
    assert (b"retry-after", b"1") in sent[0]["headers"]
    assert pod.in_flight("team-a") == 3  # the refused request gave back the one it took
    assert _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA)).status == 200
    chat = {"model": ALPHA, "messages": [{"role": "user", "content": "hi"}], "n": 2}
    assert _call(pod, "POST", "/v1/chat/completions", KEY_A, json.dumps(chat).encode()).status == 429
    pod.middleware.in_flight.give("team-a", 3)
    assert _call(pod, "POST", "/v1/chat/completions", KEY_A, json.dumps(chat).encode()).status == 200
    assert pod.in_flight("team-a") == 0


API_SERVER_PROCESS = textwrap.dedent(
    """
    import importlib.util, pathlib, sys
    spec = importlib.util.spec_from_file_location("vllm_platform_auth", sys.argv[1])
    module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    folder = pathlib.Path(sys.argv[2])
    counter = module.PodInFlight(folder)
    print("ready", flush=True)
    for line in sys.stdin:
        verb, *rest = line.split()
        if verb == "take":
            print(counter.take(rest[0], int(rest[1]), int(rest[2])), flush=True)
        elif verb == "give":
            counter.give(rest[0], int(rest[1]))
            print("given", flush=True)
        elif verb == "held":
            print(counter.held(rest[0]), flush=True)
        else:
            print(module.pod_salt_secret(folder).hex(), flush=True)
    """
)
ANSWER_TIMEOUT_SECONDS = 60


class ApiServerProcess:
    """A process of its own, as each of vLLM's API-server processes is, with the middleware's
    PodInFlight over the pod's shared folder; driven a line at a time."""

    def __init__(self, folder: Path) -> None:
        env = {**os.environ, "VLLM_API_KEY": "k"}
        env.pop("VLLM_PLATFORM_TENANTS", None)
        self.process = subprocess.Popen(
            [sys.executable, "-c", API_SERVER_PROCESS, str(server_auth.MODULE_FILE), str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._line() == "ready"

    def _line(self) -> str:
        import select

        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], ANSWER_TIMEOUT_SECONDS)
        assert ready, "the API-server process did not answer"
        return self.process.stdout.readline().strip()

    def ask(self, line: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self._line()

    def stop(self) -> None:
        self.process.kill()  # as a crash: no clean-up of its own
        self.process.wait(timeout=ANSWER_TIMEOUT_SECONDS)


def test_the_pods_api_server_processes_count_one_share_and_a_dead_ones_count_is_gone(tmp_path: Path) -> None:
    """Issue 49: vLLM runs one API-server process per data-parallel rank, and the kernel spreads the
    connections over them; each counted alone, so a DP=2 leader admitted a share of 2 four times over
    two processes. Now they count together, and a killed process's sequences stop counting at once,
    so a restarted server starts from nothing (tests/e2e/test_multi_node_engine.py: the real leader)."""
    folder = tmp_path / "shm"
    folder.mkdir()
    first, second = ApiServerProcess(folder), ApiServerProcess(folder)
    try:
        assert first.ask("take t 2 3") == "True"
        assert second.ask("take t 2 3") == "False"  # 2 + 2 over the pod's share of 3
        assert second.ask("take t 1 3") == "True"
        assert first.ask("held t") == second.ask("held t") == "3"
        assert first.ask("take u 3 3") == "True"  # each tenant its own count
        assert first.ask("give t 2") == "given"
        assert second.ask("take t 2 3") == "True"
        second.stop()  # dies holding 3 of t's sequences
        assert first.ask("held t") == "0" and first.ask("held u") == "3"
        restarted = ApiServerProcess(folder)  # takes the dead process's slot: its count starts at 0
        try:
            assert restarted.ask("held t") == "0" and restarted.ask("take t 3 3") == "True"
            assert first.ask("take t 1 3") == "False"
            # Every process of the pod derives tenants' salts from the one secret the first made.
            assert len({first.ask("secret"), restarted.ask("secret")}) == 1
        finally:
            restarted.stop()
    finally:
        first.stop()
        second.stop()
    other_pod = tmp_path / "other-pod-shm"
    other_pod.mkdir()
    elsewhere = ApiServerProcess(other_pod)
    try:
        assert elsewhere.ask("held t") == "0"
        assert elsewhere.ask("secret") != (folder / "cache-salt.secret").read_bytes().hex()
    finally:
        elsewhere.stop()


def test_a_tenants_cache_salt_is_an_hmac_under_the_pods_own_secret(pod: Pod) -> None:
    """Issue 49: the salt was `tenant=<name>;`, which the operator key (it may set any salt) could
    send to read a tenant's cached prefixes. Now it is HMAC-SHA256 of the name under a random secret
    the pod's first API-server process made in the pod's tmpfs, readable by the pod's user only."""
    secret_file = pod.folder / "shm" / pod.module.CACHE_SALT_SECRET_FILE
    assert len(secret_file.read_bytes()) == 32 and secret_file.stat().st_mode & 0o777 == 0o600
    salt = _salt_seen_by_vllm(pod, "/v1/completions", KEY_A, {"model": ALPHA})
    assert salt == pod.salt("team-a")
    assert isinstance(salt, str) and "team-a" not in salt
    assert salt.split(";")[0] != hashlib.sha256(b"team-a").hexdigest()  # not from the name alone
    # The operator's own salt is passed as sent: the former salt reaches no tenant's cache.
    operator = _call(
        pod, "POST", "/v1/completions", OPERATOR_KEY, _completion(ALPHA, cache_salt="tenant=team-a;")
    )
    assert operator.app_body is not None and json.loads(operator.app_body)["cache_salt"] == "tenant=team-a;"
    assert json.loads(operator.app_body)["cache_salt"] != salt


def test_with_tenants_a_target_that_is_not_a_canonical_path_gets_400_before_any_key_check(pod: Pod) -> None:
    from tests import path_tricks
    from tests.support.auth_module import asgi_scope_for_target

    for key in (KEY_A, OPERATOR_KEY, None):
        headers = [] if key is None else [(b"authorization", f"Bearer {key}".encode())]
        for target in path_tricks.NON_CANONICAL:
            sent: list[dict[str, Any]] = []

            async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
                sent.append(message)

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": _completion(ALPHA), "more_body": False}

            loop = asyncio.new_event_loop()
            try:
                scope = asgi_scope_for_target("POST", target, headers)
                loop.run_until_complete(pod.middleware(scope, receive, send))
            finally:
                loop.close()
            assert sent[0]["status"] == 400, (key, target)
            assert json.loads(sent[1]["body"])["error"]["code"] == "invalid_path"
    assert pod.in_flight("team-b") == 0
    assert _call(pod, "POST", "/v1/completions", KEY_A, _completion(ALPHA)).reached  # the canonical one
