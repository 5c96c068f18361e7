"""The API-key check every vLLM pod runs (components/server_auth.py): how the render wires it, and
the ASGI middleware itself driven as an ASGI server drives it. tests/e2e/test_api_key_on_every_route.py
runs it inside the real vLLM 0.32.0 server."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from components import server_auth
from components.vllm_arguments import reserved_flag_problems
from infra.render import RenderResult
from tests import path_tricks
from tests.support.auth_module import asgi_scope_for_target, load_auth_module
from tests.test_serving_render import config_of, container, pod_spec

KEY = "test-key-0123456789"


def test_every_vllm_pod_loads_the_middleware_from_the_configmap(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        spec = pod_spec(stack_render, model.name)
        server = container(spec)
        args = server["args"]
        assert args[args.index("--middleware") + 1] == "vllm_platform_auth.ApiKeyMiddleware"
        assert args.count("--middleware") == 1
        env = {e["name"]: e for e in server["env"]}
        assert env["PYTHONPATH"]["value"] == server_auth.MOUNT_PATH
        if config_of(stack_render).tenants:  # their keys are files (tests/test_tenants_render.py)
            assert "VLLM_API_KEY" not in env and "VLLM_PLATFORM_TENANTS" in env
        else:
            assert "secretKeyRef" in env["VLLM_API_KEY"]["valueFrom"]
        mount = next(m for m in server["volumeMounts"] if m["name"] == server_auth.VOLUME_NAME)
        assert mount == server_auth.volume_mount()
        assert mount["readOnly"] is True
        volume = next(v for v in spec["volumes"] if v["name"] == server_auth.VOLUME_NAME)
        assert volume["configMap"]["name"] == server_auth.CONFIG_MAP_NAME
        # The init container (preloader) never gets the middleware or the key.
        assert all(m["name"] != server_auth.VOLUME_NAME for m in spec["initContainers"][0]["volumeMounts"])


def test_a_changed_check_rolls_the_pods(stack_render: RenderResult) -> None:
    expected = hashlib.sha256(server_auth.MODULE_FILE.read_bytes()).hexdigest()
    for deployment in stack_render.find("Deployment"):
        if deployment["metadata"]["name"] == "vllm":
            annotations = deployment["spec"]["template"]["metadata"]["annotations"]
            assert annotations[server_auth.CHECKSUM_ANNOTATION] == expected


def test_a_middleware_in_extra_args_is_refused() -> None:
    problems = reserved_flag_problems(["--middleware", "my.Middleware"], ("models", 0, "vllm", "extra_args"))
    assert [p.path for p in problems] == [("models", 0, "vllm", "extra_args", 0)]
    assert "outermost" in problems[0].message


def _load_module(monkeypatch: pytest.MonkeyPatch, key: str) -> ModuleType:
    monkeypatch.setenv("VLLM_API_KEY", key)
    return load_auth_module(monkeypatch, "vllm_platform_auth_under_test")


@pytest.mark.parametrize("key", ["", "   ", "\n"])
def test_an_empty_key_fails_the_import_that_vllm_does_at_start(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    with pytest.raises(RuntimeError, match="refuses to start a server without an API key"):
        _load_module(monkeypatch, key)


def _call(module: ModuleType, scope: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    reached = False
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal reached
        reached = True

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    # A loop of its own, never set as the thread's current one (the Pulumi renders use that).
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(module.ApiKeyMiddleware(app)(scope, receive, send))
    finally:
        loop.close()
    return sent, reached


def _http(path: str, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers or []}


def test_only_get_health_and_metrics_pass_without_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load_module(monkeypatch, KEY)
    assert _call(module, _http("/health"))[1]
    assert _call(module, _http("/metrics"))[1]
    for scope in (
        _http("/health", "POST"),
        _http("/invocations", "POST"),
        _http("/tokenize", "POST"),
        _http("/v1/models"),
        _http("/healthz"),
    ):
        sent, reached = _call(module, scope)
        assert not reached, scope
        assert sent[0]["status"] == 401
    sent, reached = _call(module, _http("/metrics/../tokenize"))
    assert not reached and sent[0]["status"] == 400  # not canonical (issue 49): before any key check


def _refused_as_not_canonical(sent: list[dict[str, Any]], reached: bool) -> bool:
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return (
        not reached
        and sent[0]["status"] == 400
        and json.loads(body)["error"]["code"] == "invalid_path"
        and (b"connection", b"close") in sent[0]["headers"]
    )


def test_a_target_that_is_not_a_canonical_path_gets_400_before_any_key_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 49: the corpus of tests/path_tricks.py, as uvicorn hands each target to the app (the
    percent-decoded `path` and the `raw_path` as sent), with the model's key, without one, on the open
    routes' methods and the others; the real server: tests/e2e/test_canonical_paths.py."""
    module = _load_module(monkeypatch, KEY)
    good = [(b"authorization", f"Bearer {KEY}".encode())]
    refused = [
        target
        for target in path_tricks.NON_CANONICAL
        for method in path_tricks.METHODS
        for headers in ([], good)
        if _refused_as_not_canonical(*_call(module, asgi_scope_for_target(method, target, headers)))
    ]
    assert len(refused) == len(path_tricks.NON_CANONICAL) * len(path_tricks.METHODS) * 2
    # Canonical paths are judged as before: a query may follow at the pod (its path is judged alone).
    for target in (*path_tricks.CANONICAL_UNKNOWN, *path_tricks.WITH_QUERY):
        sent, reached = _call(module, asgi_scope_for_target("POST", target))
        assert not reached and sent[0]["status"] == 401, target
    assert _call(module, asgi_scope_for_target("POST", "/invocations?x=1", good))[1]
    assert _call(module, asgi_scope_for_target("GET", "/health?verbose"))[1]
    for open_route_spelled_otherwise in ("/health/", "//health", "/metrics/", "/./metrics", "/%68ealth"):
        assert _refused_as_not_canonical(
            *_call(module, asgi_scope_for_target("GET", open_route_spelled_otherwise))
        )
    # A WebSocket to a non-canonical path is closed before vLLM sees it, whatever the key.
    scope = {**asgi_scope_for_target("GET", "/v1/%72ealtime", good), "type": "websocket"}
    sent, reached = _call(module, scope)
    assert not reached and sent == [{"type": "websocket.close", "code": 1008}]


def test_the_canonical_rule_reads_the_bytes_sent_not_the_decoded_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = _load_module(monkeypatch, KEY)
    for raw in (b"/v1/completions", b"/health", b"/a-b.c_d~e/F9"):
        assert module.is_canonical_target({"raw_path": raw, "path": "/x/../y"}), raw
    for raw in (
        b"",
        b"/",
        b"/v1/%2e%2e",
        b"/v1/..",
        b"/v1/.",
        b"/v1//x",
        b"/v1/x/",
        b"/v1/x;y",
        b"/\xc3\xa9",
    ):
        assert not module.is_canonical_target({"raw_path": raw, "path": "/v1/completions"}), raw
    # A server that gives no raw_path: the decoded path is all there is to judge.
    assert not module.is_canonical_target({"path": "/v1/../workers"})
    assert module.is_canonical_target({"path": "/v1/completions"})


def test_the_bearer_key_passes_and_any_other_credential_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load_module(monkeypatch, KEY)
    good = [(b"authorization", f"Bearer {KEY}".encode())]
    assert _call(module, _http("/invocations", "POST", good))[1]
    assert _call(module, _http("/invocations", "POST", [(b"Authorization", f"bearer {KEY}".encode())]))[1]
    for headers in (
        [(b"authorization", b"Bearer wrong")],
        [(b"authorization", KEY.encode())],
        [(b"authorization", f"Basic {KEY}".encode())],
        [(b"x-api-key", KEY.encode())],
        [(b"authorization", f"Bearer {KEY}x".encode())],
    ):
        assert not _call(module, _http("/invocations", "POST", headers))[1], headers


def test_a_websocket_without_the_key_is_closed_before_vllm_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load_module(monkeypatch, KEY)
    sent, reached = _call(module, {"type": "websocket", "path": "/v1/realtime", "headers": []})
    assert not reached
    assert sent == [{"type": "websocket.close", "code": 1008}]


def test_lifespan_events_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load_module(monkeypatch, KEY)
    assert _call(module, {"type": "lifespan"})[1]


def test_the_models_key_reaches_only_the_inference_routes_and_the_operator_key_every_route(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "operator.key").write_text("op-key-0123456789\n")
    monkeypatch.setenv("VLLM_PLATFORM_OPERATOR_KEY_FILE", str(tmp_path / "operator.key"))
    module = _load_module(monkeypatch, KEY)
    model_key = [(b"authorization", f"Bearer {KEY}".encode())]
    operator_key = [(b"authorization", b"Bearer op-key-0123456789")]
    for path in ("/v1/completions", "/v1/chat/completions", "/invocations", "/tokenize"):
        assert _call(module, _http(path, "POST", model_key))[1], path
    assert _call(module, _http("/v1/models", "GET", model_key))[1]
    for method, path in (
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/scale_elastic_ep"),
        ("POST", "/inference/v1/abort_requests"),
        ("GET", "/openapi.json"),
        ("POST", "/adapters"),
        ("POST", "/some/route/of/a/later/vllm"),
    ):
        sent, reached = _call(module, _http(path, method, model_key))
        assert not reached and sent[0]["status"] == 403, path
        assert _call(module, _http(path, method, operator_key))[1], path


def test_without_an_operator_key_no_key_reaches_the_operator_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_PLATFORM_OPERATOR_KEY_FILE", raising=False)
    module = _load_module(monkeypatch, KEY)
    sent, reached = _call(
        module, _http("/v1/load_lora_adapter", "POST", [(b"authorization", f"Bearer {KEY}".encode())])
    )
    assert not reached and sent[0]["status"] == 403


def _post(module: ModuleType, path: str, body: bytes, key: str = KEY) -> tuple[int, bool]:
    """POST `body` in one message through a fresh middleware; (status, reached vLLM)."""
    reached, sent = [], []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(module.ApiKeyMiddleware(app)(_http(path, "POST", headers), receive, send))
    finally:
        loop.close()
    return sent[0]["status"], bool(reached)


def test_with_one_key_too_deep_or_too_large_bodies_never_reach_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_PLATFORM_MAX_BODY_BYTES", "500000")
    module = _load_module(monkeypatch, KEY)

    def nested(depth: int) -> bytes:
        return b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"

    assert _post(module, "/v1/completions", nested(200_000)) == (400, False)  # 400 kB: RecursionError
    assert _post(module, "/v1/completions", nested(65)) == (400, False)  # parses, deeper than 64
    assert _post(module, "/v1/completions", nested(300_000)) == (413, False)  # 600 kB: past the limit
    assert _post(module, "/v1/completions", b'{"prompt": "hi", "max_tokens": 1}') == (200, True)
