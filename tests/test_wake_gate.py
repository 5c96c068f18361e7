"""The wake gate (router/wake_gate.py, issue 40): who may reach a to-zero model's hold, with which
keys, and how the prod stack renders it. The gate in front of the real vllm-router and a real vLLM
pod, at zero and awake, is tests/e2e/test_scale_to_zero.py."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from components import router_layout, router_sidecars, secrets, server_auth
from domain import key_files
from domain.config.tenants import tenants_on
from domain.labels import ROUTER_NAMESPACE
from domain.service_accounts import ROUTER_SERVICE_ACCOUNT
from infra.render import RenderResult
from infra.stack_checks import load_stack
from router.wake_gate import Caller, GatedModel, KeyRing, gate_config, model_list, refusal
from tests.conftest import rendered
from tests.test_aws_layer import PLACEHOLDER_ACCOUNT_ID, inline_policy, irsa_roles

INFERENCE = frozenset(server_auth.inference_routes())
BASE, ADAPTER = "Qwen/Qwen2.5-7B-Instruct", "qwen-sql"
SEARCH = Caller("search", ("search.key0",), frozenset({BASE, ADAPTER}), "tk-search_")
ADAPTER_ONLY = Caller("analytics", ("analytics.key0",), frozenset({ADAPTER}), "tk-analytics_")
OPERATOR = Caller("operator", ("platform-operator.key",), frozenset({BASE, ADAPTER}), None, every_route=True)
MODEL = GatedModel(
    "qwen", 8202, "http://127.0.0.1:8102", (BASE, ADAPTER), (SEARCH, ADAPTER_ONLY, OPERATOR), 636
)


def body(**fields: Any) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], **fields}).encode()


def decide(
    caller: Caller | None, payload: bytes, path: str = "/v1/chat/completions", method: str = "POST"
) -> Any:
    refused = refusal(MODEL, caller, method, path, "application/json", payload, INFERENCE)
    return None if refused is None else (refused.status, refused.code)


def test_only_a_known_key_naming_a_served_name_it_may_use_passes() -> None:
    assert decide(None, body(model=BASE)) == (401, "invalid_api_key")
    assert decide(SEARCH, body(model=BASE)) is None
    assert decide(SEARCH, body(model=ADAPTER)) is None
    # An empty or absent `model` is vLLM's default, the base model.
    assert decide(SEARCH, body()) is None
    assert decide(ADAPTER_ONLY, body()) == (403, "model_not_allowed")
    assert decide(ADAPTER_ONLY, body(model=BASE)) == (403, "model_not_allowed")
    assert decide(ADAPTER_ONLY, body(model=ADAPTER)) is None
    # A name the model does not serve (the front spreads unknown names over its workers).
    assert decide(SEARCH, body(model="no-such-model")) == (404, "model_not_found")


def test_a_tenant_key_reaches_only_the_inference_routes_as_on_the_pod() -> None:
    assert decide(SEARCH, body(model=BASE), path="/v1/completions") is None
    assert decide(SEARCH, body(model=BASE), path="/v1/load_lora_adapter") == (403, "operator_route")
    assert decide(SEARCH, b"", path="/v1/chat/completions", method="GET") == (403, "operator_route")
    assert decide(OPERATOR, body(model=BASE), path="/v1/load_lora_adapter") is None


def test_bodies_the_gate_cannot_read_pass_only_for_a_key_on_every_served_name() -> None:
    multipart = b"--x\r\nContent-Disposition: form-data; name=model\r\n\r\nqwen-sql\r\n--x--"
    assert (
        refusal(
            MODEL,
            SEARCH,
            "POST",
            "/v1/audio/transcriptions",
            "multipart/form-data; boundary=x",
            multipart,
            INFERENCE,
        )
        is None
    )
    refused = refusal(
        MODEL,
        ADAPTER_ONLY,
        "POST",
        "/v1/audio/transcriptions",
        "multipart/form-data; boundary=x",
        multipart,
        INFERENCE,
    )
    assert refused is not None and refused.status == 403
    assert decide(SEARCH, b"{not json") == (400, "invalid_json")
    assert decide(SEARCH, b"[1]") == (400, "invalid_request")
    assert decide(SEARCH, json.dumps({"model": 7}).encode()) == (400, "invalid_request")


def test_the_model_list_holds_the_callers_names_and_never_asks_the_model() -> None:
    assert model_list(MODEL, ADAPTER_ONLY)["data"] == [
        {"id": ADAPTER, "object": "model", "created": 0, "owned_by": "vllm", "parent": BASE}
    ]
    assert [entry["id"] for entry in model_list(MODEL, SEARCH)["data"]] == [BASE, ADAPTER]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_rotated_or_revoked_key_takes_effect_without_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    ring = KeyRing(tmp_path, MODEL.callers, clock=clock)
    (tmp_path / "search.key0").write_text("tk-search_old\n")
    assert ring.caller_for(b"tk-search_old") == SEARCH
    # The CSI driver rewrites the file on rotation: the new key within a second, the old one no more.
    (tmp_path / "search.key0").write_text("tk-search_new\n")
    clock.now += 1.0
    assert ring.caller_for(b"tk-search_new") == SEARCH
    assert ring.caller_for(b"tk-search_old") is None
    # An emptied store entry revokes; a key without its tenant's prefix is ignored, as on the pod.
    (tmp_path / "search.key0").write_text("")
    (tmp_path / "analytics.key0").write_text("no-prefix-key\n")
    clock.now += 1.0
    assert ring.caller_for(b"tk-search_new") is None
    assert ring.caller_for(b"no-prefix-key") is None
    assert ring.caller_for(None) is None


def test_keys_are_re_read_at_most_once_a_second(tmp_path: Path) -> None:
    clock = Clock()
    ring = KeyRing(tmp_path, MODEL.callers, clock=clock)
    (tmp_path / "search.key0").write_text("tk-search_a")
    assert ring.caller_for(b"tk-search_a") == SEARCH
    (tmp_path / "search.key0").write_text("tk-search_b")
    clock.now += 0.5
    assert ring.caller_for(b"tk-search_b") is None  # the reading of half a second ago still holds
    clock.now += 0.5
    assert ring.caller_for(b"tk-search_b") == SEARCH


# --- as the prod stack renders it -------------------------------------------------------------------


@pytest.fixture(scope="module")
def prod() -> RenderResult:
    return rendered("prod")


def router_objects(render: RenderResult, kind: str) -> list[dict[str, Any]]:
    return render.find(kind, namespace=ROUTER_NAMESPACE)


def gate_config_of(render: RenderResult) -> dict[str, Any]:
    (config_map,) = router_objects(render, "ConfigMap")
    config: dict[str, Any] = json.loads(config_map["data"][router_layout.WAKE_GATE_CONFIG_FILE])
    return config


def test_the_gate_accepts_exactly_whom_the_models_pods_accept(prod: RenderResult) -> None:
    config = load_stack("prod")
    raw = gate_config_of(prod)
    parsed = gate_config(raw)
    (gated,) = parsed.models
    (model,) = [m for m in config.models if m.scales_to_zero]
    assert gated.model == model.name
    # The pod's own tenants file and key files (components/server_auth.py, components/secrets.py).
    (pod_auth,) = prod.find("ConfigMap", name=server_auth.CONFIG_MAP_NAME, namespace=model.namespace)
    tenants = json.loads(pod_auth["data"][server_auth.TENANTS_FILE])
    assert list(gated.served_names) == tenants["served_names"]
    assert {c.name: (sorted(c.models), c.key_prefix) for c in gated.callers} == {
        name: (sorted(t["models"]), t["key_prefix"]) for name, t in tenants["tenants"].items()
    }
    pod_files = {f.file for f in secrets.tenant_key_files(config, model)}
    assert {file for c in gated.callers for file in c.files} == pod_files
    assert parsed.inference_routes == INFERENCE
    # Past the hold: Retry-After is the predicted wake (`vllm-platform plan`: 636 s on a new node).
    from domain.capacity.plan import plan_model

    assert gated.retry_after_seconds == math.ceil(
        plan_model(model, config, model.gpu_group).wake.expected_seconds
    )
    assert (
        gated.model_router_url
        == f"http://127.0.0.1:{router_layout.model_router_port(config.models.index(model))}"
    )


def test_the_front_routes_the_to_zero_model_through_its_gate_and_the_rest_direct(prod: RenderResult) -> None:
    (config_map,) = router_objects(prod, "ConfigMap")
    workers = json.loads(config_map["data"][router_layout.REGISTRAR_CONFIG_FILE])["workers"]
    ports = {m["model_router_url"]: m["port"] for m in gate_config_of(prod)["models"]}
    for worker in workers:
        if worker["scale_to_zero"]:
            assert worker["front_url"] == f"http://127.0.0.1:{ports[worker['url']]}"
        else:
            assert "front_url" not in worker


def test_only_the_gate_container_mounts_the_keys_from_the_store(prod: RenderResult) -> None:
    (deployment,) = router_objects(prod, "Deployment")
    template = deployment["spec"]["template"]
    spec = template["spec"]
    mounting = {
        c["name"]
        for c in spec["containers"]
        for mount in c.get("volumeMounts", [])
        if mount["name"] == router_layout.ROUTER_KEYS_VOLUME
    }
    assert mounting == {router_layout.WAKE_GATE_CONTAINER}
    (volume,) = [v for v in spec["volumes"] if v["name"] == router_layout.ROUTER_KEYS_VOLUME]
    assert volume["csi"]["volumeAttributes"] == {
        "secretProviderClass": router_layout.ROUTER_KEYS_PROVIDER_CLASS
    }
    # No container gets the account's AWS credentials (the CSI driver requests its own token).
    skipped = template["metadata"]["annotations"]["eks.amazonaws.com/skip-containers"].split(",")
    assert sorted(skipped) == sorted(c["name"] for c in spec["containers"])
    # A changed sidecar config rolls the pods (they read it once, at start).
    (config_map,) = router_objects(prod, "ConfigMap")
    assert template["metadata"]["annotations"][router_layout.REGISTRAR_CONFIG_CHECKSUM_ANNOTATION] == (
        router_sidecars.registrar_config_checksum(load_stack("prod"))
    )
    assert "wake-gate.json" in config_map["data"]
    gate = next(c for c in spec["containers"] if c["name"] == router_layout.WAKE_GATE_CONTAINER)
    assert gate["command"][:2] == ["python", router_layout.WAKE_GATE_SCRIPT]
    assert "/liveness" in gate["livenessProbe"]["exec"]["command"][-1]  # it listens on 127.0.0.1
    assert "readinessProbe" not in gate  # a model at zero never takes the router pod out of service


def test_the_router_reads_only_the_to_zero_models_keys(prod: RenderResult) -> None:
    config = load_stack("prod")
    (model,) = [m for m in config.models if m.scales_to_zero]
    expected = sorted({ref.name for tenant in tenants_on(config, model) for ref in tenant.api_key_secrets})
    (provider_class,) = router_objects(prod, "SecretProviderClass")
    assert provider_class["metadata"]["name"] == router_layout.ROUTER_KEYS_PROVIDER_CLASS
    objects = json.dumps(provider_class["spec"])
    assert all(name in objects for name in expected)
    others = {ref.name for t in config.tenants for ref in t.api_key_secrets} - set(expected)
    assert others and not any(name in objects for name in others)
    policy = inline_policy(prod, irsa_roles(prod)[ROUTER_SERVICE_ACCOUNT.key]["_name"])
    (statement,) = policy["Statement"]
    assert statement["Action"] == ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]
    assert statement["Resource"] == [
        f"arn:aws:secretsmanager:us-east-1:{PLACEHOLDER_ACCOUNT_ID}:secret:{name}-??????" for name in expected
    ]
    (account,) = [a for a in router_objects(prod, "ServiceAccount") if a["metadata"]["name"] == "vllm-router"]
    assert "eks.amazonaws.com/role-arn" in account["metadata"]["annotations"]


def test_without_a_to_zero_model_there_is_no_gate_and_no_key_in_the_router_pod() -> None:
    dev = rendered("dev")
    config = load_stack("dev")
    assert config.router.enabled and not any(m.scales_to_zero for m in config.models)
    (deployment,) = router_objects(dev, "Deployment")
    names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert router_layout.WAKE_GATE_CONTAINER not in names
    assert router_objects(dev, "SecretProviderClass") == []
    assert ROUTER_SERVICE_ACCOUNT.key not in irsa_roles(dev)


def test_without_tenants_the_gate_checks_the_models_own_key() -> None:
    config = load_stack("prod")
    (index, model) = next((i, m) for i, m in enumerate(config.models) if m.scales_to_zero)
    ref = config.tenants[0].api_key_secrets[0].model_copy(update={"name": "vllm-platform/prod/qwen/api-key"})
    models = list(config.models)
    models[index] = model.model_copy(update={"api_key_secret": ref})
    untenanted = config.model_copy(update={"tenants": [], "models": models})
    (gated,) = router_sidecars.wake_gate_config(untenanted)["models"]
    assert gated["callers"] == [
        {"name": "model key", "files": [f"{model.name}.api-key"], "models": untenanted.served_names(model)}
    ]
    assert [(f.file, f.ref.name) for f in key_files.wake_gate_key_files(untenanted)] == [
        (f"{model.name}.api-key", "vllm-platform/prod/qwen/api-key")
    ]


def test_the_gate_answers_over_http_without_reaching_the_model_router(tmp_path: Path) -> None:
    """The handler end to end on loopback: refusals in OpenAI's shape at once, `/v1/models` from the
    keys, and a valid request forwarded (here to a port nobody listens on: 502, never a hang)."""
    import threading

    import httpx

    from router.wake_gate import GateConfig, GateServer
    from tests.support.vllm_server import free_port

    (tmp_path / "search.key0").write_text("tk-search_good\n")
    model = GatedModel(
        "qwen", 0, f"http://127.0.0.1:{free_port('127.0.0.1')}", (BASE, ADAPTER), (SEARCH,), 636
    )
    config = GateConfig(
        tmp_path, (model,), max_body_bytes=1024, upstream_timeout_seconds=5, inference_routes=INFERENCE
    )
    server = GateServer(("127.0.0.1", 0), model, config, KeyRing(tmp_path, model.callers))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    good = {"Authorization": "Bearer tk-search_good"}
    try:
        with httpx.Client(base_url=url, timeout=10) as client:
            refused = client.post("/v1/chat/completions", json={"model": BASE})
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            assert refused.json()["error"]["code"] == "invalid_api_key"
            unknown = client.post("/v1/chat/completions", headers=good, json={"model": "nope"})
            assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")
            too_large = client.post("/v1/chat/completions", headers=good, content=b"{" + b" " * 2048 + b"}")
            assert too_large.status_code == 413
            listed = client.get("/v1/models", headers=good)
            assert [e["id"] for e in listed.json()["data"]] == [BASE, ADAPTER]
            assert client.get("/liveness").status_code == 200
            forwarded = client.post("/v1/chat/completions", headers=good, json={"model": BASE})
            assert forwarded.status_code == 502
            # The CSI driver rewrites the file on rotation: the running gate follows within a second.
            (tmp_path / "search.key0").write_text("tk-search_rotated\n")
            time.sleep(1.1)
            assert client.get("/v1/models", headers=good).status_code == 401
            rotated = {"Authorization": "Bearer tk-search_rotated"}
            assert client.get("/v1/models", headers=rotated).status_code == 200
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_the_gate_refuses_every_non_canonical_path_even_for_the_operator(tmp_path: Path) -> None:
    """Issue 49: the model's router (vllm-router) normalises what it forwards, so a dot-segment the
    gate passed on would reach its worker API. Every NON_CANONICAL target of the corpus gets 400 for
    any method, even with the operator key (which passes every route), and nothing reaches the model
    router; a canonical unknown route with the operator key is forwarded unchanged."""
    import threading

    from router.wake_gate import GateConfig, GateServer
    from tests.path_tricks import CANONICAL_UNKNOWN, METHODS, NON_CANONICAL
    from tests.support.recording_server import start_recording_server
    from tests.support.vllm_router import raw_request

    upstream = start_recording_server()
    (tmp_path / "platform-operator.key").write_text("operator-key\n")
    model = GatedModel("qwen", 0, upstream.url, (BASE, ADAPTER), (OPERATOR,), 636)
    config = GateConfig(
        tmp_path, (model,), max_body_bytes=1024, upstream_timeout_seconds=5, inference_routes=INFERENCE
    )
    gate = GateServer(("127.0.0.1", 0), model, config, KeyRing(tmp_path, model.callers))
    threading.Thread(target=gate.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{gate.server_port}"
    operator = {"Authorization": "Bearer operator-key"}
    try:
        wrong = [
            (method, target, status)
            for target in NON_CANONICAL
            for method in METHODS
            if (status := raw_request(url, method, target, headers=operator, body=b"{}")[0]) != 400
        ]
        assert not wrong, wrong[:10]
        assert upstream.seen == []
        for target in CANONICAL_UNKNOWN:
            assert raw_request(url, "GET", target, headers=operator)[0] == 200
        assert upstream.seen == [("GET", target) for target in CANONICAL_UNKNOWN]
    finally:
        gate.shutdown()
        gate.server_close()
        upstream.stop()
