"""The multi-node pre-flight (issue 50) runs across two "nodes" on the CPU build: the script the
rendered Job ships (components/pod_files/vllm_platform_preflight.py), with the rendered pod's arguments,
in two network namespaces joined by a veth pair (tests/cluster/netns.py `two_nodes`), one per pod,
each its own `JOB_COMPLETION_INDEX`, the real torchrun and torch.distributed's gloo between them.

What changes between the rendered pod and this test, and nothing else: gloo on the CPU instead of NCCL
on GPUs (`--backend`, `--device`), the leader's address (the veth's, not `preflight-0.preflight`,
which needs the cluster's DNS), a free port, a 16 MiB buffer instead of 1 GiB, and no EFA
(`--require-efa` and the device count dropped: nothing here has EFA; the second test keeps them and
shows what the pre-flight says on a node without it). The stack is the multinode stack on one L40S GPU
per node, as tests/e2e/test_multi_node_engine.py runs it; its type has no published EFA bandwidth, so
the floor is given, as a user of such a type would (the rendered default is tested in
tests/test_preflight.py). The bandwidth it measures is the veth's on a shared 2-core machine, asserted
only to be measured and above a floor far below any run's; what a p5 reaches is for the user's nodes
(docs/multi-node.md, "Pre-flight").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from components.pod_files import vllm_platform_preflight as script
from components.preflight import preflight_objects
from infra.stack_checks import load_stack
from tests.cluster.netns import TWO_NODE_ADDRESSES, NetworkNamespace, two_nodes
from tests.e2e.test_multi_node_engine import TENSOR_ACROSS_TWO_NODES, _two_node_stack
from tests.support.vllm_server import REPO_ROOT, free_port, require_vllm_venv

pytestmark = pytest.mark.e2e

RUN_SECONDS = 300
"""Two processes importing torch and forming a gloo world on a busy two-core machine."""
FLOOR_GBPS = 0.01
"""10 Mbit/s: far below any veth on any machine, so a run fails only when nothing was measured."""
BUFFER_BYTES = 16 << 20


def _rendered_arguments(tmp_path: Path) -> tuple[list[str], dict[str, Any]]:
    stack = _two_node_stack(tmp_path, TENSOR_ACROSS_TWO_NODES, tenants=())
    config = load_stack("multinode-cpu", stack_file=stack)
    objects = preflight_objects(config, config.models[0], min_bus_bandwidth_gbps=FLOOR_GBPS)
    (job,) = [o for o in objects if o["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container["args"], container


def _on_the_cpu(arguments: list[str], leader_address: str, port: int, *, keep_efa: bool) -> list[str]:
    replaced = {
        "--backend": "gloo",
        "--device": "cpu",
        "--leader-address": leader_address,
        "--port": str(port),
    }
    adapted = []
    for argument in arguments:
        name = argument.split("=", 1)[0]
        if name in replaced:
            adapted.append(f"{name}={replaced[name]}")
        elif name in ("--require-efa", "--efa-devices") and not keep_efa:
            continue
        else:
            adapted.append(argument)
    return [*adapted, f"--bytes={BUFFER_BYTES}", "--iterations=5", "--warmup=1"]


def _node(
    namespace: NetworkNamespace | None, arguments: list[str], index: int, log: Path
) -> subprocess.Popen:
    argv = [str(require_vllm_venv()), str(script.__file__), *arguments]
    env = {
        "PATH": "/usr/bin:/bin",
        "JOB_COMPLETION_INDEX": str(index),
        "HOME": str(log.parent),
        "PYTHONPATH": str(REPO_ROOT),
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            namespace.command(argv) if namespace else argv,
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _reports(log: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line.split(script.REPORT_PREFIX, 1)[1])
        for line in log.read_text(errors="replace").splitlines()
        if script.REPORT_PREFIX in line
    ]


def _wait(process: subprocess.Popen, log: Path) -> int:
    try:
        return process.wait(timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        from tests.cluster.netns import stop_process

        stop_process(process)
        pytest.fail(f"the pre-flight ran past {RUN_SECONDS} s:\n{log.read_text(errors='replace')[-3000:]}")


def test_the_rendered_preflight_reports_an_all_reduce_across_two_nodes(tmp_path: Path) -> None:
    arguments, container = _rendered_arguments(tmp_path)
    assert "--nodes=2" in arguments and "--processes-per-node=1" in arguments  # one L40S per node
    assert "--require-efa" in arguments  # g6e.8xlarge has one EFA device: the rendered pod checks it
    leader_address, _ = TWO_NODE_ADDRESSES
    cpu_arguments = _on_the_cpu(arguments, leader_address, free_port(), keep_efa=False)
    logs = [tmp_path / "node-0.log", tmp_path / "node-1.log"]
    with two_nodes(("vp-pf-leader", "vp-pf-worker")) as (leader, worker):
        processes = [_node(node, cpu_arguments, i, logs[i]) for i, node in enumerate((leader, worker))]
        codes = [_wait(process, log) for process, log in zip(processes, logs, strict=True)]
    text = [log.read_text(errors="replace") for log in logs]
    assert codes == [0, 0], "\n---\n".join(t[-3000:] for t in text)

    leader_reports, worker_reports = _reports(logs[0]), _reports(logs[1])
    (all_reduce,) = [r for r in leader_reports if "all_reduce" in r]
    assert all_reduce["world_size"] == 2 and all_reduce["rank"] == 0
    result = all_reduce["all_reduce"]
    assert result["backend"] == "gloo" and result["correct"] is True
    assert result["bytes"] == BUFFER_BYTES
    assert result["bus_bandwidth_gbps"] >= FLOOR_GBPS, result
    # Bus bandwidth as nccl-tests defines it, from the time it measured: 2(n-1)/n x bytes / time.
    expected = script.bus_bandwidth_gbps(BUFFER_BYTES, result["seconds_per_operation"], 2)
    assert result["bus_bandwidth_gbps"] == pytest.approx(expected, rel=1e-3)
    # Each node reported its own facts, by its own index, with its checks passed.
    nodes = [r for r in [*leader_reports, *worker_reports] if "node" in r]
    assert sorted(r["node"]["index"] for r in nodes) == [0, 1]
    assert all(r["ok"] for r in nodes)
    for report in nodes:
        assert report["node"]["locked_memory"]["soft_kib"] is not None
        assert report["node"]["fi_info"]["found"] in (True, False)
        # The pod's libfabric and NCCL environment as rendered (the kubelet passes it; here the test).
        assert {c["name"] for c in report["checks"]} == {"locked memory", "all-reduce processes"}
    # The rendered pod carries the group's EFA environment, which the report lists on a real pod.
    assert {"FI_PROVIDER", "NCCL_NET"} <= {e["name"] for e in container["env"]}
    assert "PASS all-reduce bus bandwidth" in text[0]


def test_on_a_node_without_efa_the_preflight_fails_and_says_what_is_missing(tmp_path: Path) -> None:
    """The rendered pod's EFA checks kept (`--require-efa`, one device), on this machine, which has no
    libfabric, no EFA device and no NCCL: the run fails, naming each; a one-node world, since what fails
    is the node's own."""
    arguments, _ = _rendered_arguments(tmp_path)
    cpu_arguments = _on_the_cpu(arguments, "127.0.0.1", free_port(), keep_efa=True)
    cpu_arguments = [a if not a.startswith("--nodes=") else "--nodes=1" for a in cpu_arguments]
    cpu_arguments = [
        a if not a.startswith("--min-bus") else "--min-bus-bandwidth-gbps=0" for a in cpu_arguments
    ]
    log = tmp_path / "node.log"
    code = _wait(_node(None, cpu_arguments, 0, log), log)
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    assert "FAIL libfabric EFA provider: fi_info is not in this image" in text
    assert "FAIL NCCL network: backend gloo" in text
    memlock = script.locked_memory()["soft_kib"]
    assert ("PASS locked memory" if memlock == "unlimited" else "FAIL locked memory") in text
    (node,) = [r for r in _reports(log) if "node" in r]
    assert node["ok"] is False
    assert not next(c for c in node["checks"] if c["name"] == "libfabric EFA provider")["ok"]
