"""The HPA's own formula over series a real vLLM 0.32.0 server exported under load, evaluated by a
real Prometheus: one stream does not scale a model out, a growing queue does, and the GPU counter
the HPAs used to read (DCGM_FI_DEV_GPU_UTIL) would have scaled out on one stream.

The recording (tests/data/vllm-metrics/, bench/metrics/capture_vllm_metrics.py) has an idle minute,
one client sending one request after another, then eight clients on a server that runs two at a time
(`--max-num-seqs 2`), so six wait. Each HPA sync (every 15 s) the per-pod values come from the very
query the Prometheus Adapter sends (components/adapter_rules.py), asked of Prometheus 2.42 over
the recorded TSDB; the recommendation is Kubernetes' (pkg/controller/podautoscaler):
desired = ceil(current × average / target), unchanged while |average / target − 1| ≤ 0.1, the
largest over the metrics, within min/max replicas.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from components.adapter_rules import SIGNALS, adapter_query, adapter_rule
from domain.config.models import ModelConfig
from infra.stack_checks import load_stack
from tests.support.hpa_formula import HPA_SYNC_SECONDS, desired_replicas
from tests.support.recorded_prometheus import (
    RecordedPrometheus,
    Recording,
    recorded_prometheus,
    target_series,
)

PODS = ["vllm-5f4c9d8b7-q1w2e", "vllm-5f4c9d8b7-r3t4y"]
# issue 19: on an H200 with vLLM serving one stream, DCGM_FI_DEV_GPU_UTIL read 100 % (sampled every
# 0.5 s); the old default target was 80.
GPU_UTIL_AT_ONE_STREAM = 100
OLD_GPU_UTIL_TARGET = 80


def test_the_formula_is_kubernetes(tmp_path: Path) -> None:
    assert desired_replicas(2, 0, 5) == 0  # then raised to min_replicas
    assert desired_replicas(2, 5.4, 5) == 2  # within the 10 % tolerance
    assert desired_replicas(2, 6, 5) == 3
    assert desired_replicas(2, 100, 80) == 3


@pytest.fixture(scope="module")
def model() -> ModelConfig:
    [model] = [m for m in load_stack("prod").models if m.name == "llama-3-1-8b"]
    assert model.autoscaling.enabled and model.autoscaling.backend == "hpa"
    return model


@pytest.fixture(scope="module")
def recording() -> Recording:
    return Recording.load()


def _gpu_util_series(recording: Recording, namespace: str) -> str:
    """DCGM_FI_DEV_GPU_UTIL at the H200's one-stream reading, one GPU per pod, over the recording."""
    start, end = recording.phases["idle"][0], recording.phases["drain"][1]
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for gpu, pod in enumerate(PODS):
        labels = (
            f'gpu="{gpu}",UUID="GPU-{gpu:08d}",device="nvidia{gpu}",modelName="NVIDIA H200",'
            f'Hostname="ip-10-0-1-23",namespace="{namespace}",pod="{pod}",container="vllm"'
        )
        t = start
        while t <= end:
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {GPU_UTIL_AT_ONE_STREAM} {t:.3f}")
            t += 5
    return "\n".join(lines)


@pytest.fixture(scope="module")
def prometheus(
    recording: Recording, model: ModelConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RecordedPrometheus]:
    series = target_series(
        recording.openmetrics,
        namespace=model.namespace,
        model=model.name,
        pods=PODS,
        extra=_gpu_util_series(recording, model.namespace),
    )
    with recorded_prometheus(series, tmp_path_factory.mktemp("recorded-prometheus")) as server:
        yield server


def _syncs(recording: Recording, phase: str) -> list[float]:
    start, end = recording.phases[phase]
    count = int((end - start) // HPA_SYNC_SECONDS)
    return [start + HPA_SYNC_SECONDS * (index + 1) for index in range(count)]


def _pod_average(prometheus: RecordedPrometheus, series: str, namespace: str, at: float) -> float:
    """What the HPA averages: the adapter's per-pod values, over the pods it asked for."""
    query = adapter_query(
        adapter_rule(SIGNALS[series]) if series in SIGNALS else _legacy_rule(series),
        namespace=namespace,
        pods=PODS,
    )
    values = prometheus.query(query, at)
    assert len(values) == len(PODS), (query, values)
    return sum(values.values()) / len(values)


def _legacy_rule(series: str) -> dict:
    """The adapter rule the stack generated for DCGM_FI_DEV_GPU_UTIL before issue 19 (avg per pod)."""
    tensor = adapter_rule(SIGNALS["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"])
    return {**tensor, "seriesQuery": tensor["seriesQuery"].replace("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", series)}


def recommendations(
    prometheus: RecordedPrometheus, recording: Recording, model: ModelConfig, phase: str
) -> list[int]:
    autoscaling, current = model.autoscaling, model.autoscaling.min_replicas
    result = []
    for at in _syncs(recording, phase):
        desired = max(
            desired_replicas(
                current, _pod_average(prometheus, m.metric, model.namespace, at), m.target_average_value
            )
            for m in autoscaling.metrics
        )
        result.append(min(max(desired, autoscaling.min_replicas), autoscaling.max_replicas))
    return result


def test_one_stream_never_scales_the_model_out(
    prometheus: RecordedPrometheus, recording: Recording, model: ModelConfig
) -> None:
    steps = recommendations(prometheus, recording, model, "one-stream")
    assert len(steps) >= 3
    assert set(steps) == {model.autoscaling.min_replicas}, steps


def test_a_growing_queue_scales_the_model_out(
    prometheus: RecordedPrometheus, recording: Recording, model: ModelConfig
) -> None:
    steps = recommendations(prometheus, recording, model, "queue")
    # Scale-up has no stabilisation window: the first recommendation above current is acted on.
    assert max(steps) > model.autoscaling.min_replicas, steps


def test_the_old_gpu_utilisation_signal_would_scale_out_on_one_stream(
    prometheus: RecordedPrometheus, recording: Recording, model: ModelConfig
) -> None:
    current = model.autoscaling.min_replicas
    for at in _syncs(recording, "one-stream"):
        average = _pod_average(prometheus, "DCGM_FI_DEV_GPU_UTIL", model.namespace, at)
        assert average == GPU_UTIL_AT_ONE_STREAM
        assert desired_replicas(current, average, OLD_GPU_UTIL_TARGET) == current + 1
