"""Issue 15: no route of the real vLLM 0.32.0 server answers without the key, but /health and /metrics.

The session's server runs the dev stack's rendered arguments, including `--middleware`, with the
middleware loaded from the rendered ConfigMap through the rendered PYTHONPATH (tests/e2e/conftest.py),
so what is tested is what the pod runs. The routes come from the server's own OpenAPI document, so a
route a newer vLLM adds is covered without editing this test.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import (
    API_KEY,
    OPERATOR_KEY,
    SERVED_MODEL_NAME,
    pod_auth_environment,
    server_arguments,
)
from tests.support.vllm_server import RunningVllmServer, build_app_problem_with_real_vllm

pytestmark = pytest.mark.e2e

OPEN_ROUTES = {("GET", "/health"), ("GET", "/metrics")}
REFUSED = {401, 403, 404}
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# Asked of every route: no key, a wrong key, the key in another scheme or place than a bearer header.
WITHOUT_THE_KEY: dict[str, dict[str, str]] = {
    "no key": {},
    "wrong key": {"Authorization": "Bearer not-the-key"},
    "basic scheme": {"Authorization": f"Basic {API_KEY}"},
    "key as a bare header": {"Authorization": API_KEY},
    "other header": {"X-API-Key": API_KEY},
}


@pytest.fixture(scope="module")
def openapi_routes(vllm_server: RunningVllmServer) -> list[tuple[str, str]]:
    # The document is an operator route (issue 34): the model's key gets 403, the operator key reads it.
    assert httpx.get(f"{vllm_server.base_url}/openapi.json", headers=AUTH, timeout=30).status_code == 403
    operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    response = httpx.get(f"{vllm_server.base_url}/openapi.json", headers=operator, timeout=30)
    assert response.status_code == 200, response.text
    routes = sorted(
        (method.upper(), path)
        for path, operations in response.json()["paths"].items()
        for method in operations
        if method in {"get", "post", "put", "patch", "delete"}
    )
    # The routes the security review found open must be among those enumerated (else the document
    # changed shape and this test would pass vacuously).
    paths = {path for _, path in routes}
    assert {"/invocations", "/tokenize", "/detokenize", "/v1/chat/completions"} <= paths, paths
    return routes


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def test_openapi_document_itself_needs_the_key(vllm_server: RunningVllmServer) -> None:
    assert httpx.get(f"{vllm_server.base_url}/openapi.json", timeout=10).status_code == 401


def test_no_route_but_health_and_metrics_answers_without_the_key(
    vllm_server: RunningVllmServer, openapi_routes: list[tuple[str, str]]
) -> None:
    answered: list[str] = []
    with httpx.Client(base_url=vllm_server.base_url, timeout=30) as client:
        for method, path in openapi_routes:
            if (method, path) in OPEN_ROUTES:
                continue
            for case, headers in WITHOUT_THE_KEY.items():
                # A body that would be a valid completion request: a refusal must not depend on it.
                body = {"model": SERVED_MODEL_NAME, "prompt": "hi", "max_tokens": 1}
                response = client.request(
                    method, _concrete(path), headers=headers, json=body if method != "GET" else None
                )
                if response.status_code not in REFUSED:
                    answered.append(f"{method} {path} ({case}): {response.status_code} {response.text[:120]}")
    assert answered == []
    # Every enumerated route other than the open ones was asked in every way.
    assert len(openapi_routes) - len(OPEN_ROUTES & set(openapi_routes)) > 20


def test_health_and_metrics_answer_without_the_key(vllm_server: RunningVllmServer) -> None:
    assert httpx.get(f"{vllm_server.base_url}/health", timeout=10).status_code == 200
    metrics = httpx.get(f"{vllm_server.base_url}/metrics", timeout=10)
    assert metrics.status_code == 200
    assert "vllm:num_requests_waiting" in metrics.text


@pytest.mark.parametrize(
    "path",
    ["/health/../invocations", "//invocations", "/metrics/../tokenize", "/Invocations", "/invocations/"],
)
def test_path_spellings_do_not_slip_past_the_check(vllm_server: RunningVllmServer, path: str) -> None:
    response = httpx.post(f"{vllm_server.base_url}{path}", json={"prompt": "hi", "max_tokens": 1}, timeout=30)
    # 400 for the spellings that are not canonical paths (issue 49: refused before any key check).
    assert response.status_code in {400, *REFUSED}, (path, response.status_code, response.text[:200])


def test_routes_the_review_found_open_answer_with_the_key(vllm_server: RunningVllmServer) -> None:
    with httpx.Client(base_url=vllm_server.base_url, headers=AUTH, timeout=60) as client:
        completion = client.post(
            "/invocations", json={"model": SERVED_MODEL_NAME, "prompt": "hi", "max_tokens": 2}
        )
        assert completion.status_code == 200, completion.text
        tokens = client.post("/tokenize", json={"model": SERVED_MODEL_NAME, "prompt": "hello"})
        assert tokens.status_code == 200 and tokens.json()["tokens"], tokens.text
        assert (
            client.post(
                "/detokenize", json={"model": SERVED_MODEL_NAME, "tokens": tokens.json()["tokens"]}
            ).status_code
            == 200
        )


def test_streamed_completion_passes_through_the_check(vllm_server: RunningVllmServer) -> None:
    body = {"model": SERVED_MODEL_NAME, "prompt": "hi", "max_tokens": 4, "stream": True}
    with httpx.stream(
        "POST", f"{vllm_server.base_url}/v1/completions", json=body, headers=AUTH, timeout=60
    ) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and len(events) >= 2


@pytest.mark.parametrize("key", [""])
def test_server_with_an_empty_key_refuses_to_start(tiny_model_dir: Path, tmp_path: Path, key: str) -> None:
    """vLLM's own app build (what `vllm serve` runs before it listens) with the rendered arguments
    and VLLM_API_KEY empty, as from a Secret synced empty: it fails, so the server never listens."""
    env = {"VLLM_API_KEY": key, **pod_auth_environment(tmp_path)}
    problem = build_app_problem_with_real_vllm(server_arguments(tiny_model_dir), env)
    assert problem is not None and "refuses to start a server without an API key" in problem


def test_server_with_a_key_builds_its_app(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {"VLLM_API_KEY": API_KEY, **pod_auth_environment(tmp_path)}
    assert build_app_problem_with_real_vllm(server_arguments(tiny_model_dir), env) is None
