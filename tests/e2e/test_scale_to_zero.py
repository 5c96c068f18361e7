"""Scale to zero and back with no request lost (issue 35), end to end on loopback.

The prod stack's to-zero model (`qwen2-5-7b-tp2`, KEDA, `min_replicas: 0`) as a router pod runs it:

    client ──► front router ──► wake gate ──► the model's router (hold flags, NO worker at first) ──► vLLM
                                        │ /metrics (PodMonitor labels)
                                        ▼
                  Debian's Prometheus ◄── the scaler loop (KEDA's rules over the rendered triggers)

Real: vllm-router 0.1.17 for both routers, with the arguments the prod stack renders for the
`router` and `route-qwen2-5-7b-tp2` containers (host and ports moved to loopback, the Kubernetes
discovery removed as in tests/e2e/test_router.py); the registrar's `reconcile` and its models server
(router/registrar.py) over the rendered registrar worker; the wake gate (router/wake_gate.py, issue
40) started as its container starts it, from the rendered `wake-gate.json`, reading the same key
files as the vLLM pod (only its port, the model router's URL and the key folder moved to loopback);
Debian's Prometheus scraping the model router's metrics port with the rendered PodMonitor endpoint's
relabelling and the labels the Prometheus Operator adds (namespace, pod, container), the front's
metrics port (the PodMonitor's first endpoint), and the vLLM pod through file-based discovery;
vLLM 0.32.0's CPU build serving the tiny model as the model's pod in tenants mode (the rendered
middleware, tenants file and environment; the CPU-adjusted dev engine flags, as tests/e2e/test_tenants.py).

Simulated links, not run:
- KEDA's operator. `Scaler` stands in: every polling interval it evaluates each trigger query of the
  rendered ScaledObject through Prometheus' HTTP API, and applies KEDA's rules: a trigger is active
  when its value is above its `activationThreshold` (0 when unset; an empty result is 0, KEDA's
  `ignoreNullValues` default); 0 → 1 replica when one is active; 1 → 0 once none has been active for
  `cooldownPeriod`. Above one replica the HPA would take over; one replica is all this test needs.
- The kubelet and the router's Kubernetes discovery: on 0 → 1 the scaler starts a vLLM server, and
  once /health answers 200 adds it to the model's router through the router's worker API
  (`POST /workers`), and to Prometheus' file discovery; on 1 → 0 it removes it and stops the server
  by its process group.

Substituted (the mechanics are the stack's, the clocks are shortened for a 2-core machine):
- scrape interval and KEDA's polling interval: `SCRAPE_SECONDS` / `POLL_SECONDS` instead of 15 s;
- the demand window W (`[<W>s]` and `offset <W>s` in the rendered `router_demand` query,
  `idle_seconds_before_zero`, 900 s): `TEST_IDLE_SECONDS`. The rendered `cooldownPeriod` is kept.
- the model router's hold is the rendered one (prod: 480 attempts, 955.5 s) unless it is shorter
  than `CPU_START_BOUND_SECONDS`, what the CPU server may need to start here; then
  `--retry-max-retries` is raised until it is not (the other hold flags stay as rendered);
- the request past the bound runs on a second front + model router pair that no scaler watches (no
  replica ever starts), with the rendered flags except `--retry-max-retries`, lowered to hold
  `PAST_BOUND_HOLD_SECONDS` per model-router attempt: the rendered hold (up to 3 front attempts x 955.5 s)
  would keep the suite 16 minutes. The relation measured (front attempts x model-router hold) is what
  the rendered total follows.

Every loop is bounded; every process is stopped by its pid (process group).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import secrets
import statistics
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from components import secrets as pod_secrets
from components import server_auth
from router.registrar import RouterClient, Worker, desired_workers, reconcile
from tests.e2e.conftest import REPO_ROOT, server_arguments
from tests.e2e.test_router import loopback_arguments, rendered_registrar_workers, rendered_router_containers
from tests.support.recorded_prometheus import RecordedPrometheus, running_prometheus
from tests.support.vllm_router import (
    RouterVenvMissingError,
    RunningRouter,
    RunningWakeGate,
    held_attempts,
    models_server,
    require_router_python,
    start_router,
    start_wake_gate,
    stop_process_group,
    stop_router,
)
from tests.support.vllm_server import (
    RunningVllmServer,
    VllmServerError,
    start_vllm_server,
    stop_vllm_server,
    wait_until_healthy,
)

pytestmark = pytest.mark.e2e

STACK = "prod"
MODEL = "qwen2-5-7b-tp2"
NAMESPACE = f"vllm-{MODEL}"
ROUTER_NAMESPACE = "vllm-router"
ROUTE_CONTAINER = f"route-{MODEL}"
POD = "vllm-6f7d9c8b5-zero0"
ROUTER_POD = "router-7c9f6d5b8-live0"

SCRAPE_SECONDS = 1.0
POLL_SECONDS = 1.0
TEST_IDLE_SECONDS = 20
CPU_START_BOUND_SECONDS = 300.0
"""The least model-router hold this test runs with: the CPU server's start (about 80 s idle, 165 s
busy, tests/e2e/conftest.py) with a margin."""
PAST_BOUND_HOLD_SECONDS = 35.0
STARTUP_TIMEOUT_SECONDS = 400
CONCURRENT_REQUESTS = 32
STRANGER_REQUESTS = 200
"""Requests without a valid key sent at zero (issue 40), spread evenly over the kinds of `stranger_kinds`."""
CB_FAILURE_THRESHOLD = 10
"""vllm-router 0.1.17's default `--cb-failure-threshold` (the rendered front sets none)."""
CIRCUIT_BURST = 12
"""More than the front's default `--cb-failure-threshold` (10) at once."""
MAX_TOKENS = 8
OUT_DIR = REPO_ROOT / "out" / "scale-to-zero"


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def hold_seconds(args: list[str]) -> float:
    """The router's total backoff before its last attempt: `--retry-max-retries` attempts sleep
    between them initial, initial×multiplier, … capped at the max (jitter 0). Measured on 0.1.17:
    4 attempts at 500/2000/2 held 3.5 s and counted 4 `no_available_workers` errors."""
    attempts = int(_option(args, "--retry-max-retries"))
    delay, cap = (
        float(_option(args, "--retry-initial-backoff-ms")),
        float(_option(args, "--retry-max-backoff-ms")),
    )
    multiplier, total = float(_option(args, "--retry-backoff-multiplier")), 0.0
    for _ in range(attempts - 1):
        total += min(delay, cap)
        delay *= multiplier
    return total / 1000


def with_hold(args: list[str], seconds: float) -> list[str]:
    """`args` with `--retry-max-retries` raised until the hold reaches `seconds` (nothing else changed)."""
    args = list(args)
    position = args.index("--retry-max-retries") + 1
    while hold_seconds(args) < seconds:
        args[position] = str(int(args[position]) + 1)
    return args


def _rendered_scaled_object() -> dict[str, Any]:
    from tests.conftest import rendered

    [scaled_object] = rendered(STACK).find("ScaledObject", namespace=NAMESPACE)
    spec: dict[str, Any] = scaled_object["spec"]
    return spec


def _rendered_registrar_entry() -> dict[str, Any]:
    """The registrar config's worker for the to-zero model."""
    (entry,) = [w for w in rendered_registrar_workers(STACK) if w["url"].endswith(_port_of(ROUTE_CONTAINER))]
    return entry


def _rendered_wake_gate_config() -> dict[str, Any]:
    """The wake gate's config (the router ConfigMap's wake-gate.json, components/router_sidecars.py)."""
    from tests.conftest import rendered

    (config_map,) = rendered(STACK).find("ConfigMap", namespace=ROUTER_NAMESPACE)
    config: dict[str, Any] = json.loads(config_map["data"]["wake-gate.json"])
    return config


def _rendered_retry_after_seconds() -> int:
    (gated,) = [m for m in _rendered_wake_gate_config()["models"] if m["model"] == MODEL]
    seconds: int = gated["retry_after_seconds"]
    return seconds


def _gated_entry(entry: dict[str, Any], model_router: RunningRouter, gate: RunningWakeGate) -> dict[str, Any]:
    """The rendered registrar worker with loopback URLs: the model's router, and its wake gate as
    the URL the front routes the model to (`front_url`)."""
    assert entry.get("front_url"), "a to-zero model is routed through its wake gate"
    return {**entry, "url": model_router.base_url, "front_url": gate.base_url}


def _port_of(container: str) -> str:
    return ":" + _option(rendered_router_containers(STACK)[container], "--port")


def _rendered_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    """The to-zero model's rendered vLLM container and its auth ConfigMap."""
    from tests.conftest import rendered

    render = rendered(STACK)
    workloads = [
        *render.find("Deployment", namespace=NAMESPACE),
        *render.find("Rollout", namespace=NAMESPACE),
    ]
    [workload] = [w for w in workloads if w["metadata"]["name"] == "vllm"]
    [container] = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    [config_map] = render.find("ConfigMap", name=server_auth.CONFIG_MAP_NAME, namespace=NAMESPACE)
    return container, config_map


def _rendered_scrape_relabelings() -> list[dict[str, str]]:
    """The router PodMonitor endpoint of this model's router, as Prometheus relabel_configs."""
    from tests.conftest import rendered

    [monitor] = [m for m in rendered(STACK).find("PodMonitor") if m["metadata"]["name"] == "vllm-router"]
    [endpoint] = [
        e
        for e in monitor["spec"]["podMetricsEndpoints"]
        if any(r.get("replacement") == MODEL for r in e.get("relabelings", []))
    ]
    keys = {"targetLabel": "target_label", "sourceLabels": "source_labels"}
    return [{keys.get(k, k): v for k, v in r.items()} for r in endpoint["relabelings"]]


@dataclass(frozen=True)
class Trigger:
    name: str
    query: str
    activation_threshold: float


@dataclass
class Replica:
    server: RunningVllmServer
    started_at: float
    ready_at: float | None = None
    stopped_at: float | None = None


@dataclass
class Scaler:
    """KEDA's operator, simulated (module docstring): its rules over the rendered triggers."""

    prometheus: RecordedPrometheus
    triggers: list[Trigger]
    cooldown_seconds: float
    start_replica: Any
    stop_replica: Any
    replicas: int = 0
    paused: bool = False
    last_active: float = 0.0
    polls: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def value(self, trigger: Trigger, at: float) -> float:
        values = self.prometheus.query(trigger.query, at)
        assert len(values) <= 1, (trigger.name, values)  # KEDA refuses a query of several series
        return next(iter(values.values()), 0.0)

    def poll(self) -> None:
        now = time.time()
        values = {t.name: self.value(t, now) for t in self.triggers}
        active = [t.name for t in self.triggers if values[t.name] > t.activation_threshold]
        self.polls.append({"at": now, "values": values, "active": active, "replicas": self.replicas})
        if self.paused:
            return
        if active:
            self.last_active = now
            if self.replicas == 0:
                self.replicas = 1
                self.events.append((now, "0->1"))
                threading.Thread(target=self.start_replica, name="kubelet", daemon=True).start()
        elif self.replicas == 1 and now - self.last_active >= self.cooldown_seconds:
            self.replicas = 0
            self.events.append((now, "1->0"))
            self.stop_replica()

    def run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self.poll()
            except (OSError, AssertionError) as error:  # one failed poll: KEDA tries next interval
                self.events.append((time.time(), f"poll failed: {error}"))

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Chain:
    front: RunningRouter
    model_router: RunningRouter
    gate: RunningWakeGate
    worker: Worker
    scaler: Scaler
    prometheus: RecordedPrometheus
    keys: dict[str, str]
    """Tenant -> a key of it; the first tenants are allowed on the model, the last is not."""
    prefixes: dict[str, str]
    """Tenant -> its key prefix."""
    replicas: list[Replica]
    model_args: list[str]
    served_name: str


@pytest.fixture(scope="module")
def router_python() -> Path:
    try:
        return require_router_python()
    except RouterVenvMissingError as error:
        pytest.fail(str(error), pytrace=False)


@dataclass
class PastBound:
    """A request through a second front + model router pair with the rendered hold, no replica."""

    started: float = 0.0
    status: int | None = None
    body: str = ""
    error: str | None = None
    elapsed: float | None = None
    attempts_at_model_router: float = 0.0
    model_hold_seconds: float = 0.0
    front_attempts: int = 0
    burst: list[tuple[int | None, float]] = field(default_factory=list)
    """(status, seconds) of CIRCUIT_BURST requests sent at once after the first one was answered."""
    after_burst: tuple[int | None, float] | None = None
    """One request right after the burst."""
    front_circuit_opened: float = 0.0
    """The front's `vllm_router_cb_state_transitions_total{to="open"}` for the model router."""
    retry_after: str | None = None
    """The `Retry-After` of the single request's 503."""
    burst_retry_after: list[tuple[str | None, str | None]] = field(default_factory=list)
    """(Retry-After, Server) of each burst answer: the gate's own answers name it as their server."""
    after_burst_retry_after: tuple[str | None, str | None] | None = None
    done: threading.Event = field(default_factory=threading.Event)


@pytest.fixture(scope="module")
def past_bound(router_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PastBound]:
    """Started first, in the background, since it waits out the rendered hold while the rest runs."""
    containers = rendered_router_containers(STACK)
    model_args = containers[ROUTE_CONTAINER]
    model_args[model_args.index("--retry-max-retries") + 1] = "1"
    model_args = with_hold(model_args, PAST_BOUND_HOLD_SECONDS)  # substituted (module docstring)
    logs = tmp_path_factory.mktemp("past-bound-routers")
    # A valid key of a tenant allowed on the model: only such a request passes the wake gate to the hold.
    from infra.stack_checks import load_stack

    tenant = next(t for t in load_stack(STACK).tenants if t.name == "search")
    keys_dir = logs / "router-keys"
    keys_dir.mkdir()
    key = f"{tenant.prefix}{secrets.token_urlsafe(24)}"
    (keys_dir / pod_secrets.tenant_key_file_name(tenant.name, 0)).write_text(key + "\n")
    model_router = start_router(loopback_arguments(model_args), log_path=logs / "model.log")
    front = start_router(loopback_arguments(containers["router"]), log_path=logs / "front.log")
    gate = start_wake_gate(
        _rendered_wake_gate_config(),
        MODEL,
        model_router_url=model_router.base_url,
        keys_dir=keys_dir,
        log_path=logs / "wake-gate.log",
    )
    result = PastBound(
        model_hold_seconds=hold_seconds(model_args),
        front_attempts=int(_option(containers["router"], "--retry-max-retries")),
    )
    entry = _rendered_registrar_entry()
    reconcile(
        RouterClient(front.base_url),
        desired_workers({"workers": [_gated_entry(entry, model_router, gate)]}),
    )

    def held() -> tuple[int | None, float, str, tuple[str | None, str | None]]:
        started = time.monotonic()
        try:
            response = httpx.post(
                f"{front.base_url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={
                    "model": entry["model_id"],
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": True,
                },
                timeout=3 * result.front_attempts * result.model_hold_seconds + 120,
            )
        except httpx.HTTPError as error:
            return None, time.monotonic() - started, repr(error), (None, None)
        elapsed = time.monotonic() - started
        headers = response.headers
        return (
            response.status_code,
            elapsed,
            response.text,
            (headers.get("retry-after"), headers.get("server")),
        )

    def send() -> None:
        try:
            before = held_attempts(model_router)
            result.started = time.monotonic()
            result.status, result.elapsed, result.body, (result.retry_after, _) = held()
            result.error = result.body if result.status is None else None
            result.attempts_at_model_router = held_attempts(model_router) - before
            with concurrent.futures.ThreadPoolExecutor(max_workers=CIRCUIT_BURST) as pool:
                answers = [answer.result() for answer in [pool.submit(held) for _ in range(CIRCUIT_BURST)]]
            result.burst = [answer[:2] for answer in answers]
            result.burst_retry_after = [answer[3] for answer in answers]
            status, seconds, _, result.after_burst_retry_after = held()
            result.after_burst = (status, seconds)
            result.front_circuit_opened = sum(
                float(line.rsplit(" ", 1)[1])
                for line in httpx.get(front.metrics_url, timeout=30).text.splitlines()
                if line.startswith("vllm_router_cb_state_transitions_total{") and 'to="open"' in line
            )
        finally:
            result.done.set()

    thread = threading.Thread(target=send, name="past-bound", daemon=True)
    result.started = time.monotonic()  # the tests' deadlines count from here, even before send() runs
    thread.start()
    try:
        yield result
    finally:
        thread.join(timeout=5)
        stop_router(front)
        stop_process_group(gate.process)
        stop_router(model_router)


@pytest.fixture(scope="module")
def chain(
    past_bound: PastBound, router_python: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Chain]:
    containers = rendered_router_containers(STACK)
    model_args = with_hold(containers[ROUTE_CONTAINER], CPU_START_BOUND_SECONDS)
    logs = tmp_path_factory.mktemp("scale-to-zero")

    # The pod's auth: the rendered middleware and tenants file, one key file per tenant it holds.
    container, config_map = _rendered_pod()
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount, keys_dir = logs / "auth-configmap-mount", logs / "tenant-keys-csi-mount"
    mount.mkdir()
    keys_dir.mkdir()
    for file_name, text in config_map["data"].items():
        (mount / file_name).write_text(text)
    tenants = json.loads(config_map["data"][server_auth.TENANTS_FILE])
    (served_name,) = tenants["served_names"]
    keys = {name: f"{t['key_prefix']}{secrets.token_urlsafe(24)}" for name, t in tenants["tenants"].items()}
    for tenant, key in keys.items():
        (keys_dir / pod_secrets.tenant_key_file_name(tenant, 0)).write_text(key + "\n")
    # The stack's other tenants: not allowed on this model, so its pods do not hold their keys.
    from infra.stack_checks import load_stack

    others = [t for t in load_stack(STACK).tenants if t.name not in keys]
    assert others, "the prod stack should have a tenant not allowed on this model"
    keys.update({t.name: f"{t.prefix}{secrets.token_urlsafe(24)}" for t in others})
    # The rendered arguments' tenant part on the CPU-adjusted dev engine flags (as test_tenants.py).
    vllm_args = server_arguments(tiny_model_dir)
    tenant_args = server_auth.server_arguments(tenants=True)
    assert container["args"][container["args"].index("--middleware") :][: len(tenant_args)] == tenant_args
    vllm_args = [a for a in vllm_args if a not in tenant_args] + tenant_args
    vllm_args[vllm_args.index("--served-model-name") + 1] = served_name
    vllm_env = {
        "PYTHONPATH": os.pathsep.join([str(mount), str(REPO_ROOT)]),
        "VLLM_PLATFORM_TENANTS": str(mount / Path(env["VLLM_PLATFORM_TENANTS"]).name),
        "VLLM_PLATFORM_TENANT_MOUNT": str(keys_dir),
    }
    file_sd = logs / "vllm-pods.json"
    file_sd.write_text("[]")
    replicas: list[Replica] = []
    (OUT_DIR / "results.json").unlink(missing_ok=True)

    with contextlib.ExitStack() as stack:
        model_router = start_router(loopback_arguments(model_args), log_path=logs / "model-router.log")
        stack.callback(stop_router, model_router)
        front = start_router(loopback_arguments(containers["router"]), log_path=logs / "front.log")
        stack.callback(stop_router, front)
        # The wake gate reads the same key files as the model's pods: the same store entries, mounted
        # into the router pod's wake-gate container (SecretProviderClass vllm-router-keys).
        gate = start_wake_gate(
            _rendered_wake_gate_config(),
            MODEL,
            model_router_url=model_router.base_url,
            keys_dir=keys_dir,
            log_path=logs / "wake-gate.log",
        )
        stack.callback(stop_process_group, gate.process)
        entry = _rendered_registrar_entry()
        assert entry["model_id"] == served_name and entry.get("scale_to_zero") is True, entry
        desired = desired_workers({"workers": [_gated_entry(entry, model_router, gate)]})
        assert reconcile(RouterClient(front.base_url), desired) == ([gate.base_url], [])

        labels = {"namespace": ROUTER_NAMESPACE, "pod": ROUTER_POD, "container": ROUTE_CONTAINER}
        config = {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS:g}s", "scrape_timeout": f"{SCRAPE_SECONDS:g}s"},
            "scrape_configs": [
                {
                    "job_name": f"{ROUTER_NAMESPACE}/vllm-router",
                    "static_configs": [
                        {
                            "targets": [urllib.parse.urlsplit(model_router.metrics_url).netloc],
                            "labels": labels,
                        }
                    ],
                    "relabel_configs": _rendered_scrape_relabelings(),
                },
                # The front's own endpoint (the PodMonitor's first, no relabelling): it counts the
                # requests the gate refuses, under no model, so they must not read as demand.
                {
                    "job_name": f"{ROUTER_NAMESPACE}/vllm-router-front",
                    "static_configs": [
                        {
                            "targets": [urllib.parse.urlsplit(front.metrics_url).netloc],
                            "labels": {**labels, "container": "router"},
                        }
                    ],
                },
                {
                    "job_name": f"{NAMESPACE}/vllm",
                    "file_sd_configs": [{"files": [str(file_sd)], "refresh_interval": "1s"}],
                },
            ],
        }
        prometheus = stack.enter_context(running_prometheus(json.dumps(config), logs, logs / "tsdb"))

        def start_replica() -> None:
            server = start_vllm_server(vllm_args, env=vllm_env, log_path=logs / f"vllm-{len(replicas)}.log")
            replica = Replica(server, time.monotonic())
            replicas.append(replica)
            try:
                wait_until_healthy(server, timeout_seconds=STARTUP_TIMEOUT_SECONDS)
            except VllmServerError as error:
                scaler.events.append((time.time(), f"replica failed: {error}"))
                return
            # Discovery, simulated: the router's worker API and Prometheus' file discovery.
            pod = {"namespace": NAMESPACE, "pod": POD, "container": "vllm"}
            file_sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{server.port}"], "labels": pod}]))
            added = httpx.post(f"{model_router.base_url}/workers", json={"url": server.base_url}, timeout=30)
            replica.ready_at = time.monotonic()
            scaler.events.append((time.time(), f"worker added: {added.status_code}"))

        def stop_replica() -> None:
            replica = replicas[-1]
            url = urllib.parse.quote(replica.server.base_url, safe="")
            httpx.delete(f"{model_router.base_url}/workers/{url}", timeout=30)
            file_sd.write_text("[]")
            stop_vllm_server(replica.server)
            replica.stopped_at = time.monotonic()

        scaler = Scaler(
            prometheus,
            rendered_triggers(),
            float(_rendered_scaled_object()["cooldownPeriod"]),
            start_replica,
            stop_replica,
        )
        thread = threading.Thread(target=scaler.run, name="scaler", daemon=True)
        thread.start()

        def stop_every_replica() -> None:
            for replica in replicas:
                stop_vllm_server(replica.server)

        stack.callback(stop_every_replica)
        stack.callback(thread.join, 30)
        stack.callback(scaler.stop)
        yield Chain(
            front,
            model_router,
            gate,
            *desired.values(),
            scaler,
            prometheus,
            keys,
            {t.name: t.prefix for t in load_stack(STACK).tenants},
            replicas,
            model_args,
            served_name,
        )


def rendered_triggers() -> list[Trigger]:
    """The ScaledObject's triggers, the demand window substituted (module docstring)."""
    spec = _rendered_scaled_object()
    assert spec["minReplicaCount"] == 0
    triggers = []
    for trigger in spec["triggers"]:
        query = trigger["metadata"]["query"]
        if trigger["name"] == "router_demand":
            window = query.split(" offset ", 1)[1].split(")", 1)[0]
            query = query.replace(f" offset {window}", f" offset {TEST_IDLE_SECONDS}s")
            query = query.replace(f"[{window}]", f"[{TEST_IDLE_SECONDS}s]")
        triggers.append(
            Trigger(trigger["name"], query, float(trigger["metadata"].get("activationThreshold", "0")))
        )
    assert "router_demand" in {t.name for t in triggers}
    return triggers


@pytest.fixture(scope="module")
def models_endpoint(chain: Chain) -> Iterator[str]:
    """The registrar's models server (what the Ingress sends /v1/models to), over the model router."""
    with models_server([chain.worker]) as url:
        yield url


@dataclass(frozen=True)
class Answer:
    status: int | None
    done: bool
    """The SSE stream ended with `data: [DONE]`."""
    first_event_seconds: float | None
    first_content_seconds: float | None
    """Send → the first chunk with generated text (the wait a user sees)."""
    total_seconds: float
    body: str
    error: str | None = None


def stream_chat(chain: Chain, key: str, text: str) -> Answer:
    started = time.monotonic()
    first_event = first_content = None
    lines: list[str] = []
    try:
        with httpx.stream(
            "POST",
            f"{chain.front.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "model": chain.served_name,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": MAX_TOKENS,
                "stream": True,
            },
            timeout=httpx.Timeout(hold_seconds(chain.model_args) + 180),
        ) as response:
            for line in response.iter_lines():
                lines.append(line)
                if line.startswith("data: {"):
                    first_event = first_event or time.monotonic() - started
                    delta = (json.loads(line[6:]).get("choices") or [{}])[0].get("delta") or {}
                    if delta.get("content") and first_content is None:
                        first_content = time.monotonic() - started
            status = response.status_code
    except httpx.HTTPError as error:
        return Answer(
            None, False, first_event, first_content, time.monotonic() - started, "\n".join(lines), repr(error)
        )
    done = bool(lines) and [line for line in lines if line][-1] == "data: [DONE]"
    return Answer(
        status, done, first_event, first_content, time.monotonic() - started, "\n".join(lines)[-500:]
    )


def stranger_kinds(chain: Chain) -> dict[str, tuple[str | None, str]]:
    """Kind -> (bearer key or None, the body's `model`) of a request that must not wake the model."""
    own_tenant, own_key = next(iter(chain.keys.items()))
    other_key = list(chain.keys.values())[-1]
    return {
        "no key": (None, chain.served_name),
        "not a key": ("x", chain.served_name),
        "a made-up key with the tenant's prefix": (
            f"{chain.prefixes[own_tenant]}{secrets.token_urlsafe(24)}",
            chain.served_name,
        ),
        "another tenant's key": (other_key, chain.served_name),
        "a name no model serves": (own_key, "no-such-model"),
    }


def short_chat(client: httpx.Client, base_url: str, key: str | None, model: str) -> int | None:
    """A one-token chat request's status; None if it got no answer within 30 s (it was held)."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    try:
        return client.post(
            f"{base_url}/v1/chat/completions",
            headers=headers,
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
            timeout=30,
        ).status_code
    except httpx.HTTPError:
        return None


def _routed(router: RunningRouter) -> float:
    text = httpx.get(router.metrics_url, timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm_router_requests_total")
    )


@dataclass(frozen=True)
class Strangers:
    statuses: dict[str, list[int | None]]
    """Kind (stranger_kinds) -> the status of each of its requests."""
    seconds: float
    held_attempts: float
    """The model router's `no_available_workers` errors while they were sent: each is a held attempt."""
    routed: float
    """The model router's `vllm_router_requests_total` while they were sent."""
    polls: list[dict[str, Any]]
    """The scaler's polls from the first request to a scrape and a poll after the last."""


@pytest.fixture(scope="module")
def strangers(chain: Chain) -> Strangers:
    assert chain.scaler.replicas == 0 and chain.replicas == [], "not at zero before the strangers"
    kinds = stranger_kinds(chain)
    held, routed = held_attempts(chain.model_router), _routed(chain.model_router)
    started_at, started = time.time(), time.monotonic()
    sends = [kind for kind in kinds for _ in range(STRANGER_REQUESTS // len(kinds))]
    # One client, its connections kept alive, as an SDK sends them (a new client per request costs the
    # test itself tens of milliseconds each here).
    with httpx.Client() as client, concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(
            pool.map(lambda kind: (kind, short_chat(client, chain.front.base_url, *kinds[kind])), sends)
        )
    seconds = time.monotonic() - started
    # Any demand they made would show within a scrape and a poll (the wake reads 1 at the first scrape).
    time.sleep(2 * SCRAPE_SECONDS + 2 * POLL_SECONDS + 1)
    statuses: dict[str, list[int | None]] = {}
    for kind, status in results:
        statuses.setdefault(kind, []).append(status)
    return Strangers(
        statuses,
        seconds,
        held_attempts(chain.model_router) - held,
        _routed(chain.model_router) - routed,
        [poll for poll in chain.scaler.polls if poll["at"] >= started_at],
    )


@dataclass
class Wake:
    sent_at: float
    """Wall clock (Prometheus' time) when the burst was sent."""
    answers: list[Answer]
    wrong_key: Answer
    other_tenant: Answer
    other_tenant_direct: int
    """What the awake pod answers the other tenant's key directly (today's answer)."""
    models_awake: httpx.Response
    last_answer_at: float
    strangers_direct: dict[str, int | None] = field(default_factory=dict)
    """What the awake pod answers each kind of stranger_kinds directly."""


@pytest.fixture(scope="module")
def wake(chain: Chain, models_endpoint: str) -> Wake:
    assert chain.scaler.replicas == 0 and chain.replicas == [], "not at zero before the burst"
    own, (other_tenant, other_key) = next(iter(chain.keys.values())), list(chain.keys.items())[-1]
    sent_at = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=CONCURRENT_REQUESTS + 2) as pool:
        futures = [pool.submit(stream_chat, chain, own, f"wake up {i}") for i in range(CONCURRENT_REQUESTS)]
        wrong = pool.submit(stream_chat, chain, own + "x", "a wrong key, refused by the wake gate")
        other = pool.submit(stream_chat, chain, other_key, f"tenant {other_tenant}, refused by the wake gate")
        answers = [f.result(timeout=hold_seconds(chain.model_args) + 240) for f in futures]
        wrong_key, other_answer = wrong.result(timeout=60), other.result(timeout=60)
    last_answer_at = time.monotonic()
    models_awake = httpx.get(
        f"{models_endpoint}/v1/models", headers={"Authorization": f"Bearer {own}"}, timeout=30
    )
    (replica,) = chain.replicas
    direct = httpx.post(
        f"{replica.server.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {other_key}"},
        json={"model": chain.served_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        timeout=60,
    )
    with httpx.Client() as client:
        strangers_direct = {
            kind: short_chat(client, replica.server.base_url, key, model)
            for kind, (key, model) in stranger_kinds(chain).items()
        }
    return Wake(
        sent_at,
        answers,
        wrong_key,
        other_answer,
        direct.status_code,
        models_awake,
        last_answer_at,
        strangers_direct,
    )


def _record(name: str, value: Any) -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results[name] = value
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def test_the_model_at_zero_is_listed_with_a_key_without_waking_it(chain: Chain, models_endpoint: str) -> None:
    key = next(iter(chain.keys.values()))
    started = time.monotonic()
    listed = httpx.get(f"{models_endpoint}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    # Waiting on the hold would take the whole hold (minutes); half of it is room for any machine.
    assert time.monotonic() - started < hold_seconds(chain.model_args) / 2, "the list waited on the hold"
    assert listed.status_code == 200, listed.text
    assert [e["id"] for e in listed.json()["data"]] == [chain.served_name]
    assert httpx.get(f"{models_endpoint}/v1/models", timeout=30).status_code == 401
    # Issue 40: the wake gate answers for the sleeping model from the keys its pods accept, so a wrong
    # key or another tenant's key does not see it.
    for other in (key + "x", list(chain.keys.values())[-1]):
        refused = httpx.get(
            f"{models_endpoint}/v1/models", headers={"Authorization": f"Bearer {other}"}, timeout=30
        )
        assert refused.status_code == 401, refused.text
    time.sleep(3 * POLL_SECONDS)
    assert chain.scaler.replicas == 0 and chain.replicas == [], chain.scaler.events


def test_200_requests_without_a_valid_key_at_zero_are_refused_and_leave_the_model_at_zero(
    chain: Chain, strangers: Strangers
) -> None:
    """Issue 40: no key, a wrong key, a made-up key with a tenant's prefix, another tenant's key and a
    name no model serves each get 401/404 from the wake gate; none reaches the model router's hold
    (its held-attempt counter, the demand signal, stays where it was), so the demand query reads 0 and
    the model stays at zero."""
    counts = {kind: len(statuses) for kind, statuses in strangers.statuses.items()}
    _record(
        "strangers_at_zero",
        {
            "requests": counts,
            "statuses": {
                kind: sorted(set(map(str, statuses))) for kind, statuses in strangers.statuses.items()
            },
            "seconds_for_all": strangers.seconds,
            "held_attempts": strangers.held_attempts,
            "polls": len(strangers.polls),
            "scaler_events": [what for _, what in chain.scaler.events],
        },
    )
    print(
        f"{sum(counts.values())} requests without a valid key at zero in {strangers.seconds:.1f} s: "
        f"{ {kind: sorted(set(map(str, statuses))) for kind, statuses in strangers.statuses.items()} }"
    )
    assert sum(counts.values()) == STRANGER_REQUESTS
    expected = {
        kind: 404 if model != chain.served_name else 401 for kind, (_, model) in stranger_kinds(chain).items()
    }
    assert {kind: set(statuses) for kind, statuses in strangers.statuses.items()} == {
        kind: {status} for kind, status in expected.items()
    }
    assert strangers.held_attempts == 0 and strangers.routed == 0
    assert strangers.polls, "the scaler did not poll"
    assert all(poll["values"]["router_demand"] == 0 and not poll["active"] for poll in strangers.polls), (
        strangers.polls
    )
    assert chain.scaler.replicas == 0 and chain.replicas == [], chain.scaler.events
    assert "0->1" not in [what for _, what in chain.scaler.events]


def test_32_streams_sent_at_zero_are_all_answered_once_a_replica_wakes(chain: Chain, wake: Wake) -> None:
    failed = [a for a in wake.answers if a.status != 200 or not a.done or a.error]
    assert failed == [], failed[:3]
    (replica,) = chain.replicas
    assert replica.ready_at is not None
    waits = [a.first_content_seconds or a.first_event_seconds for a in wake.answers]
    assert all(w is not None for w in waits)
    summary = {
        "requests": len(waits),
        "median_seconds": statistics.median(waits),
        "min_seconds": min(waits),
        "max_seconds": max(waits),
        "replica_start_to_ready_seconds": replica.ready_at - replica.started_at,
        "model_router_hold_seconds": hold_seconds(chain.model_args),
        "model_router_attempts": int(_option(chain.model_args, "--retry-max-retries")),
        "rendered_model_router_hold_seconds": hold_seconds(
            rendered_router_containers(STACK)[ROUTE_CONTAINER]
        ),
    }
    _record("waits_seconds", sorted(waits))
    _record("burst", summary)
    print(
        f"32 streams at zero: wait median {summary['median_seconds']:.1f} s, "
        f"min {summary['min_seconds']:.1f} s, max {summary['max_seconds']:.1f} s; "
        f"replica start → ready {summary['replica_start_to_ready_seconds']:.1f} s"
    )
    assert wake.models_awake.status_code == 200, wake.models_awake.text
    assert [e["id"] for e in wake.models_awake.json()["data"]] == [chain.served_name]


def test_keys_refused_at_zero_get_the_answer_the_awake_pod_gives(wake: Wake, strangers: Strangers) -> None:
    """The wake gate answers as the model's pods answer awake (their middleware), not with a hold or
    the router's 503: sent amid the waking burst, and each kind of the 200 strangers."""
    assert wake.wrong_key.status == 401, wake.wrong_key
    # The stack's other tenant is not allowed on this model: its pods hold no key of it.
    assert wake.other_tenant.status == wake.other_tenant_direct, wake.other_tenant
    assert wake.other_tenant.status in (401, 403), wake.other_tenant
    at_zero = {kind: statuses[0] for kind, statuses in strangers.statuses.items()}
    _record(
        "refused_keys",
        {
            "wrong_key": wake.wrong_key.status,
            "other_tenant": wake.other_tenant.status,
            "at_zero_by_the_gate": at_zero,
            "awake_by_the_pod": wake.strangers_direct,
        },
    )
    assert at_zero == wake.strangers_direct


def test_the_demand_query_is_above_zero_from_the_first_scrape_after_the_first_held_request(
    chain: Chain, wake: Wake
) -> None:
    selector = (
        '{__name__=~"vllm_router_requests_total|vllm_router_request_errors_total",'
        f'namespace="{ROUTER_NAMESPACE}",model="{MODEL}"}}'
    )
    raw = chain.prometheus._get("/api/v1/query", {"query": f"{selector}[10m]", "time": f"{time.time():.3f}"})
    first = min(float(t) for series in raw["result"] for t, _ in series["values"])
    assert first >= wake.sent_at - SCRAPE_SECONDS, "the router exported the series before any request"
    (demand,) = [t for t in chain.scaler.triggers if t.name == "router_demand"]
    rendered_query = next(t for t in _rendered_scaled_object()["triggers"] if t["name"] == "router_demand")
    at_first = chain.scaler.value(demand, first)
    rendered_at_first = chain.scaler.prometheus.query(rendered_query["metadata"]["query"], first)
    woke_at = next(at for at, what in chain.scaler.events if what == "0->1")
    _record(
        "first_scrape",
        {
            "first_sample_after_send_seconds": first - wake.sent_at,
            "demand_at_first_sample": at_first,
            "rendered_query_at_first_sample": rendered_at_first,
            "scaler_activated_after_send_seconds": woke_at - wake.sent_at,
        },
    )
    assert at_first == 1.0, chain.scaler.polls[:10]
    assert list(rendered_at_first.values()) == [1.0]
    assert woke_at - wake.sent_at < 2 * SCRAPE_SECONDS + 2 * POLL_SECONDS + 3


def test_an_idle_model_goes_back_to_zero_and_stays_listed(
    chain: Chain, wake: Wake, models_endpoint: str
) -> None:
    cooldown = chain.scaler.cooldown_seconds
    bound = TEST_IDLE_SECONDS + cooldown + 60
    deadline = wake.last_answer_at + bound
    while chain.scaler.replicas != 0 or chain.replicas[-1].server.process.poll() is None:
        assert time.monotonic() < deadline, (chain.scaler.events, chain.scaler.polls[-5:])
        time.sleep(POLL_SECONDS)
    to_zero = time.monotonic() - wake.last_answer_at
    _record("to_zero_seconds_after_last_answer", to_zero)
    print(
        f"back to zero {to_zero:.1f} s after the last answer "
        f"(W {TEST_IDLE_SECONDS} s + cooldown {cooldown:g} s)"
    )
    assert to_zero >= TEST_IDLE_SECONDS, "scaled in before the demand window had passed"
    key = next(iter(chain.keys.values()))
    listed = httpx.get(f"{models_endpoint}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert listed.status_code == 200 and [e["id"] for e in listed.json()["data"]] == [chain.served_name]


def test_a_request_past_the_rendered_hold_gets_503_not_a_hang(past_bound: PastBound) -> None:
    expected = past_bound.front_attempts * past_bound.model_hold_seconds
    bound = 2 * expected + 180  # the single request, then the circuit-breaker burst (next test)
    assert past_bound.done.wait(timeout=max(0, past_bound.started + bound - time.monotonic()))
    _record(
        "past_bound",
        {
            "status": past_bound.status,
            "elapsed_seconds": past_bound.elapsed,
            "model_router_hold_seconds": past_bound.model_hold_seconds,
            "front_attempts": past_bound.front_attempts,
            "attempts_at_model_router": past_bound.attempts_at_model_router,
            "retry_after": past_bound.retry_after,
        },
    )
    print(
        f"past the hold: {past_bound.status} after {past_bound.elapsed:.1f} s "
        f"({past_bound.front_attempts} front attempts x "
        f"{past_bound.model_hold_seconds:.1f} s model-router hold)"
    )
    assert past_bound.error is None, past_bound.error
    assert past_bound.status == 503, past_bound.body
    assert past_bound.elapsed is not None
    assert expected <= past_bound.elapsed <= expected * 1.1 + 15
    # Issue 40 item 6: the wake gate puts the model's predicted wake on the 503 that ends a hold, and
    # the front passes it on after its last attempt.
    assert past_bound.retry_after == str(_rendered_retry_after_seconds()), past_bound.retry_after


def test_many_requests_past_the_hold_get_503_after_one_hold_once_the_fronts_circuit_opens(
    past_bound: PastBound,
) -> None:
    """Measured, not wished: vllm-router 0.1.17's front counts each 503 of the model router as a
    failure of that worker and opens its circuit after `--cb-failure-threshold` (default 10)
    consecutive ones, for `--cb-timeout-duration-secs` (default 60); `--disable-circuit-breaker` on
    the front does not reach workers registered through its API (tried: the circuit still opened).
    So the front's retries multiply the hold of one request alone; once ten held requests have
    failed together the circuit opens: a request whose hold ended before that may still be retried
    (measured: 0 of 12 in one run, 1 of 12 in another, 71.3 s), the others end after one
    model-router hold, and the next is answered 503 at once. That is
    why the stack makes each model-router attempt hold the whole hold (domain/capacity/wake.py
    `hold_attempts`): during a wake nothing fails, so the circuit stays closed; only past the hold
    do requests fail, after between one and `router.max_retries` holds, never a hang."""
    assert past_bound.done.wait(timeout=30)
    hold = past_bound.model_hold_seconds
    _record(
        "front_circuit_breaker",
        {
            "burst": [{"status": status, "seconds": seconds} for status, seconds in past_bound.burst],
            "after_burst": past_bound.after_burst,
            "burst_retry_after": past_bound.burst_retry_after,
            "after_burst_retry_after": past_bound.after_burst_retry_after,
            "front_circuit_opened": past_bound.front_circuit_opened,
        },
    )
    print(f"{CIRCUIT_BURST} at once past the hold: {past_bound.burst}; the next: {past_bound.after_burst}")
    assert [status for status, _ in past_bound.burst] == [503] * CIRCUIT_BURST
    assert past_bound.front_circuit_opened >= 1
    # Bounded: each after between one hold and the front's attempts times it, never a hang.
    most = past_bound.front_attempts * hold * 1.1 + 15
    assert all(hold <= seconds <= most for _, seconds in past_bound.burst), past_bound.burst
    # The circuit cut the front's retries: only a request whose hold ended before the
    # threshold's failures had come in can have been retried (the race measured above).
    single = [seconds for _, seconds in past_bound.burst if seconds < 1.5 * hold]
    assert len(single) >= CIRCUIT_BURST - (CB_FAILURE_THRESHOLD - 1), past_bound.burst
    assert past_bound.after_burst is not None
    status, seconds = past_bound.after_burst
    # Answered by the open circuit at once, not after a hold (half a hold is room for any machine).
    assert status == 503 and seconds < hold / 2, past_bound.after_burst
    # Every 503 the wake gate answered (a hold's end; the front passes the last attempt's answer on)
    # carries its Retry-After; the front's own 503, once its circuit to the gate is open, does not:
    # vllm-router 0.1.17 sets none, and it answers without asking the gate. Measured: when the whole
    # burst fails together, the circuit opens before any request's retry, so all of them and the next
    # get the front's own answer.
    gate = "vllm-platform-wake-gate"
    retry_after = str(_rendered_retry_after_seconds())
    for after, server in [*past_bound.burst_retry_after, past_bound.after_burst_retry_after]:
        assert (after == retry_after) == (server == gate), past_bound.burst_retry_after
