"""Plot what an operator sees on the recorded load: the queue and KV-cache signals against their
autoscaling targets, the HPA's recommendation, and the queue alert's window. docs/operations.md
shows the result.

    .venv/bin/python -m bench.metrics.plot_recorded_load [OUT.png]

(default OUT: docs/img/operations-recorded-load.png)

Every value comes from a real Prometheus (Debian's 2.42) over tests/data/vllm-metrics/load.om,
queried with the stack's own queries: the adapter's per-pod query for the prod 8B model, and the
VllmRequestsQueued alert expression (components/alert_rules.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from components.adapter_rules import SIGNALS, adapter_query, adapter_rule
from components.alert_rules import model_alert_rules
from infra.stack_checks import load_stack
from tests.support.hpa_formula import desired_replicas
from tests.support.recorded_prometheus import (
    RECORDING_DIR,
    Recording,
    recorded_prometheus,
    target_series,
)

PODS = ["vllm-5f4c9d8b7-q1w2e", "vllm-5f4c9d8b7-r3t4y"]
STEP_SECONDS = 5
OUT = Path(__file__).resolve().parents[2] / "docs" / "img" / "operations-recorded-load.png"


def main(out: Path) -> None:
    config = load_stack("prod")
    [model] = [m for m in config.models if m.name == "llama-3-1-8b"]
    recording = Recording.load(RECORDING_DIR)
    start, end = recording.phases["idle"][0], recording.phases["drain"][1]
    [queued] = [
        r for r in model_alert_rules(model, config.monitoring.alerts) if r["alert"] == "VllmRequestsQueued"
    ]
    series = target_series(recording.openmetrics, namespace=model.namespace, model=model.name, pods=PODS)
    times, values, replicas, alert = [], {m.metric: [] for m in model.autoscaling.metrics}, [], []
    with tempfile.TemporaryDirectory() as workdir, recorded_prometheus(series, Path(workdir)) as prometheus:
        at = start + STEP_SECONDS
        while at <= end:
            times.append(at - start)
            desired = model.autoscaling.min_replicas
            for metric in model.autoscaling.metrics:
                query = adapter_query(
                    adapter_rule(SIGNALS[metric.metric]), namespace=model.namespace, pods=PODS
                )
                per_pod = prometheus.query(query, at)
                average = sum(per_pod.values()) / len(per_pod) if per_pod else 0.0
                values[metric.metric].append(average)
                desired = max(
                    desired,
                    desired_replicas(model.autoscaling.min_replicas, average, metric.target_average_value),
                )
            replicas.append(min(desired, model.autoscaling.max_replicas))
            alert.append(1 if prometheus.query(queued["expr"], at) else 0)
            at += STEP_SECONDS

    targets = {m.metric: m.target_average_value for m in model.autoscaling.metrics}
    figure, axes = plt.subplots(4, 1, figsize=(10, 9), sharex=True)
    waiting, kv = "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
    axes[0].plot(times, values[waiting], label="waiting per pod (adapter query)")
    axes[0].axhline(
        targets[waiting], color="tab:red", linestyle="--", label=f"HPA target {targets[waiting]:g}"
    )
    axes[0].set_ylabel("requests")
    axes[1].plot(times, values[kv], color="tab:green", label="KV-cache usage per pod")
    axes[1].axhline(targets[kv], color="tab:red", linestyle="--", label=f"HPA target {targets[kv]:g}")
    axes[1].axhline(
        model.slo.kv_cache_usage_ratio,
        color="tab:orange",
        linestyle=":",
        label=f"VllmKvCacheNearlyFull {model.slo.kv_cache_usage_ratio:g}",
    )
    axes[1].set_ylabel("fraction")
    axes[2].step(
        times,
        replicas,
        where="post",
        color="tab:purple",
        label="HPA recommendation (ceil(current × avg / target), tolerance 0.1)",
    )
    axes[2].axhline(
        model.autoscaling.min_replicas, color="grey", linestyle=":", label="min / current replicas"
    )
    axes[2].set_ylabel("replicas")
    axes[3].step(
        times,
        alert,
        where="post",
        color="tab:red",
        label=f"VllmRequestsQueued condition (queue never empty for {model.slo.queue_minutes} min)",
    )
    axes[3].set_ylabel("pending")
    axes[3].set_yticks([0, 1])
    for name, (phase_start, phase_end) in recording.phases.items():
        for axis in axes:
            axis.axvspan(
                phase_start - start,
                phase_end - start,
                alpha=0.06 if name != "queue" else 0.15,
                color="tab:blue",
            )
        axes[0].annotate(
            name,
            ((phase_start + phase_end) / 2 - start, axes[0].get_ylim()[1] * 0.9),
            ha="center",
            fontsize=8,
        )
    for axis in axes:
        axis.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("seconds into the recording (real vLLM 0.32.0 CPU server, --max-num-seqs 2)")
    figure.suptitle("prod llama-3-1-8b signals on recorded load: one stream, then 8 clients on 2 slots")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
