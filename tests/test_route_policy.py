"""The middleware's route policy against the pinned vLLM's route table (issue 34): every route the
snapshot (infra/data/vllm-0.32.0-routes.json, scripts/snapshot-vllm-routes.py) holds is classified,
so a route a new vLLM adds fails here until someone decides who may call it."""

from __future__ import annotations

import json

from components import server_auth
from domain.versions import VLLM_VERSION
from tests.conftest import REPO_ROOT

ROUTES_FILE = REPO_ROOT / "infra" / "data" / f"vllm-{VLLM_VERSION}-routes.json"


def snapshot_routes() -> dict[str, set[str]]:
    snapshot = json.loads(ROUTES_FILE.read_text())
    assert snapshot["vllm_version"] == VLLM_VERSION
    return {route["path"]: set(route["methods"]) for route in snapshot["routes"]}


def unclassified(routes: dict[str, set[str]], policy: dict[str, str]) -> list[str]:
    return sorted(path for path in routes if path not in policy)


def test_every_route_of_the_pinned_vllm_is_classified() -> None:
    routes = snapshot_routes()
    assert len(routes) > 60, "the snapshot lost most of vLLM's routes: regenerate it"
    assert unclassified(routes, server_auth.route_policy()) == [], (
        "vLLM has routes the middleware's policy does not classify: add each to INFERENCE_ROUTES (with "
        "how vLLM picks its served name) or OPERATOR_ROUTES in components/pod_files/vllm_platform_auth.py"
    )


def test_a_route_a_new_vllm_adds_is_reported_until_classified() -> None:
    routes = {**snapshot_routes(), "/v1/some_new_admin_route": {"POST"}}
    assert unclassified(routes, server_auth.route_policy()) == ["/v1/some_new_admin_route"]


def test_the_policy_names_no_route_the_pinned_vllm_does_not_have() -> None:
    # (`/metrics/`, the mount's other spelling, was one: not a canonical path, refused since issue 49.)
    stale = set(server_auth.route_policy()) - set(snapshot_routes())
    assert stale == set()


def test_each_class_matches_how_vllm_serves_the_route() -> None:
    routes, policy = snapshot_routes(), server_auth.route_policy()
    for path, kind in policy.items():
        methods = routes.get(path, {"MOUNT"})
        if kind == "inference":
            assert "POST" in methods, path  # the middleware passes inference routes on POST only
        elif kind == "websocket":
            assert methods == {"WEBSOCKET"}, path
        elif kind in ("open", "models"):
            assert methods & {"GET", "MOUNT"}, path


def test_the_routes_the_review_found_open_to_tenants_need_the_operator_key() -> None:
    policy = server_auth.route_policy()
    for path in (
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/adapters",
        "/adapters/{adapter_name}",
        "/scale_elastic_ep",
        "/inference/v1/abort_requests",
        "/abort_requests",
        "/collective_rpc",
        "/update_weights",
        "/start_profile",
        "/sleep",
    ):
        assert policy[path] == "operator", path
    assert {path for path, kind in policy.items() if kind == "open"} == {"/health", "/metrics"}
    assert {path for path, kind in policy.items() if kind == "models"} == {"/v1/models"}
