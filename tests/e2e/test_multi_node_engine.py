"""The rendered leader and worker arguments of a multi-node replica form one vLLM engine across two
processes (issue 42): vLLM 0.32.0's CPU build, tensor parallel 2 across two "nodes", the worker
`--headless`, answering a completion on the leader's API and through the model router.

The two nodes are two network namespaces of the test joined by a veth pair (tests/cluster/netns.py):
each has an `eth0` with an address only the two hold (LEADER_ADDRESS, WORKER_ADDRESS), no default
route, and its own hosts file naming this machine's host name with that address, as the kubelet
writes a pod's /etc/hosts (torch.distributed's gloo binds to the address its host name resolves to).
So every byte between leader and worker crosses the veth, as it crosses the network between pods.

The stack is stacks/Pulumi.multinode.yaml varied to one GPU per node and tensor parallelism
across the two nodes, so the CPU build can run it. What changes between the rendered pods and this
test: the LWS variables and the downward API are expanded as the kubelet would (rank 0 and 1, the
leader's DNS name as LWS injects it, which both "nodes" resolve to the leader's address (LEADER_NAME),
`VLLM_HOST_IP` = each pod's address), the master port is a free one, and `cpu_arguments` swaps
in the tiny model with dummy weights and its context length
(tests/e2e/conftest.py). The stack's rendered model router (the pinned vllm-router) then serves a
completion in front of the leader from the worker's namespace, as the router pod reaches a leader on
another node: its rendered discovery selects group leaders only
(`leaderworkerset.sigs.k8s.io/worker-index=0`, checked here on its arguments); outside a cluster it is
given the leader's URL instead.

A second test runs the same two processes as two data-parallel ranks (`data_parallel_size: 2`):
vLLM infers the worker's rank from `--node-rank`, and the leader's API spreads requests over both.
That stack has tenants (issue 49): the leader runs vLLM's default of one API-server process per
data-parallel rank, two, and a tenant with a share of 2 gets exactly 2 sequences in flight over both
(the third request 429, a batch of two prompts the whole share), with the engines held busy.

Found while writing it: the same two processes with pipeline parallelism 2 (tensor 1) form the group
and pass /health on the CPU build, but the first request kills the engine (vLLM 0.32.0 CPU,
scheduler.update_from_output KeyError on the request id, under the pipeline's batch queue); tensor
parallelism across the two processes serves.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from components import secrets as pod_secrets
from components import server_auth
from components.leader_worker_set import HOST_ADDRESS_ENV, LWS_KIND, WORKER_INDEX_LABEL
from components.server_auth import CONFIG_MAP_NAME
from domain.config.loader import STACKS_DIR, load_stack_config
from infra.render import render_stack
from tests.cluster.netns import TWO_NODE_ADDRESSES, NetworkNamespace, two_nodes
from tests.e2e.conftest import API_KEY, cpu_arguments
from tests.e2e.test_router import loopback_arguments
from tests.support.vllm_router import require_router_python, start_router, stop_router
from tests.support.vllm_server import (
    REPO_ROOT,
    RunningVllmServer,
    free_port,
    paused_engines,
    require_vllm_venv,
    start_vllm_server,
    stop_vllm_server,
    vllm_subprocess_env,
    wait_until_healthy,
)

pytestmark = pytest.mark.e2e

GROUP_TIMEOUT_SECONDS = 420
"""Two CPU processes of vLLM on a busy two-core machine: each imports torch and compiles."""
CLIENT_TIMEOUT_SECONDS = 300
"""A test's requests from inside a namespace (each completion is bounded at 120 s on its own)."""

LEADER_ADDRESS, WORKER_ADDRESS = TWO_NODE_ADDRESSES
LEADER_NAME = "vllm-0.vllm-0.vllm-llama-3-1-8b"
"""What LWS puts in `LWS_LEADER_ADDRESS` for the first group's leader (`<leader>.<group's headless
Service>.<namespace>`; tests/test_deploy_multi_node.py reads it on the live pods): the rendered
`--master-addr`, which with data parallelism vLLM also binds its ZeroMQ sockets to (issue 50). Both
namespaces resolve it to the leader's address through their hosts files, as the cluster's DNS would."""


def _two_node_stack(tmp_path: Path, parallelism: dict[str, Any], tenants: Sequence[dict[str, Any]]) -> Path:
    """The multinode stack varied to one GPU per node (an L40S group), so the CPU build can run it,
    with `tenants` (none: one key for the model)."""
    data = yaml.safe_load((STACKS_DIR / "Pulumi.multinode.yaml").read_text())
    config = data["config"]
    if tenants:
        config["vllm-platform:tenants"] = list(tenants)
    config["vllm-platform:node_groups"]["gpu"] = {
        "l40s": {"instance_types": ["g6e.8xlarge"], "min_size": 0, "desired_size": 2, "max_size": 2}
    }
    (model,) = config["vllm-platform:models"]
    model.update(
        name="llama-3-1-8b",
        served_model_name="meta-llama/Llama-3.1-8B-Instruct",
        architecture={"preset": "llama-3.1-8b"},
        gpu_group="l40s",
        gpus_per_replica=1,
        parallelism={"nodes_per_replica": 2, **parallelism},
        resources={
            "cpu_request_cores": 8,
            "memory_request_gib": 48,
            "memory_limit_gib": 96,
            "shm_size_gib": 8,
        },
    )
    model["vllm"] = {"max_model_len": 8192, "max_num_seqs": 64}
    path = tmp_path / "Pulumi.multinode-cpu.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


TENSOR_ACROSS_TWO_NODES = {
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 1,
    "tensor_parallel_across_nodes": True,
}
DATA_PARALLEL_OVER_TWO_NODES = {"data_parallel_size": 2}
"""Two engines (data-parallel ranks), one per node, as a MoE model's data × expert group runs; the
tiny model is dense, which vLLM serves the same way without the experts' all-to-all."""
SERVED_NAME = "meta-llama/Llama-3.1-8B-Instruct"
LIMITED, BULK = "search", "bulk"
SHARE = 2
TENANTS = [
    {
        "name": LIMITED,
        "models": [SERVED_NAME],
        "api_key_secrets": [{"name": f"vllm-platform/multinode/tenants/{LIMITED}/api-key"}],
        "max_concurrent_requests": SHARE,  # one group: the pod's share is all of it
    },
    {
        # No limit of its own: the default share, half the group's engine slots (64 x 2 / 2).
        "name": BULK,
        "models": [SERVED_NAME],
        "api_key_secrets": [{"name": f"vllm-platform/multinode/tenants/{BULK}/api-key"}],
    },
]


def _auth_environment(render: Any, container: dict[str, Any], directory: Path) -> dict[str, str]:
    """The rendered auth ConfigMap where the container mounts it, as tests/e2e/conftest.py does, and
    the rendered middleware environment with each pod path (the ConfigMap's and the key mount, the
    pod's /dev/shm) a folder below `directory`; the tenants' keys written there as the CSI driver
    mounts them (`<tenant>.key0`, the tenant's prefix first; `tenant_key`)."""
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "auth-middleware")
    (config_map,) = [
        c
        for c in render.find("ConfigMap", CONFIG_MAP_NAME)
        if c["metadata"]["namespace"] == "vllm-llama-3-1-8b"
    ]
    (directory / "auth").mkdir()
    for file_name, text in config_map["data"].items():
        (directory / "auth" / file_name).write_text(text)
    rendered = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert rendered["PYTHONPATH"] == mount
    env = {"PYTHONPATH": f"{directory / 'auth'}:{REPO_ROOT}"}
    if "VLLM_PLATFORM_TENANTS" not in rendered:
        return {**env, "VLLM_API_KEY": API_KEY}
    local = {
        mount: directory / "auth",
        pod_secrets.TENANT_KEYS_MOUNT_PATH: directory / "tenant-keys",
        server_auth.STATE_DIR: directory / "shm",
    }
    for name, value in rendered.items():
        if name.startswith("VLLM_PLATFORM_"):
            for pod_path, here in local.items():
                value = value.replace(pod_path, str(here))
            env[name] = value
    (directory / "tenant-keys").mkdir()
    for tenant in json.loads(config_map["data"][server_auth.TENANTS_FILE])["tenants"]:
        key_file = directory / "tenant-keys" / pod_secrets.tenant_key_file_name(tenant, 0)
        key_file.write_text(tenant_key(tenant) + "\n")
    return env


def tenant_key(tenant: str) -> str:
    return f"tk-{tenant}_{API_KEY}"


def _expanded(args: list[str], rank: str, master_port: int) -> list[str]:
    expanded = [
        t.replace("$(LWS_WORKER_INDEX)", rank).replace("$(LWS_LEADER_ADDRESS)", LEADER_NAME) for t in args
    ]
    expanded[expanded.index("--master-port") + 1] = str(master_port)
    return expanded


def _pod_address_env(container: dict[str, Any], address: str) -> dict[str, str]:
    """The rendered `VLLM_HOST_IP` (the downward API's status.podIP) as the kubelet fills it in."""
    (entry,) = [e for e in container["env"] if e["name"] == HOST_ADDRESS_ENV]
    assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}, entry
    return {HOST_ADDRESS_ENV: address}


@dataclass(frozen=True)
class Group:
    """A running two-node group: the render, both processes and the namespaces they run in."""

    render: Any
    leader: RunningVllmServer
    worker: RunningVllmServer
    leader_node: NetworkNamespace
    worker_node: NetworkNamespace


@contextlib.contextmanager
def _running_group(
    parallelism: dict[str, Any],
    tiny_model_dir: Path,
    tmp_path: Path,
    tenants: Sequence[dict[str, Any]] = (),
) -> Iterator[Group]:
    """The rendered leader's and worker's arguments, the LWS variables and the pod address expanded
    as the kubelet would, run as two processes on two "nodes"; yielded once the leader's /health
    answers (asked from the worker's node, across the veth)."""
    render = render_stack(
        "multinode-cpu", stack_file=_two_node_stack(tmp_path, parallelism, tenants), allow_missing_charts=True
    )
    (lws,) = render.find(LWS_KIND, "vllm", "vllm-llama-3-1-8b")
    template = lws["spec"]["leaderWorkerTemplate"]
    leader_container = template["leaderTemplate"]["spec"]["containers"][0]
    worker_container = template["workerTemplate"]["spec"]["containers"][0]
    assert "--headless" in worker_container["args"]

    master_port = free_port()
    (tmp_path / "leader-pod").mkdir()
    (tmp_path / "worker-pod").mkdir()
    leader_env = _auth_environment(render, leader_container, tmp_path / "leader-pod")
    worker_env = _auth_environment(render, worker_container, tmp_path / "worker-pod")
    leader_args = cpu_arguments(_expanded(leader_container["args"], "0", master_port), tiny_model_dir)
    worker_args = cpu_arguments(_expanded(worker_container["args"], "1", master_port), tiny_model_dir)

    with two_nodes(leader_name=LEADER_NAME) as (leader_node, worker_node):
        worker_log = tmp_path / "worker.log"
        with worker_log.open("wb") as log:
            worker_process = subprocess.Popen(
                worker_node.command(
                    [str(require_vllm_venv()), "-m", "tests.support.vllm_server", "serve", *worker_args]
                ),
                cwd=REPO_ROOT,
                env=vllm_subprocess_env({**worker_env, **_pod_address_env(worker_container, WORKER_ADDRESS)}),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = RunningVllmServer(base_url="", port=0, process=worker_process, log_path=worker_log)
        leader = leader_node.call(
            start_vllm_server,
            leader_args,
            env={**leader_env, **_pod_address_env(leader_container, LEADER_ADDRESS)},
            log_path=tmp_path / "leader.log",
            host=LEADER_ADDRESS,
            command_prefix=leader_node.command([]),
            timeout=30,
        )
        try:
            worker_node.call(
                wait_until_healthy,
                leader,
                timeout_seconds=GROUP_TIMEOUT_SECONDS,
                timeout=GROUP_TIMEOUT_SECONDS + 30,
            )
            assert worker.process.poll() is None, worker.log_tail()
            yield Group(render, leader, worker, leader_node, worker_node)
        finally:
            stop_vllm_server(leader)
            stop_vllm_server(worker)


def test_rendered_leader_and_worker_form_one_engine_across_two_processes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with _running_group(TENSOR_ACROSS_TWO_NODES, tiny_model_dir, tmp_path) as group:
        leader, worker = group.leader, group.worker
        assert _argument(leader.process.args, "--tensor-parallel-size") == "2"
        group.worker_node.call(
            _assert_eight_token_completion,
            leader.base_url,
            "hello",
            leader.log_tail,
            timeout=CLIENT_TIMEOUT_SECONDS,
        )
        # One engine over both processes: the worker holds tensor rank 1 of a world of 2.
        worker_text = worker.log_path.read_text(errors="replace")
        assert "world_size=2 rank=1" in worker_text, worker.log_tail()
        assert "TP rank 1" in worker_text
        # The leader offers the worker its pod address (VLLM_HOST_IP) for the executor's queues.
        assert f"mq_connect_ip={LEADER_ADDRESS}" in leader.log_path.read_text(errors="replace")
        # The router pod on another node than the leader: the worker's namespace, across the veth.
        group.worker_node.call(
            _completion_through_the_model_router,
            group.render,
            leader.base_url,
            tmp_path,
            timeout=CLIENT_TIMEOUT_SECONDS,
        )


def test_rendered_data_parallel_ranks_serve_as_one_replica_across_two_processes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Data parallelism over the two "nodes": the rendered pods carry `--data-parallel-size 2` and no
    start rank; vLLM infers the worker's rank 1 from `--node-rank 1`. The leader's API spreads
    requests over both engines, and its /metrics reports both (the autoscaler reads leaders only).
    With tenants, a tenant's share holds over the leader's two API-server processes (issue 49)."""
    with _running_group(DATA_PARALLEL_OVER_TWO_NODES, tiny_model_dir, tmp_path, TENANTS) as group:
        leader, worker = group.leader, group.worker
        assert _argument(leader.process.args, "--data-parallel-size") == "2"
        # The leader's DNS name, as LWS injects it, is also vLLM's data-parallel (ZeroMQ) address.
        assert _argument(leader.process.args, "--master-addr") == LEADER_NAME
        assert "--data-parallel-start-rank" not in leader.process.args
        prompts = [f"request {index}" for index in range(8)]

        def eight_at_once() -> dict[str, float]:
            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                list(
                    pool.map(
                        lambda p: _assert_eight_token_completion(
                            leader.base_url, p, leader.log_tail, tenant_key(BULK)
                        ),
                        prompts,
                    )
                )
            return _finished_by_engine(leader.base_url)

        finished = group.worker_node.call(eight_at_once, timeout=CLIENT_TIMEOUT_SECONDS)
        assert set(finished) == {"0", "1"} and sum(finished.values()) == len(prompts), (
            finished,
            worker.log_tail(),
        )
        # vLLM's own inference from the rendered `--node-rank $(LWS_WORKER_INDEX)` (1 on the worker).
        worker_text = worker.log_path.read_text(errors="replace")
        assert "Inferred data_parallel_rank 1 from node_rank 1" in worker_text, worker.log_tail()

        # Issue 49: vLLM's default of one API-server process per data-parallel rank, which the
        # stack's share now counts (ModelConfig.api_server_count); each used to admit the whole share.
        leader_text = leader.log_path.read_text(errors="replace")
        assert "Defaulting api_server_count to data_parallel_size (2)" in leader_text, leader.log_tail()
        stack_file = tmp_path / "Pulumi.multinode-cpu.yaml"
        (model,) = load_stack_config("multinode-cpu", stack_file=stack_file).models
        assert model.api_server_count == 2
        tenants_file = tmp_path / "leader-pod" / "auth" / server_auth.TENANTS_FILE
        assert json.loads(tenants_file.read_text())["tenants"][LIMITED]["max_in_flight"] == SHARE
        group.worker_node.call(_share_over_both_api_server_processes, group, timeout=CLIENT_TIMEOUT_SECONDS)


HELD_WAIT_SECONDS = 60
"""Upper bound of the wait for held requests to show in the leader's in-flight gauge (a busy 2-core
machine; not a measurement)."""
PAST_THE_SHARE = 6
"""Requests sent past the share, each on a connection of its own, which the kernel spreads over the
leader's two API-server processes (SO_REUSEPORT): counting apart, one would admit some of them."""


def _completion_as(base_url: str, tenant: str, prompt: object, timeout: float = 120) -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/completions",
        headers={"Authorization": f"Bearer {tenant_key(tenant)}"},
        json={"model": SERVED_NAME, "prompt": prompt, "max_tokens": 4, "ignore_eos": True},
        timeout=timeout,
    )


def _requests_in_flight(base_url: str, tenant: str) -> float:
    """The middleware's gauge over both API-server processes (vLLM's multiprocess collector sums it)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    found = re.search(rf'^vllm_platform_tenant_requests_in_flight{{tenant="{tenant}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _held_until_in_flight(base_url: str, count: int) -> None:
    deadline = time.monotonic() + HELD_WAIT_SECONDS
    while _requests_in_flight(base_url, LIMITED) < count:
        assert time.monotonic() < deadline, (
            f"{count} requests of {LIMITED} not in flight within {HELD_WAIT_SECONDS} s"
        )
        time.sleep(0.2)


def _refused_past_the_share(base_url: str) -> list[int]:
    # A refused request is answered by the middleware at once; one admitted would wait for the paused
    # engines until its client gives up (60 s), failing the test with a timeout.
    return [_completion_as(base_url, LIMITED, "past", timeout=60).status_code for _ in range(PAST_THE_SHARE)]


def _share_over_both_api_server_processes(group: Group) -> None:
    """A tenant with a share of 2 (the rendered tenants file's `max_in_flight`), asked from another
    node: exactly 2 sequences in flight over the leader's two API-server processes while the engines
    are paused (SIGSTOP: what reached them stays in flight), whether 2 requests or 1 of 2 prompts."""
    url = group.leader.base_url
    # More sequences than the whole share: 400, it could never be admitted.
    too_many = _completion_as(url, LIMITED, ["a", "b", "c"])
    assert too_many.status_code == 400 and too_many.json()["error"]["code"] == "too_many_sequences"
    with concurrent.futures.ThreadPoolExecutor(SHARE) as pool:
        with paused_engines(group.leader, group.worker):
            held = [pool.submit(_completion_as, url, LIMITED, f"held {index}") for index in range(SHARE)]
            _held_until_in_flight(url, SHARE)
            assert _refused_past_the_share(url) == [429] * PAST_THE_SHARE
        assert [answer.result(timeout=120).status_code for answer in held] == [200] * SHARE
        # One request of two prompts: two sequences, the whole share.
        with paused_engines(group.leader, group.worker):
            batch = pool.submit(_completion_as, url, LIMITED, ["first", "second"])
            _held_until_in_flight(url, 1)
            assert _refused_past_the_share(url) == [429] * PAST_THE_SHARE
        answer = batch.result(timeout=120)
        assert answer.status_code == 200 and len(answer.json()["choices"]) == 2
    # Every sequence taken was given back.
    assert _completion_as(url, LIMITED, ["again", "and again"]).status_code == 200


def _argument(args: Sequence[str], flag: str) -> str:
    args = list(args)
    return args[args.index(flag) + 1]


def _finished_by_engine(base_url: str) -> dict[str, float]:
    """Finished requests on the leader's /metrics by the `engine` label (data-parallel rank)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    finished: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            value = float(line.rsplit(" ", 1)[1])
            if value:
                finished[labels["engine"]] = finished.get(labels["engine"], 0.0) + value
    return finished


def _assert_eight_token_completion(
    base_url: str, prompt: str, log_tail: Callable[[], str], key: str = API_KEY
) -> None:
    """A keyed 8-token completion from the group's model at `base_url` (the leader, or a router)."""
    response = httpx.post(
        f"{base_url}/v1/completions",
        headers={"Authorization": f"Bearer {key}"},
        # ignore_eos: the tiny model's dummy weights may pick the end token before the 8th.
        json={
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "prompt": prompt,
            "max_tokens": 8,
            "ignore_eos": True,
        },
        timeout=120,
    )
    assert response.status_code == 200, (response.text, log_tail())
    assert response.json()["usage"]["completion_tokens"] == 8


def _completion_through_the_model_router(render: Any, leader_url: str, tmp_path: Path) -> None:
    """The rendered model router's arguments, its discovery swapped for the leader's URL, answer a
    completion from the group (the router pod's path to the model)."""
    require_router_python()
    (deployment,) = render.find("Deployment", namespace="vllm-router")
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"].startswith("route-")
    ]
    # In the cluster the router finds the group's leaders only: workers serve no API.
    assert f"{WORKER_INDEX_LABEL}=0" in container["args"], container["args"]
    router = start_router(
        loopback_arguments(container["args"], [leader_url]), log_path=tmp_path / "router.log"
    )
    try:
        _assert_eight_token_completion(router.base_url, "hello again", router.log_tail)
    finally:
        stop_router(router)
