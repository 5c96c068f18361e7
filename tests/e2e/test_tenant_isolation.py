"""Tenant isolation on the real vLLM 0.32.0 CPU server (issue 34): each hole the issue found is a
test here, against the middleware as the ConfigMap ships it, with real PEFT adapters whose weights
differ, so which weights answered is decided by comparing temperature-0 outputs.

One server: the tiny base model (BASE) and three adapters made by PEFT with different seeds
(tests/support/tiny_lora.py): ALPHA_LORA, `text` (named like a chat content-part type, which
`validate` now refuses: the server is started directly so the middleware's own check is what is
tested) and GAMMA_LORA. Tenants: alpha may call ALPHA_LORA only, beta BASE only (at most one request
in flight), gamma `text` and GAMMA_LORA. An operator key reaches everything; runtime LoRA updating is
on, as if `validate` had been bypassed, so the load routes exist. Loopback only; stopped by pid.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from components import secrets as pod_secrets
from components import server_auth
from tests.e2e.conftest import build_tiny_adapter, healthy_vllm_server, server_arguments
from tests.e2e.test_lora import with_amx_permission
from tests.support.vllm_server import REPO_ROOT, RunningVllmServer, paused_engines

pytestmark = pytest.mark.e2e

BASE, ALPHA_LORA, TEXT_LORA, GAMMA_LORA = "tiny-base", "alpha-lora", "text", "gamma-lora"
ADAPTER_SEEDS = {ALPHA_LORA: 11, TEXT_LORA: 12, GAMMA_LORA: 13}
RANK = 8
TENANTS = {"alpha": [ALPHA_LORA], "beta": [BASE], "gamma": [TEXT_LORA, GAMMA_LORA]}
MAX_BODY_BYTES = 1024 * 1024
"""As `security.max_request_body_mib: 1` renders it (the default, 16 MiB, would make the test slow)."""
PROMPT = "def main():"
TIMEOUT_SECONDS = 120
SAGEMAKER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
BURST = 8
LONG_TOKENS = 200


@dataclass
class IsolationPod:
    server: RunningVllmServer
    keys: dict[str, str]
    operator_key: str

    def auth(self, who: str) -> dict[str, str]:
        key = self.operator_key if who == "operator" else self.keys[who]
        return {"Authorization": f"Bearer {key}"}

    def post(self, path: str, who: str, body: object, **headers: str) -> httpx.Response:
        return httpx.post(
            f"{self.server.base_url}{path}",
            headers={**self.auth(who), **headers},
            json=body,
            timeout=TIMEOUT_SECONDS,
        )


@pytest.fixture(scope="module")
def adapter_dirs(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("isolation-adapters")
    return {
        name: build_tiny_adapter(vllm_python, root / name, RANK, seed, name)
        for name, seed in ADAPTER_SEEDS.items()
    }


@pytest.fixture(scope="module")
def pod(
    tiny_model_dir: Path, adapter_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IsolationPod]:
    mount = tmp_path_factory.mktemp("isolation-configmap-mount")
    keys_dir = tmp_path_factory.mktemp("isolation-key-mount")
    (mount / server_auth.MODULE_FILE.name).write_text(server_auth.module_source())
    keys = {tenant: f"tk-{tenant}_{secrets.token_urlsafe(24)}" for tenant in TENANTS}
    document = {
        "served_names": [BASE, *ADAPTER_SEEDS],
        "tenants": {
            tenant: {
                "models": names,
                "key_prefix": f"tk-{tenant}_",
                "max_in_flight": 1 if tenant == "beta" else None,
            }
            for tenant, names in TENANTS.items()
        },
    }
    (mount / server_auth.TENANTS_FILE).write_text(json.dumps(document))
    for tenant, key in keys.items():
        (keys_dir / pod_secrets.tenant_key_file_name(tenant, 0)).write_text(key + "\n")
    operator_key = f"op-{secrets.token_urlsafe(24)}"
    (keys_dir / pod_secrets.OPERATOR_KEY_FILE).write_text(operator_key + "\n")

    args = [
        a for a in server_arguments(tiny_model_dir) if a not in server_auth.server_arguments(tenants=True)
    ]
    position = args.index("--served-model-name")
    args[position + 1] = BASE
    args += server_auth.server_arguments(tenants=True)
    args += ["--enable-lora", "--max-loras", str(len(ADAPTER_SEEDS)), "--max-lora-rank", str(RANK)]
    args += ["--lora-modules", *(f"{name}={path}" for name, path in adapter_dirs.items())]
    env = with_amx_permission(
        {
            "PYTHONPATH": os.pathsep.join([str(mount), str(REPO_ROOT)]),
            "VLLM_PLATFORM_TENANTS": str(mount / server_auth.TENANTS_FILE),
            "VLLM_PLATFORM_TENANT_MOUNT": str(keys_dir),
            "VLLM_PLATFORM_OPERATOR_KEY_FILE": str(keys_dir / pod_secrets.OPERATOR_KEY_FILE),
            "VLLM_PLATFORM_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        }
    )
    with healthy_vllm_server(
        args, env=env, log_path=tmp_path_factory.mktemp("vllm-isolation") / "vllm-serve.log"
    ) as server:
        yield IsolationPod(server, keys, operator_key)


def completion(model: str | None, **extra: object) -> dict[str, object]:
    body: dict[str, object] = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, **extra}
    if model is not None:
        body["model"] = model
    return body


def chat(model: str | None, content: object = PROMPT) -> dict[str, object]:
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 12,
        "temperature": 0,
    }
    if model is not None:
        body["model"] = model
    return body


def text_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text


@pytest.fixture(scope="module")
def reference(pod: IsolationPod) -> dict[str, str]:
    """What each name's weights answer at temperature 0 (asked with the operator key)."""
    answers = {
        name: text_of(pod.post("/v1/completions", "operator", completion(name)))
        for name in (BASE, *ADAPTER_SEEDS)
    }
    assert len(set(answers.values())) == len(answers), f"adapters must answer differently: {answers}"
    return answers


# Hole 1: an empty or absent model is vLLM's default, the base, on every generating route.
GENERATING_BODIES: dict[str, object] = {
    "/v1/completions": completion(""),
    "/v1/chat/completions": chat(""),
    "/v1/responses": {"model": "", "input": PROMPT, "max_output_tokens": 12, "temperature": 0},
    "/v1/chat/completions/batch": {"model": "", "messages": [[{"role": "user", "content": PROMPT}]]},
    "/invocations": completion(""),
    "/inference/v1/generate": {"model": "", "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}},
}


@pytest.mark.parametrize("path", sorted(GENERATING_BODIES))
def test_an_empty_model_name_is_the_base_and_alpha_may_not_use_it(pod: IsolationPod, path: str) -> None:
    body = dict(GENERATING_BODIES[path])  # type: ignore[call-overload]
    refused(pod.post(path, "alpha", body), 403, "model_not_allowed")
    body.pop("model")
    refused(pod.post(path, "alpha", body), 403, "model_not_allowed")


def test_beta_gets_the_base_for_an_empty_name_as_vllm_decides(
    pod: IsolationPod, reference: dict[str, str]
) -> None:
    assert text_of(pod.post("/v1/completions", "beta", completion(""))) == reference[BASE]


def test_a_model_named_twice_is_served_and_judged_by_its_last_copy(
    pod: IsolationPod, reference: dict[str, str]
) -> None:
    """The middleware parses as vLLM does (json.loads: the last copy of a key wins), so a name hidden
    in a first copy is neither what it judges nor what vLLM serves."""

    def raw(who: str, first: str, last: str) -> httpx.Response:
        body = json.dumps(completion(last))[:-1] + f', "model": {json.dumps(last)}}}'
        body = body.replace(f'"model": {json.dumps(last)}', f'"model": {json.dumps(first)}', 1)
        assert body.count('"model"') == 2, body
        return httpx.post(
            f"{pod.server.base_url}/v1/completions",
            headers={**pod.auth(who), "Content-Type": "application/json"},
            content=body.encode(),
            timeout=TIMEOUT_SECONDS,
        )

    refused(raw("alpha", ALPHA_LORA, GAMMA_LORA), 403, "model_not_allowed")
    assert text_of(raw("alpha", GAMMA_LORA, ALPHA_LORA)) == reference[ALPHA_LORA]


# Hole 2: /invocations serves the adapter its header names, not the body's model.
def test_invocations_are_judged_by_the_adapter_header(pod: IsolationPod, reference: dict[str, str]) -> None:
    stolen = pod.post("/invocations", "alpha", completion(ALPHA_LORA), **{SAGEMAKER_HEADER: GAMMA_LORA})
    refused(stolen, 403, "model_not_allowed")
    # The header decides what vLLM serves: gamma naming alpha's adapter in the body gets its own.
    own = pod.post("/invocations", "gamma", completion(ALPHA_LORA), **{SAGEMAKER_HEADER: GAMMA_LORA})
    assert text_of(own) == reference[GAMMA_LORA]
    # Without the header vLLM serves its default whatever the body names: the base, not alpha's.
    refused(pod.post("/invocations", "alpha", completion(ALPHA_LORA)), 403, "model_not_allowed")
    assert (
        text_of(pod.post("/invocations", "alpha", completion(""), **{SAGEMAKER_HEADER: ALPHA_LORA}))
        == (reference[ALPHA_LORA])
    )


# Hole 3: an adapter named like a content-part type answers chat requests for the base.
def test_a_text_part_does_not_hand_beta_gammas_adapter_named_text(pod: IsolationPod) -> None:
    parts = [{"type": "text", "text": PROMPT}]
    refused(pod.post("/v1/chat/completions", "beta", chat(BASE, parts)), 403, "model_not_allowed")
    # What vLLM does with it (asked with the operator key): the adapter `text` answers, not the base.
    via_part = text_of(pod.post("/v1/chat/completions", "operator", chat(BASE, parts)))
    assert via_part == text_of(pod.post("/v1/chat/completions", "operator", chat(TEXT_LORA)))
    assert via_part != text_of(pod.post("/v1/chat/completions", "operator", chat(BASE)))
    assert pod.post("/v1/chat/completions", "beta", chat(BASE)).status_code == 200


# Hole 4: runtime loading hands a tenant the others' adapters; only the operator reaches it.
def test_no_tenant_loads_replaces_or_unloads_an_adapter(
    pod: IsolationPod, adapter_dirs: dict[str, Path]
) -> None:
    load = {"lora_name": "alpha-copy-of-gamma", "lora_path": str(adapter_dirs[GAMMA_LORA])}
    inplace = {"lora_name": ALPHA_LORA, "lora_path": str(adapter_dirs[GAMMA_LORA]), "load_inplace": True}
    for tenant in TENANTS:
        refused(pod.post("/v1/load_lora_adapter", tenant, load), 403, "operator_route")
        refused(pod.post("/v1/load_lora_adapter", tenant, inplace), 403, "operator_route")
        refused(pod.post("/v1/unload_lora_adapter", tenant, {"lora_name": GAMMA_LORA}), 403, "operator_route")
        sagemaker_load = {"name": "x", "src": str(adapter_dirs[GAMMA_LORA])}
        refused(pod.post("/adapters", tenant, sagemaker_load), 403, "operator_route")
    # The routes are there: the operator's load works, and the new name is nobody's to call.
    assert pod.post("/v1/load_lora_adapter", "operator", load).status_code == 200
    refused(pod.post("/v1/completions", "alpha", completion("alpha-copy-of-gamma")), 404, "model_not_found")


# Hole 5: admin and operations routes without the operator key.
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/scale_elastic_ep", {"new_data_parallel_size": 2}),
        ("/inference/v1/abort_requests", {"request_ids": ["someone-elses-request"]}),
        ("/abort_requests", {"request_ids": ["someone-elses-request"]}),
        ("/start_profile", {}),
    ],
)
def test_admin_routes_need_the_operator_key(pod: IsolationPod, path: str, body: object) -> None:
    for tenant in TENANTS:
        refused(pod.post(path, tenant, body), 403, "operator_route")
    document = f"{pod.server.base_url}/openapi.json"
    assert httpx.get(document, headers=pod.auth("alpha"), timeout=30).status_code == 403
    assert httpx.get(document, headers=pod.auth("operator"), timeout=30).status_code == 200


def test_a_200000_deep_json_body_gets_400_not_a_500(pod: IsolationPod) -> None:
    depth = 200_000
    deep = b'{"model": "alpha-lora", "prompt": ' + b"[" * depth + b"]" * depth + b"}"
    for who in ("alpha", "operator"):
        response = httpx.post(
            f"{pod.server.base_url}/v1/completions",
            headers={**pod.auth(who), "Content-Type": "application/json"},
            content=deep,
            timeout=TIMEOUT_SECONDS,
        )
        refused(response, 400, "invalid_json")


def test_a_body_past_the_limit_gets_413(pod: IsolationPod) -> None:
    big = completion(ALPHA_LORA, prompt="x" * (MAX_BODY_BYTES + 1))
    refused(pod.post("/v1/completions", "alpha", big), 413, "request_too_large")
    assert pod.post("/v1/completions", "alpha", completion(ALPHA_LORA)).status_code == 200


def burst(pod: IsolationPod, who: str, model: str) -> list[httpx.Response]:
    """BURST requests released together (a barrier), each long enough (LONG_TOKENS, ignore_eos) that
    they overlap in the server whatever the thread scheduling."""
    barrier = threading.Barrier(BURST)

    def one(_: int) -> httpx.Response:
        barrier.wait(timeout=30)
        return pod.post("/v1/completions", who, completion(model, max_tokens=LONG_TOKENS, ignore_eos=True))

    with ThreadPoolExecutor(max_workers=BURST) as pool:
        return list(pool.map(one, range(BURST)))


def test_a_tenant_past_its_in_flight_share_gets_429_with_retry_after(pod: IsolationPod) -> None:
    # Beta's share is one request in flight. The engine is paused (SIGSTOP) so that beta's first
    # request stays in flight whatever the machine's speed (a burst of overlapping requests all passed
    # on a CI run of 2026-12-05: each was done before the next began), and the middleware's own gauge
    # says when it holds the share; the second is refused by the middleware, which needs no engine.
    def beta_in_flight() -> float:
        for line in httpx.get(f"{pod.server.base_url}/metrics", timeout=30).text.splitlines():
            if line.startswith('vllm_platform_tenant_requests_in_flight{tenant="beta"}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    with ThreadPoolExecutor(max_workers=1) as pool:
        with paused_engines(pod.server):
            first = pool.submit(pod.post, "/v1/completions", "beta", completion(BASE))
            deadline = time.monotonic() + 60
            while beta_in_flight() < 1:
                assert time.monotonic() < deadline, "beta's first request was not in flight within 60 s"
                time.sleep(0.2)
            answer = pod.post("/v1/completions", "beta", completion(BASE))
            refused(answer, 429, "rate_limit_exceeded")
            assert answer.headers["retry-after"] == "1"
        assert first.result(timeout=TIMEOUT_SECONDS).status_code == 200
    # The share was given back: beta's next request passes.
    assert pod.post("/v1/completions", "beta", completion(BASE)).status_code == 200
    # Alpha has no limit: the same burst all passes.
    assert [answer.status_code for answer in burst(pod, "alpha", ALPHA_LORA)] == [200] * BURST
