"""Scale to zero through KEDA's real operator on the real control plane (issue 35).

The stack is tests/stacks/Pulumi.cluster.yaml with the TP=2 model as prod has it (canary Rollout,
`autoscaling.min_replicas: 0`, its L40S group at min_size 0) and the stack's own keys at their
minimums so the test takes minutes: `idle_seconds_before_zero` 60, `keda_polling_interval_seconds` 5.
Its full `vllm-platform render` is applied (the Rollout, the ScaledObject and the charts' CRDs they
are of, as Tier 1 does); Argo Rollouts' controller and KEDA's operator run as processes
(tests/cluster/control_plane.py). The ScaledObject's `serverAddress` is left as rendered: inside the
network namespace its name resolves (the namespace's own hosts file) to a real Prometheus on
loopback, which scrapes a real vllm-router 0.1.17 run with the model router's rendered arguments
(single-model mode, no worker: the model is at zero) under the labels the router PodMonitor gives.

Then, with the real operator: at rest the model has no pod; one request the router holds wakes it
(0 -> 1, a pod Running on the L40S group, KWOK standing in for the kubelet); once the client hangs up
(no vLLM runs to serve it) and the idle window and cooldown pass, it goes back to 0. The measured
times are written to out/deploy-tests/scale-to-zero.json.

Not run here: KEDA's metrics adapter, so the 1 -> N path (the HPA KEDA creates reads external
metrics through it) is not exercised; the cluster autoscaler (the L40S nodes exist at max_size).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from components.autoscaling import ROUTER_DEMAND_TRIGGER
from components.router_layout import model_router_container_name
from domain.config import load_stack_config
from domain.labels import MODEL_SERIES_LABEL, ROUTER_NAMESPACE
from tests.cluster.control_plane import Cluster, ClusterError, start_keda_operator, start_rollouts_controller
from tests.cluster.fixtures import (
    CLUSTER_STACK_FILE,
    REPO,
    cluster_for,
    render_objects,
    require_chart_cache,
    require_cluster_tools,
)
from tests.cluster.netns import stop_process
from tests.cluster.placement import node_groups_by_node
from tests.support.vllm_router import (
    RouterVenvMissingError,
    require_router_python,
    without_kubernetes_discovery,
)

pytestmark = pytest.mark.cluster

MODEL = "qwen2-5-7b-tp2"
NAMESPACE = f"vllm-{MODEL}"
GPU_GROUP = "l40s"
IDLE_SECONDS = 60  # autoscaling.idle_seconds_before_zero's minimum
POLLING_SECONDS = 5  # autoscaling.keda_polling_interval_seconds's minimum
SCRAPE_SECONDS = 5
AT_REST_SECONDS = 30
"""How long the model must stay at zero with no demand: six of KEDA's polls."""
ARTEFACT = REPO / "out" / "deploy-tests" / "scale-to-zero.json"


def _to_zero_stack(path: Path) -> Path:
    """The cluster stack with MODEL as prod runs it: to zero, on a canary Rollout, its group at
    min_size 0 (max_size 3 rather than prod's 4: the canary's surge fits, and KWOK makes fewer nodes)."""
    document = yaml.safe_load(CLUSTER_STACK_FILE.read_text())
    config = document["config"]
    config["vllm-platform:node_groups"]["gpu"][GPU_GROUP].update(min_size=0, desired_size=0, max_size=3)
    for model in config["vllm-platform:models"]:
        if model["name"] == MODEL:
            model["autoscaling"].update(
                min_replicas=0,
                idle_seconds_before_zero=IDLE_SECONDS,
                keda_polling_interval_seconds=POLLING_SECONDS,
            )
            model["rollout"] = {"strategy": "canary"}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _model_router_arguments(objects: list[dict[str, Any]], container_name: str) -> list[str]:
    """The rendered arguments of MODEL's router container (its hold: retries and backoff), without
    Kubernetes discovery: in the namespace the router has no API access, and the model has no pod."""
    (router,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"].get("namespace") == ROUTER_NAMESPACE
    ]
    containers = router["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == container_name]
    return without_kubernetes_discovery(container["args"])


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _demand_trigger(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (scaled_object,) = [
        o for o in objects if o["kind"] == "ScaledObject" and o["metadata"]["namespace"] == NAMESPACE
    ]
    return next(t for t in scaled_object["spec"]["triggers"] if t["name"] == ROUTER_DEMAND_TRIGGER)


def _prometheus_config(router_metrics_port: str) -> dict[str, Any]:
    """The router's model router scraped as the router PodMonitor labels it (namespace, model)."""
    return {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "scrape_configs": [
            {
                "job_name": "vllm-router",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{router_metrics_port}"],
                        "labels": {"namespace": ROUTER_NAMESPACE, MODEL_SERIES_LABEL: MODEL},
                    }
                ],
            }
        ],
    }


def _curl(cluster: Cluster, url: str, timeout: float = 10) -> str | None:
    result = cluster.netns.run(
        ["curl", "-sf", "-m", str(int(timeout)), url], timeout=timeout + 5, check=False
    )
    return result.stdout if result.returncode == 0 else None


def _demand(cluster: Cluster, base_url: str, query: str) -> float | None:
    """The demand trigger's query as KEDA sends it, answered by the Prometheus in the namespace."""
    result = cluster.netns.run(
        [
            "curl",
            "-sf",
            "-m",
            "10",
            "--get",
            f"{base_url}/api/v1/query",
            "--data-urlencode",
            f"query={query}",
        ],
        timeout=15,
        check=False,
    )
    if result.returncode != 0:
        return None
    samples = json.loads(result.stdout)["data"]["result"]
    return float(samples[0]["value"][1]) if samples else None


def _replicas(cluster: Cluster) -> int | None:
    """The Rollout's spec.replicas (what KEDA writes through /scale); None while unset."""
    return cluster.get("rollouts.argoproj.io", namespace=NAMESPACE, name="vllm")["spec"].get("replicas")


def _pods(cluster: Cluster) -> list[dict[str, Any]]:
    """The model's vLLM pods that are not on their way out."""
    return [
        p
        for p in cluster.get_selected("pods", f"vllm-platform/model={MODEL}")
        if p["metadata"]["namespace"] == NAMESPACE and not p["metadata"].get("deletionTimestamp")
    ]


def _running_on_gpu_group(cluster: Cluster) -> list[str]:
    groups = node_groups_by_node(cluster)
    return [
        p["spec"]["nodeName"]
        for p in _pods(cluster)
        if p.get("status", {}).get("phase") == "Running"
        and groups.get(p["spec"].get("nodeName", "")) == GPU_GROUP
    ]


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    require_cluster_tools(("rollouts-controller", "keda-operator"))
    require_chart_cache()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("needs Debian's prometheus (apt-get install prometheus; scripts/setup-test-tools.sh)")
    try:
        router_python = require_router_python()
    except RouterVenvMissingError as error:
        pytest.skip(str(error))
    workdir = tmp_path_factory.mktemp("scale-to-zero")
    stack = _to_zero_stack(workdir / "Pulumi.to-zero.yaml")
    objects = render_objects("cluster", workdir / "render", stack_file=stack)
    trigger = _demand_trigger(objects)
    address = urlsplit(trigger["metadata"]["serverAddress"])
    prometheus_url = f"http://127.0.0.1:{address.port}"
    query = trigger["metadata"]["query"]
    config = load_stack_config("cluster", stack_file=stack)
    model = next(m for m in config.models if m.name == MODEL)
    router_args = _model_router_arguments(objects, model_router_container_name(model))
    router_port, metrics_port = _option(router_args, "--port"), _option(router_args, "--prometheus-port")
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(_prometheus_config(metrics_port)))

    observed: dict[str, Any] = {"router_arguments": router_args, "demand_query": query}
    with cluster_for(config, workdir / "cluster") as cluster:
        # The rendered Service name resolves to loopback for what starts from here (KEDA among them).
        cluster.netns.resolve({address.hostname: "127.0.0.1"})
        logs = cluster.workdir / "logs"
        cluster.netns.start(
            [str(router_python), "-m", "vllm_router.launch_router", *router_args],
            log=logs / "vllm-router.log",
        )
        cluster.netns.start(
            [
                prometheus,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{address.port}",
            ],
            log=logs / "prometheus.log",
        )
        cluster.wait_for(
            "vllm-router's /liveness", lambda: _curl(cluster, f"http://127.0.0.1:{router_port}/liveness")
        )
        cluster.wait_for("Prometheus ready", lambda: _curl(cluster, f"{prometheus_url}/-/ready"))

        def start_controllers() -> None:
            start_rollouts_controller(cluster)
            start_keda_operator(cluster)

        results = cluster.apply_in_dependency_order(objects, once_crds_established=start_controllers)
        observed["apply_errors"] = [
            line for result in results for line in result.stderr.splitlines() if line.startswith("Error")
        ]
        try:
            _run_scenario(cluster, observed, prometheus_url, query, router_port)
        except ClusterError as error:
            observed["error"] = str(error)
        observed["scaled_object_status"] = cluster.get(
            "scaledobjects.keda.sh", namespace=NAMESPACE, name="vllm"
        ).get("status", {})
        ARTEFACT.parent.mkdir(parents=True, exist_ok=True)
        ARTEFACT.write_text(
            json.dumps({k: v for k, v in observed.items() if k != "router_arguments"}, indent=2)
        )
        print(f"\nscale to zero through KEDA {json.dumps(_summary(observed))} (all: {ARTEFACT})")
        with contextlib.suppress(OSError):
            shutil.copyfile(logs / "keda-operator.log", ARTEFACT.with_name("scale-to-zero-keda-operator.log"))
        yield observed


def _summary(observed: dict[str, Any]) -> dict[str, Any]:
    keys = ("at_rest_replicas", "activation_seconds", "pod_running_seconds", "scale_in_seconds", "error")
    return {key: observed[key] for key in keys if key in observed}


def _run_scenario(
    cluster: Cluster, observed: dict[str, Any], prometheus_url: str, query: str, router_port: str
):
    # At rest: no request has reached the router; the model must settle at zero and stay there.
    cluster.wait_for("the model at rest with no pod", lambda: not _pods(cluster), timeout=180)
    samples = []
    deadline = time.monotonic() + AT_REST_SECONDS
    while time.monotonic() < deadline:
        samples.append((_replicas(cluster), len(_pods(cluster)), _demand(cluster, prometheus_url, query)))
        time.sleep(POLLING_SECONDS)
    observed["at_rest_samples"] = samples
    observed["at_rest_replicas"] = max(pods for _, pods, _ in samples)

    # One request, held by the router while no worker exists; each held attempt counts.
    body = json.dumps({"model": "Qwen/Qwen2.5-7B-Instruct", "messages": [{"role": "user", "content": "hi"}]})
    sent = time.monotonic()
    request = cluster.netns.start(
        [
            "curl", "-s", "-m", "900", "-H", "content-type: application/json", "-d", body,
            f"http://127.0.0.1:{router_port}/v1/chat/completions",
        ],
        log=cluster.workdir / "logs" / "held-request.log",
    )  # fmt: skip
    try:
        cluster.wait_for(
            "KEDA to scale the Rollout 0 -> 1",
            lambda: (_replicas(cluster) or 0) >= 1,
            timeout=120,
            interval=0.5,
        )
        observed["activation_seconds"] = round(time.monotonic() - sent, 1)
        observed["demand_when_woken"] = _demand(cluster, prometheus_url, query)
        observed["nodes"] = cluster.wait_for(
            f"a pod Running on the {GPU_GROUP} group", lambda: _running_on_gpu_group(cluster), timeout=120
        )
        observed["pod_running_seconds"] = round(time.monotonic() - sent, 1)
        observed["request_still_held"] = request.poll() is None
    finally:
        # No vLLM runs behind KWOK's pod to answer: the client hangs up, and the router stops
        # retrying (its attempts stop counting): the last demand the model sees.
        stop_process(request, grace_seconds=2)
    last_request = time.monotonic()
    observed["replicas_after_wake"] = _replicas(cluster)
    cluster.wait_for(
        "KEDA to scale the Rollout 1 -> 0 and its pod to go",
        lambda: _replicas(cluster) == 0 and not _pods(cluster),
        timeout=IDLE_SECONDS + 120,
        interval=0.5,
    )
    observed["scale_in_seconds"] = round(time.monotonic() - last_request, 1)
    observed["demand_after_scale_in"] = _demand(cluster, prometheus_url, query)


def test_at_rest_the_model_has_no_pod(scaled):
    assert "at_rest_replicas" in scaled, scaled.get("error")
    assert not scaled["apply_errors"], scaled["apply_errors"]
    assert scaled["at_rest_replicas"] == 0, scaled["at_rest_samples"]


def test_a_held_request_wakes_the_model_on_its_gpu_group(scaled):
    assert "pod_running_seconds" in scaled, scaled.get("error")
    # The router was still holding the request when the replica ran.
    assert scaled["request_still_held"]
    assert scaled["demand_when_woken"] == 1
    # One poll after the first scrape that saw the held attempts, with room for a slow machine.
    assert scaled["activation_seconds"] <= SCRAPE_SECONDS + POLLING_SECONDS + 20, scaled
    assert scaled["replicas_after_wake"] == 1


def test_without_requests_it_goes_back_to_zero_after_the_idle_window(scaled):
    assert "scale_in_seconds" in scaled, scaled.get("error")
    # Not before the window has passed (less one scrape: the last counted attempt precedes the hang-up),
    # and within a window plus a scrape, a poll, the cooldown and slack.
    assert IDLE_SECONDS - SCRAPE_SECONDS <= scaled["scale_in_seconds"] <= IDLE_SECONDS + 45, scaled
    assert scaled["demand_after_scale_in"] == 0
