"""The router pod's door (components/router_door.py, issue 49), checked with the real nginx (Debian's
nginx-light at the pinned version) running each shipped stack's rendered door.conf on loopback in
front of two recording servers that stand where the front and the registrar's models server are:
what is forwarded, unchanged, and what is answered at the door. The chain with the real vllm-router
and vLLM is tests/e2e/test_router_door.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from components import router_door
from components.router import ROUTER_NAMESPACE
from domain.versions import NGINX_DEBIAN_VERSION
from tests.conftest import rendered
from tests.path_tricks import CANONICAL_UNKNOWN, METHODS, NON_CANONICAL, WITH_QUERY
from tests.support.recording_server import RecordingServer, start_recording_server
from tests.support.vllm_router import RunningDoor, raw_request, start_door, stop_door
from tests.support.vllm_server import REPO_ROOT

ROUTED_STACKS = ("dev", "prod", "multinode")
"""The shipped stacks with `router.enabled` (staging has none)."""


def rendered_door_conf(stack: str) -> str:
    (config_map,) = rendered(stack).find("ConfigMap", namespace=ROUTER_NAMESPACE)
    conf: str = config_map["data"][router_door.DOOR_CONFIG_FILE]
    return conf


def test_the_image_and_the_suite_install_the_pinned_nginx() -> None:
    dockerfile = (REPO_ROOT / "router" / "Dockerfile").read_text()
    assert f"ARG NGINX_DEBIAN_VERSION={NGINX_DEBIAN_VERSION}\n" in dockerfile
    assert '"nginx-light=${NGINX_DEBIAN_VERSION}"' in dockerfile
    installed = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "nginx-light"], capture_output=True, text=True, check=False
    )
    assert installed.stdout == NGINX_DEBIAN_VERSION, "run scripts/setup-test-tools.sh"


@pytest.mark.parametrize("stack", ROUTED_STACKS)
def test_nginx_accepts_every_shipped_stacks_door_config(stack: str, tmp_path: Path) -> None:
    conf = rendered_door_conf(stack).replace(router_door.DOOR_TMP_PATH, str(tmp_path))
    (tmp_path / "door.conf").write_text(conf)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    checked = subprocess.run(
        [nginx, "-t", "-e", "stderr", "-c", str(tmp_path / "door.conf")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr


@dataclass(frozen=True)
class Door:
    door: RunningDoor
    front: RecordingServer
    models: RecordingServer


@pytest.fixture(scope="module")
def prod_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    front, models = start_recording_server(), start_recording_server()
    door = start_door(
        rendered_door_conf("prod"),
        front_url=front.url,
        models_url=models.url,
        directory=tmp_path_factory.mktemp("door"),
    )
    try:
        yield Door(door, front, models)
    finally:
        stop_door(door)
        front.stop()
        models.stop()


def test_the_door_forwards_exactly_its_routes_as_written(prod_door: Door) -> None:
    prod_door.front.seen.clear()
    prod_door.models.seen.clear()
    routes = router_door.public_inference_routes()
    for route in routes:
        assert raw_request(prod_door.door.base_url, "POST", route, body=b"{}")[0] == 200, route
    for target in ("/v1/models", "/v1/models/Qwen/Qwen2.5-7B-Instruct", "/v1/models/qwen-sql"):
        assert raw_request(prod_door.door.base_url, "GET", target)[0] == 200, target
    assert raw_request(prod_door.door.base_url, "GET", "/readiness")[0] == 200
    assert prod_door.front.seen == [*(("POST", route) for route in routes), ("GET", "/readiness")]
    assert prod_door.models.seen == [
        ("GET", "/v1/models"),
        ("GET", "/v1/models/Qwen/Qwen2.5-7B-Instruct"),
        ("GET", "/v1/models/qwen-sql"),
    ]
    # Every route the load balancer sent to the front before is still forwarded: the pod's
    # inference routes under /v1 (the Ingress routes only /v1).
    assert "/v1/chat/completions" in routes and "/v1/completions" in routes and "/v1/embeddings" in routes
    assert all(route.startswith("/v1/") for route in routes)


def test_the_door_answers_every_trick_itself(prod_door: Door) -> None:
    prod_door.front.seen.clear()
    prod_door.models.seen.clear()
    expected = [(t, 400) for t in (*NON_CANONICAL, *WITH_QUERY)] + [(t, 404) for t in CANONICAL_UNKNOWN]
    wrong = [
        (method, target, status)
        for target, want in expected
        for method in METHODS
        if (status := raw_request(prod_door.door.base_url, method, target, body=b"{}")[0]) != want
    ]
    assert not wrong, f"{len(wrong)} of {len(expected) * len(METHODS)}: {wrong[:10]}"
    assert prod_door.front.seen == [] and prod_door.models.seen == []


def test_a_route_under_another_method_is_refused_with_405(prod_door: Door) -> None:
    for method, target in (
        ("GET", "/v1/completions"),
        ("DELETE", "/v1/chat/completions"),
        ("POST", "/v1/models"),
    ):
        status, body = raw_request(prod_door.door.base_url, method, target)
        assert status == 405 and b'"method_not_allowed"' in body, (method, target, status)


def test_a_body_past_the_stacks_limit_is_refused_before_it_is_read(prod_door: Door) -> None:
    limit = 16 * 1024 * 1024  # prod's security.max_request_body_mib
    status, body = raw_request(
        prod_door.door.base_url,
        "POST",
        "/v1/completions",
        headers={"Content-Length": str(limit + 1)},
        body=b"",
    )
    assert status == 413 and b'"request_too_large"' in body
    conf = rendered_door_conf("prod")
    assert re.search(rf"client_max_body_size {limit};", conf)
