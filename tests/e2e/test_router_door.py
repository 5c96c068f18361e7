"""The router pod's front door (issue 49): nginx with the rendered door.conf in front of the pinned
vllm-router 0.1.17, a path-trick corpus of our own, and no way to a worker API.

As in a prod router pod (components/router.py, components/router_door.py), all on loopback:

    client ──► door (nginx, prod's door.conf) ──► front (prod's front args)
                 │                                  ├─► AWAKE's router ───────────────► vLLM (CPU)
                 │                                  └─► SLEEPER's wake gate ─► SLEEPER's router (no
                 │                                                             worker: a model at zero)
                 └─ /v1/models ──► the registrar's models server over both

AWAKE is the session's vLLM server (its served name, its key); SLEEPER is prod's to-zero model with
its rendered wake gate and hold flags (one attempt, so a request that reached its hold would be
answered at once and counted, never held for the test's length). The front's workers are registered
by the registrar's own `reconcile`. Every loop is bounded; every server is stopped by its pid.

The corpus (tests/path_tricks.py) is written by hand with the verdict each target must get. The
control test shows that it has teeth: sent to the front itself, bypassing the door, dot-segments
reach a model router's worker API (finding 17 as the probe found it); through the door, none does.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from components import secrets as pod_secrets
from components.router import ROUTER_NAMESPACE
from router.registrar import RouterClient, Worker, desired_workers, reconcile
from tests.e2e.conftest import API_KEY, SERVED_MODEL_NAME
from tests.e2e.test_router import loopback_arguments, rendered_router_containers
from tests.path_tricks import (
    ABSOLUTE_FORM_WORKER_API,
    CANONICAL_UNKNOWN,
    METHODS,
    NON_CANONICAL,
    TRAP_WORKER,
    WITH_QUERY,
)
from tests.support.vllm_router import (
    RouterError,
    RouterVenvMissingError,
    RunningDoor,
    RunningRouter,
    held_attempts,
    models_server,
    raw_request,
    require_router_python,
    start_door,
    start_router,
    start_wake_gate,
    stop_door,
    stop_process_group,
    stop_router,
)
from tests.support.vllm_server import RunningVllmServer

pytestmark = pytest.mark.e2e

STACK = "prod"
AWAKE = SERVED_MODEL_NAME
SLEEPER = "sleeping-model"
"""prod's to-zero model serves the name the session's vLLM server serves (the dev stack's): renamed
here in its rendered gate and registrar entries, so that the front routes the two apart."""
AUTH = {"Authorization": f"Bearer {API_KEY}"}
WORKER_API_MARKERS = (b'"workers"', b'"worker_urls"', b'"loads"', b'"total"')
"""What vllm-router 0.1.17's worker API answers carry (`GET /workers`: `{"workers": [...], "total":
...}`; `/list_workers`: `{"urls": ...}` is covered by the lists compared before and after)."""


@dataclass
class DoorPod:
    door: RunningDoor
    front: RunningRouter
    awake_router: RunningRouter
    sleeper_router: RunningRouter
    sleeper_name: str
    routers: dict[str, RunningRouter]
    workers: dict[str, Worker]
    """The front's workers as the registrar's config gives them (keyed by the URL it routes to)."""
    front_arguments: list[str]
    """The rendered front's arguments on loopback (the control starts fresh fronts from them)."""
    logs: Path


def _rendered(stack: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The router ConfigMap's files and the to-zero model's registrar entry, its served name SLEEPER."""
    from tests.conftest import rendered

    (config_map,) = rendered(stack).find("ConfigMap", namespace=ROUTER_NAMESPACE)
    data: dict[str, str] = dict(config_map["data"])
    (entry,) = [w for w in json.loads(data["registrar.json"])["workers"] if w["scale_to_zero"]]
    assert entry["served_names"] == [entry["model_id"]], "one served name, renamed whole"
    renamed = json.dumps(entry["model_id"]), json.dumps(SLEEPER)
    data["wake-gate.json"] = data["wake-gate.json"].replace(*renamed)
    return data, json.loads(json.dumps(entry).replace(*renamed))


def _one_attempt(args: list[str]) -> list[str]:
    """The rendered hold with one attempt: a request that reached it would be answered (503) and
    counted at once instead of being held for the rendered 16 minutes."""
    args = list(args)
    args[args.index("--retry-max-retries") + 1] = "1"
    return args


@pytest.fixture(scope="module")
def door_pod(vllm_server: RunningVllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DoorPod]:
    try:
        require_router_python()
    except RouterVenvMissingError as error:
        pytest.fail(str(error), pytrace=False)
    data, sleeper_entry = _rendered(STACK)
    containers = rendered_router_containers(STACK)
    sleeper_container = next(name for name in containers if name.startswith("route-") and "qwen" in name)
    awake_container = next(
        name for name in containers if name.startswith("route-") and name != sleeper_container
    )
    logs = tmp_path_factory.mktemp("door-pod")
    keys_dir = logs / "router-keys"
    keys_dir.mkdir()
    # One tenant key the sleeping model accepts (never sent here: every request below is keyless or
    # carries the awake model's key).
    from infra.stack_checks import load_stack

    tenant = next(t for t in load_stack(STACK).tenants if t.name == "search")
    key_file = keys_dir / pod_secrets.tenant_key_file_name(tenant.name, 0)
    key_file.write_text(f"{tenant.prefix}{secrets.token_urlsafe(24)}\n")
    started: list[RunningRouter] = []
    gate = door = None
    try:
        awake = start_router(
            loopback_arguments(containers[awake_container], [vllm_server.base_url]),
            log_path=logs / "awake-router.log",
        )
        started.append(awake)
        sleeper = start_router(
            loopback_arguments(_one_attempt(containers[sleeper_container])),
            log_path=logs / "sleeper-router.log",
        )
        started.append(sleeper)
        front = start_router(loopback_arguments(containers["router"]), log_path=logs / "front.log")
        started.append(front)
        gate_config = json.loads(data["wake-gate.json"])
        gate = start_wake_gate(
            gate_config,
            next(m["model"] for m in gate_config["models"] if sleeper_entry["model_id"] in m["served_names"]),
            model_router_url=sleeper.base_url,
            keys_dir=keys_dir,
            log_path=logs / "wake-gate.log",
        )
        workers = desired_workers(
            {
                "workers": [
                    {"url": awake.base_url, "model_id": AWAKE, "policy": sleeper_entry["policy"]},
                    {**sleeper_entry, "url": sleeper.base_url, "front_url": gate.base_url},
                ]
            }
        )
        reconcile(RouterClient(front.base_url), workers)
        with models_server(list(workers.values())) as models_url:
            door = start_door(
                data["door.conf"], front_url=front.base_url, models_url=models_url, directory=logs / "door"
            )
            _wait_until_routed(door, front)
            yield DoorPod(
                door,
                front,
                awake,
                sleeper,
                sleeper_entry["model_id"],
                {"front": front, "awake": awake, "sleeper": sleeper},
                workers,
                loopback_arguments(containers["router"]),
                logs,
            )
    except RouterError as error:
        pytest.fail(str(error), pytrace=False)
    finally:
        if door is not None:
            stop_door(door)
        if gate is not None:
            stop_process_group(gate.process)
        for router in started:
            stop_router(router)


def _wait_until_routed(door: RunningDoor, front: RunningRouter, timeout_seconds: float = 120) -> None:
    """Until the door's /readiness (the front's) answers 200: the front has healthy workers."""
    deadline = time.monotonic() + timeout_seconds
    status = 0
    while time.monotonic() < deadline:
        status, _ = raw_request(door.base_url, "GET", "/readiness")
        if status == 200:
            return
        time.sleep(1)
    raise AssertionError(
        f"the door's /readiness answered {status} for {timeout_seconds} s:\n{front.log_tail()}"
    )


def worker_lists(pod: DoorPod) -> dict[str, Any]:
    """Every router's worker list, read on loopback as only the registrar may."""
    return {name: httpx.get(f"{r.base_url}/workers", timeout=10).json() for name, r in pod.routers.items()}


CONTROL_FRONTS = 12
"""Fresh front processes the control may start. vllm-router 0.1.17 in multi-model mode holds a regular
and a prefill/decode router and sends a path it has no route for to one of them, chosen once per
process: through the prefill/decode one (no workers here) the answer is 503 "No available workers:
0 prefill, 0 decode" and nothing is forwarded, so the hole shows in about every other front process
(CI, 2026-12-07). The control asks fresh fronts until one forwards; 12 misses in a row would be
1 in 4,096 at even odds."""
PD_ROUTER_ANSWER = b"0 prefill, 0 decode"


def _dot_segment_answers(base_url: str) -> dict[str, tuple[int, bytes]]:
    body = json.dumps({"model": AWAKE}).encode()
    return {
        target: raw_request(base_url, "POST", target, headers={"Content-Type": "application/json"}, body=body)
        for target in ("/v1/%2e%2e/workers", "/v1/../workers", "/v1/chat/%2E%2E/%2E%2E/workers")
    }


def test_without_the_door_dot_segments_reach_a_model_routers_worker_api(door_pod: DoorPod) -> None:
    """The control: the corpus has teeth. Sent to the front itself (what the load balancer reached
    before the door), a dot-segment under /v1 comes out at the awake model's router as `/workers`:
    its add-worker handler answers (here refusing a body without `url`: nothing is added)."""
    answers = _dot_segment_answers(door_pod.front.base_url)
    seen = [answers]
    for attempt in range(CONTROL_FRONTS):
        if not all(PD_ROUTER_ANSWER in body for _, body in answers.values()):
            break
        front = start_router(
            door_pod.front_arguments, log_path=door_pod.logs / f"control-front-{attempt}.log"
        )
        try:
            reconcile(RouterClient(front.base_url), door_pod.workers)
            answers = _dot_segment_answers(front.base_url)
            seen.append(answers)
        finally:
            stop_router(front)
    reached = [answer for answer in answers.values() if b"missing field `url`" in answer[1]]
    assert len(reached) == 3, f"the front no longer forwards dot-segments to a worker API: {seen}"


def test_no_trick_through_the_door_reaches_a_worker_api_or_changes_a_worker_list(door_pod: DoorPod) -> None:
    before, demand = worker_lists(door_pod), held_attempts(door_pod.sleeper_router)
    wrong: list[tuple[str, str, int, bytes]] = []
    expected = [(t, 400) for t in (*NON_CANONICAL, *WITH_QUERY)] + [(t, 404) for t in CANONICAL_UNKNOWN]
    for target, status in expected:
        for method in METHODS:
            answer_status, body = raw_request(door_pod.door.base_url, method, target, body=b"{}")
            if answer_status != status or any(marker in body for marker in WORKER_API_MARKERS):
                wrong.append((method, target, answer_status, body[:120]))
    for target in ABSOLUTE_FORM_WORKER_API:
        for method in METHODS:
            answer_status, body = raw_request(door_pod.door.base_url, method, target, body=b"{}")
            if answer_status not in (400, 404) or any(marker in body for marker in WORKER_API_MARKERS):
                wrong.append((method, target, answer_status, body[:120]))
    assert not wrong, f"{len(wrong)} answers off the rule, e.g. {wrong[:10]}"
    # Nothing was added, removed or flushed anywhere; the trap worker is nowhere; nothing reached
    # the sleeping model's hold (no demand, so no wake).
    after = worker_lists(door_pod)
    assert after == before
    assert TRAP_WORKER not in json.dumps(after)
    assert held_attempts(door_pod.sleeper_router) == demand == 0


def test_the_door_refuses_every_trick_without_forwarding_it(door_pod: DoorPod) -> None:
    """Refused at the door, so never at the front: its request counter does not move."""

    def front_requests() -> float:
        text = httpx.get(door_pod.front.metrics_url, timeout=30).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm_router_requests_total")
        )

    before = front_requests()
    for target in (*NON_CANONICAL[:60], *WITH_QUERY, *CANONICAL_UNKNOWN):
        status, _ = raw_request(door_pod.door.base_url, "POST", target, body=b"{}")
        assert status in (400, 404), (target, status)
    assert front_requests() == before


def test_keyless_requests_for_the_awake_model_never_become_the_sleepers_demand(door_pod: DoorPod) -> None:
    demand = held_attempts(door_pod.sleeper_router)
    statuses = []
    for model in (AWAKE, door_pod.sleeper_name, "no-such-model"):
        for _ in range(10):
            status, _ = raw_request(
                door_pod.door.base_url,
                "POST",
                "/v1/completions",
                headers={"Content-Type": "application/json"},
                body=json.dumps({"model": model, "prompt": "hi", "max_tokens": 1}).encode(),
            )
            statuses.append(status)
    # vLLM's middleware (awake), the wake gate (sleeping) or whichever answers an unknown name: 401.
    assert set(statuses) == {401}, statuses
    assert held_attempts(door_pod.sleeper_router) == demand == 0


def test_the_door_serves_the_openai_api_streams_included(door_pod: DoorPod) -> None:
    base = door_pod.door.base_url
    completion = httpx.post(
        f"{base}/v1/completions",
        headers=AUTH,
        json={"model": AWAKE, "prompt": "def main():", "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["text"]
    # SSE through the door: events arrive as separate chunks, the stream ends with [DONE].
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        headers=AUTH,
        json={
            "model": AWAKE,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "stream": True,
        },
        timeout=120,
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = [line for line in stream.iter_lines() if line.startswith("data:")]
    assert len(events) >= 3 and events[-1] == "data: [DONE]"
    listed = httpx.get(f"{base}/v1/models", headers=AUTH, timeout=30)
    assert listed.status_code == 200 and AWAKE in [entry["id"] for entry in listed.json()["data"]]
    assert httpx.get(f"{base}/v1/models", timeout=30).status_code == 401


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _door_rss_bytes(door: RunningDoor) -> int:
    """nginx's master and workers together (the container's memory)."""
    pids = [door.process.pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == door.process.pid:
                    pids.append(int(entry.name))
    return sum(_rss_bytes(pid) for pid in pids)


def _send_oversized(base_url: str, size_bytes: int, chunked: bool) -> int:
    """A keyless POST of `size_bytes` of zeros (declared, or chunked), sent until the server answers or
    closes: its status (0: none)."""
    host, _, port = base_url.removeprefix("http://").partition(":")
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size_bytes}"
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n{framing}\r\n\r\n"
    piece = b"0" * (1024 * 1024)
    answer = b""
    with contextlib.closing(socket.create_connection((host, int(port)), timeout=30)) as sock:
        sock.sendall(head.encode())
        sent = 0
        with contextlib.suppress(OSError):
            while sent < size_bytes:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        with contextlib.suppress(OSError):
            sock.settimeout(30)
            while chunk := sock.recv(65536):
                answer += chunk
    line = answer.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 else 0


def test_oversized_keyless_bodies_are_refused_with_bounded_memory(door_pod: DoorPod) -> None:
    """Finding 19: two 256 MiB keyless bodies took the front to 1.8 GiB (its limit is 1 GiB). At the
    door a body past the stack's limit (16 MiB) is refused from its Content-Length, or as it arrives
    chunked, and never reaches the front; the front's own payload limit is the same."""
    front_before, door_before = _rss_bytes(door_pod.front.process.pid), _door_rss_bytes(door_pod.door)
    statuses = [
        _send_oversized(door_pod.door.base_url, 256 * 1024 * 1024, chunked) for chunked in (False, True)
    ]
    statuses += [_send_oversized(door_pod.door.base_url, 64 * 1024 * 1024, True) for _ in range(2)]
    assert statuses == [413] * 4
    grown_front = _rss_bytes(door_pod.front.process.pid) - front_before
    door_rss = _door_rss_bytes(door_pod.door)
    assert grown_front < 32 * 1024 * 1024, f"the front grew by {grown_front / 2**20:.0f} MiB"
    # The door container's limit is 256 MiB (components/router_door.py): bodies go to files, not memory.
    assert door_rss < 128 * 1024 * 1024, (
        f"nginx holds {door_rss / 2**20:.0f} MiB (was {door_before / 2**20:.0f})"
    )
    # Behind the door, the front refuses what its rendered --max-payload-size does not hold.
    assert _send_oversized(door_pod.front.base_url, 17 * 1024 * 1024, False) == 413
    assert os.path.isdir(door_pod.door.config_path.parent / "body")


def test_the_registrar_removes_a_worker_it_did_not_register(door_pod: DoorPod) -> None:
    """Only code inside the pod can reach the front's worker API now; should anything add a worker
    there, the registrar's next round (every router.registration_interval_seconds) removes it. (The
    names posted with it may still route to its URL: vllm-router 0.1.17 keeps a removed worker's
    names, docs/routing.md "Known limits"; hence the door, not this, is what keeps workers out.)"""
    front = RouterClient(door_pod.front.base_url)
    front._request(
        "POST", "/workers", {"url": TRAP_WORKER, "model_id": "stray", "labels": {"policy": "round_robin"}}
    )
    assert TRAP_WORKER in front.workers()
    _, removed = reconcile(front, door_pod.workers)
    assert removed == [TRAP_WORKER]
    assert set(front.workers()) == set(door_pod.workers)
