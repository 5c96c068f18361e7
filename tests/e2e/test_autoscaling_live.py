"""The scale-out signal path, live: a real vLLM server under a bounded load ramp → a real Prometheus
scraping it → the Prometheus Adapter's rule as the stack renders it → the HPA's formula.

`tests/test_autoscaling_recorded_load.py` proves the same arithmetic on a recording; this proves the
path while it runs. The server is the pinned vLLM's CPU build serving the tiny model, started with
the `--api-server-count` the prod stack renders for its 8B model (from its tuning profile), so
`/metrics` is answered by several API processes in Prometheus' multiprocess mode, as in the pod.
`--max-num-seqs 2` makes a queue out of a few requests. Debian's Prometheus scrapes it with the
target labels the PodMonitor gives a pod (namespace, pod, container); each "HPA sync" asks it the
adapter's per-pod query (components/adapter_rules.py, taken from the rendered adapter release) and
applies Kubernetes' formula (tests/support/hpa_formula.py) with the prod model's targets. The one
live server is the one pod the HPA averages over, so the replica floor here is 1.

Windows are compressed to keep the test short on two cores (scrape and sync every 2 s instead of
15 s); the mechanics (what is scraped, what is queried, the formula) are those of the stack.

The load does not depend on the machine's speed: a closed loop keeps `IN_FLIGHT` requests open (each
one answered is replaced at once), so with `--max-num-seqs 2` about `IN_FLIGHT - 2` wait whatever
the time a request takes, and the loop runs until a sync has seen the queue at its target and the
recommendation above one pod, then stops and lets it drain. (A single fixed burst, as this test
first had, drained within two syncs on a fast quiet machine and the queue read 0.) Bounded: one
server on loopback, at most `MAX_REQUESTS` requests and `LOAD_DEADLINE_SECONDS`, each with a timeout;
the load it took is printed.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from components.adapter_rules import SIGNALS, adapter_query
from components.monitoring import PROMETHEUS_ADAPTER_RELEASE
from domain.config.models import ModelConfig
from tests.conftest import model_workloads, rendered
from tests.support.hpa_formula import desired_replicas
from tests.support.recorded_prometheus import RecordedPrometheus, running_prometheus
from tests.support.vllm_server import RunningVllmServer, running_vllm_server

STACK = "prod"
MODEL = "llama-3-1-8b"
POD = "vllm-7d9f8c6b5-live0"
SERVED_NAME = "tiny-live"
SYNC_SECONDS = 2.0
"""Scrape interval and HPA sync period of this test (the stack's are 15 s; compressed, see above)."""
IN_FLIGHT = 24
"""Requests kept open by the closed loop: with 2 running at a time, up to 22 wait, over four times
the prod queue target of 5 per pod. With 12 (10 waiting) a CI run of 2026-12-05 read the queue at 0
to 4 on every sync of its 400 requests: the requests spend part of their time in the API servers
and the client, not in the engine's queue, and how much depends on the machine."""
TOKENS_PER_REQUEST = 256
"""Only the time a request takes depends on this; the queue depth does not (closed loop)."""
MAX_REQUESTS = 400
LOAD_DEADLINE_SECONDS = 300
"""Bounds of the load: it stops once the signal is seen, or at either bound (then the test fails)."""
REQUEST_TIMEOUT_SECONDS = 300
STARTUP_TIMEOUT_SECONDS = 400


WAITING = "vllm:num_requests_waiting"
KV_CACHE = "vllm:kv_cache_usage_perc"


@dataclass(frozen=True)
class Sync:
    at: float
    phase: str
    waiting: float | None
    """The adapter's per-pod value of the queue (None: Prometheus has no sample)."""
    kv_cache: float | None
    desired: int | None
    """The HPA's recommendation; None when no metric had a value (it keeps the current count)."""


def _prod_model() -> ModelConfig:
    from infra.stack_checks import load_stack

    [model] = [m for m in load_stack(STACK).models if m.name == MODEL]
    return model


def _rendered_vllm_args(model: ModelConfig) -> list[str]:
    [workload] = model_workloads(rendered(STACK), model.namespace)
    [container] = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    return list(container["args"])


def _rendered_adapter_rules() -> list[dict[str, Any]]:
    [release] = [r for r in rendered(STACK).helm_releases if r["name"] == PROMETHEUS_ADAPTER_RELEASE]
    rules: list[dict[str, Any]] = release["values"]["rules"]["custom"]
    return rules


@pytest.fixture(scope="module")
def model() -> ModelConfig:
    model = _prod_model()
    assert model.autoscaling.enabled and model.autoscaling.backend == "hpa"
    return model


@pytest.fixture(scope="module")
def api_server_count(model: ModelConfig) -> int:
    args = _rendered_vllm_args(model)
    count = int(args[args.index("--api-server-count") + 1])
    assert count > 1, "the prod model must run several API servers for this test to mean anything"
    return count


@pytest.fixture(scope="module")
def live_server(
    tiny_model_dir: Path, api_server_count: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningVllmServer]:
    with running_vllm_server(
        [
            str(tiny_model_dir),
            "--load-format",
            "dummy",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "2",
            "--api-server-count",
            str(api_server_count),
            "--served-model-name",
            SERVED_NAME,
        ],
        log_path=tmp_path_factory.mktemp("vllm-live") / "vllm-serve.log",
        startup_timeout_seconds=STARTUP_TIMEOUT_SECONDS,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def prometheus(
    live_server: RunningVllmServer, model: ModelConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RecordedPrometheus]:
    workdir = tmp_path_factory.mktemp("prometheus-live")
    labels = {"namespace": model.namespace, "pod": POD, "container": "vllm"}
    config = {
        "global": {"scrape_interval": f"{SYNC_SECONDS:g}s", "scrape_timeout": f"{SYNC_SECONDS:g}s"},
        "scrape_configs": [
            {
                "job_name": f"{model.namespace}/vllm",
                "static_configs": [{"targets": [f"127.0.0.1:{live_server.port}"], "labels": labels}],
            }
        ],
    }
    with running_prometheus(json.dumps(config), workdir, workdir / "tsdb") as server:
        yield server


def _complete(base_url: str) -> int:
    body = json.dumps(
        {
            "model": SERVED_NAME,
            "prompt": "the queue grows",
            "max_tokens": TOKENS_PER_REQUEST,
            "min_tokens": TOKENS_PER_REQUEST,
            "ignore_eos": True,
            "temperature": 0,
        }
    ).encode()
    request = urllib.request.Request(
        f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
        return int(response.status)


class Autoscaler:
    """Each sync: the adapter's per-pod values from Prometheus, then the HPA's recommendation."""

    def __init__(self, prometheus: RecordedPrometheus, model: ModelConfig) -> None:
        self.prometheus = prometheus
        self.model = model
        rules = {rule["name"]["as"]: rule for rule in _rendered_adapter_rules()}
        self.rules = {
            m.metric: rules[SIGNALS[m.metric].custom_metric_name] for m in model.autoscaling.metrics
        }
        self.syncs: list[Sync] = []

    def pod_value(self, metric: str) -> float | None:
        query = adapter_query(self.rules[metric], namespace=self.model.namespace, pods=[POD])
        values = self.prometheus.query(query, time.time())
        return next(iter(values.values()), None)

    def sync(self, phase: str) -> Sync:
        """One HPA sync over the one live pod (current = 1). A metric without a value is left out, as
        the HPA does; with none at all it cannot recommend and keeps the current count (None here)."""
        current, autoscaling = 1, self.model.autoscaling
        values = {m.metric: self.pod_value(m.metric) for m in autoscaling.metrics}
        recommendations = [
            desired_replicas(current, value, m.target_average_value)
            for m in autoscaling.metrics
            if (value := values[m.metric]) is not None
        ]
        desired = min(max(max(recommendations), 1), autoscaling.max_replicas) if recommendations else None
        step = Sync(time.time(), phase, values.get(WAITING), values.get(KV_CACHE), desired)
        self.syncs.append(step)
        return step

    def report(self) -> str:
        return "\n".join(
            f"{s.phase:5} waiting={s.waiting} kv={s.kv_cache} desired={s.desired}" for s in self.syncs
        )


@dataclass
class ClosedLoopLoad:
    """`IN_FLIGHT` threads, each sending one request after another until `stop` is set or the bounds
    are reached: the number of open requests stays at `IN_FLIGHT` however long each one takes."""

    base_url: str
    stop: threading.Event = field(default_factory=threading.Event)
    statuses: Counter[int | str] = field(default_factory=Counter)
    sent: int = 0
    started: float = field(default_factory=time.monotonic)
    threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _take_one(self) -> bool:
        with self._lock:
            if self.stop.is_set() or self.sent >= MAX_REQUESTS:
                return False
            if time.monotonic() - self.started > LOAD_DEADLINE_SECONDS:
                return False
            self.sent += 1
            return True

    def _worker(self) -> None:
        while self._take_one():
            try:
                status: int | str = _complete(self.base_url)
            except Exception as error:  # recorded, asserted on below
                status = type(error).__name__
            with self._lock:
                self.statuses[status] += 1

    def __enter__(self) -> ClosedLoopLoad:
        self.started = time.monotonic()
        self.threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(IN_FLIGHT)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=REQUEST_TIMEOUT_SECONDS)
        assert not any(thread.is_alive() for thread in self.threads), "a request outlived its timeout"

    @property
    def exhausted(self) -> bool:
        with self._lock:
            return self.sent >= MAX_REQUESTS or time.monotonic() - self.started > LOAD_DEADLINE_SECONDS

    def summary(self) -> str:
        return (
            f"load: {self.sent} requests sent ({IN_FLIGHT} kept open, {TOKENS_PER_REQUEST} tokens each) "
            f"in {time.monotonic() - self.started:.1f} s; answers {dict(self.statuses)}"
        )


def test_replicas_follow_the_queue_up_and_back_down(
    live_server: RunningVllmServer,
    prometheus: RecordedPrometheus,
    model: ModelConfig,
    api_server_count: int,
) -> None:
    autoscaler = Autoscaler(prometheus, model)
    target = next(m.target_average_value for m in model.autoscaling.metrics if m.metric == WAITING)
    # Idle, before the first request: with several API servers vLLM 0.32.0 exports the scheduler
    # gauges only once stats have arrived (multiprocess mode, `mostrecent`), so the adapter may find
    # no series yet and the HPA keeps the current count (docs/autoscaling.md, "Proven live").
    for _ in range(3):
        time.sleep(SYNC_SECONDS)
        idle = autoscaler.sync("idle")
        assert idle.desired in (None, 1), autoscaler.report()

    # The load: IN_FLIGHT requests kept open until a sync has seen the queue at its target and the
    # recommendation above one pod, or a bound is reached. (The gauge is read at sync instants from
    # several API processes, so single reads may dip while requests are replaced; the loop waits.)
    seen = False
    with ClosedLoopLoad(live_server.base_url) as load:
        while not seen and not load.exhausted:
            time.sleep(SYNC_SECONDS)
            step = autoscaler.sync("load")
            seen = step.waiting is not None and step.waiting >= target and (step.desired or 0) > 1
    print(load.summary())
    assert set(load.statuses) == {200}, load.summary()

    # After: the queue drains and the recommendation comes back to one pod.
    deadline = time.monotonic() + 60
    while True:
        time.sleep(SYNC_SECONDS)
        after = autoscaler.sync("after")
        if after.desired == 1 or time.monotonic() > deadline:
            break

    report = autoscaler.report()
    print(report)
    # The adapter's discovery: each rendered rule's seriesQuery matches the live pod's series.
    for metric, rule in autoscaler.rules.items():
        found = prometheus.series(rule["seriesQuery"])
        assert {series["pod"] for series in found} == {POD}, (metric, rule["seriesQuery"], found)
    assert seen, f"no sync saw the queue at its target within the load's bounds: {load.summary()}\n{report}"
    load_syncs = [step for step in autoscaler.syncs if step.phase == "load" and step.desired is not None]
    peak = max(load_syncs, key=lambda step: step.desired or 0)
    # Several API servers answered /metrics, and the queue they report is the engine's own.
    assert api_server_count > 1
    assert peak.waiting is not None and peak.waiting >= target, report
    assert peak.desired is not None and peak.desired > 1, report
    assert autoscaler.syncs[-1].desired == 1, report
    assert autoscaler.syncs[-1].waiting == 0, report
