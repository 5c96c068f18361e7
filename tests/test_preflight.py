"""The multi-node pre-flight's Job (issue 50, components/preflight.py) is the group's own pod contract
with the checks' script, and `vllm-platform preflight` prints it or says why it cannot. The script's
run across two nodes is tests/e2e/test_preflight.py; its admission and placement on a control plane,
tests/test_deploy_multi_node.py."""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from components import workloads
from components.leader_worker_set import LWS_KIND
from components.pod_files import vllm_platform_preflight as script
from components.preflight import (
    JOB_NAME_LABEL,
    NAME,
    SCRIPT_FILE,
    PreflightError,
    preflight_namespace,
    preflight_objects,
)
from domain.capacity.plan import plan_platform
from domain.catalogue.efa_interfaces import efa_bandwidth_gbps, efa_instance_types
from domain.config.loader import STACKS_DIR
from infra.cli import EXIT_INVALID_CONFIG, main
from infra.stack_checks import load_stack
from tests.conftest import REPO_ROOT

MODEL = "llama-3-1-405b"


@pytest.fixture(scope="module")
def multinode() -> Any:
    return load_stack("multinode")


@pytest.fixture(scope="module")
def objects(multinode: Any) -> list[dict[str, Any]]:
    return preflight_objects(multinode, multinode.models[0])


def _kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def _worker(config: Any) -> dict[str, Any]:
    model = config.models[0]
    _, kind, spec = workloads.workload(config, model, plan_platform(config).models[model.name], "vllm")
    assert kind == LWS_KIND
    return spec["leaderWorkerTemplate"]["workerTemplate"]["spec"]


def test_the_job_runs_one_pod_per_node_of_a_group_in_its_own_namespace(objects: list[dict[str, Any]]) -> None:
    namespace = _kind(objects, "Namespace")["metadata"]
    assert namespace["name"] == f"vllm-preflight-{MODEL}"
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {
        namespace["name"]
    }
    job = _kind(objects, "Job")["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == 2
    assert job["backoffLimit"] == 0  # a failed check is the answer
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == NAME
    service = _kind(objects, "Service")["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    assert service["selector"] == {JOB_NAME_LABEL: NAME}
    (container,) = pod["containers"]
    assert f"--leader-address={NAME}-0.{NAME}" in container["args"]  # <pod>.<subdomain>, as LWS names leaders
    assert _kind(objects, "ConfigMap")["data"] == {SCRIPT_FILE.name: SCRIPT_FILE.read_text()}


def test_its_pods_carry_the_group_members_contract(multinode: Any, objects: list[dict[str, Any]]) -> None:
    worker = _worker(multinode)
    server = worker["containers"][0]
    pod = _kind(objects, "Job")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == server["image"]
    assert container["resources"] == server["resources"]  # 8 GPUs, 32 EFA devices, CPU, memory
    assert container["securityContext"] == server["securityContext"]
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"] == worker["securityContext"]
    assert pod["nodeSelector"] == worker["nodeSelector"] and pod["tolerations"] == worker["tolerations"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    for name in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_USE_HUGE_PAGE", "NCCL_NET"):
        assert env[name] == next(e["value"] for e in server["env"] if e["name"] == name)
    assert "VLLM_API_KEY" not in env  # it reads no weights and serves nothing
    assert "priorityClassName" not in pod  # never preempts a serving pod
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert dshm == next(v for v in worker["volumes"] if v["name"] == "dshm")
    assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v or "hostPath" in v or "csi" in v]
    terms = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["topologyKey"] for t in terms] == ["topology.kubernetes.io/zone"]
    assert terms[0]["labelSelector"] == {"matchLabels": {JOB_NAME_LABEL: NAME}}


def test_the_arguments_ask_for_every_gpu_and_efa_device_and_half_the_efa_bandwidth(
    objects: list[dict[str, Any]],
) -> None:
    (container,) = _kind(objects, "Job")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "node"
    assert "--nodes=2" in args and "--processes-per-node=8" in args
    assert "--backend=nccl" in args and "--device=cuda" in args
    assert "--require-efa" in args and "--efa-devices=32" in args
    assert efa_bandwidth_gbps("p5.48xlarge") == 3200
    assert "--min-bus-bandwidth-gbps=1600" in args
    # The script's own parser takes every rendered argument.
    parsed = script.parser().parse_args(args)
    assert parsed.nodes == 2 and parsed.efa_devices == 32 and parsed.min_bus_bandwidth_gbps == 1600


def test_every_object_passes_kubernetes_validate_strict(
    multinode: Any, objects: list[dict[str, Any]]
) -> None:
    for obj in objects:
        kubernetes_validate.validate(obj, multinode.cluster.kubernetes_version, strict=True)


def test_a_one_node_model_or_a_type_without_a_published_bandwidth_is_refused_with_the_fix(
    tmp_path: Path, multinode: Any
) -> None:
    dev = load_stack("dev")
    with pytest.raises(PreflightError, match="runs on one node"):
        preflight_objects(dev, dev.models[0])
    data = yaml.safe_load((STACKS_DIR / "Pulumi.multinode.yaml").read_text())
    data["config"]["vllm-platform:node_groups"]["gpu"]["h100"]["instance_types"] = ["g6e.24xlarge"]
    data["config"]["vllm-platform:models"][0]["architecture"] = {"preset": "llama-3.1-8b"}
    data["config"]["vllm-platform:models"][0]["gpus_per_replica"] = 4
    unknown = tmp_path / "Pulumi.unknown.yaml"
    unknown.write_text(yaml.safe_dump(data))
    config = load_stack("unknown", stack_file=unknown)
    assert efa_bandwidth_gbps("g6e.24xlarge") is None and "g6e.24xlarge" in efa_instance_types()
    with pytest.raises(PreflightError, match="pass --min-bus-bandwidth-gbps"):
        preflight_objects(config, config.models[0])
    assert "--min-bus-bandwidth-gbps=150" in _args(config, 150.0)


def _args(config: Any, minimum: float | None = None) -> list[str]:
    objects = preflight_objects(config, config.models[0], min_bus_bandwidth_gbps=minimum)
    return _kind(objects, "Job")["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_command_prints_the_objects_or_exits_2_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "preflight.yaml"
    assert main(["preflight", "multinode", "--model", MODEL, "--out", str(out)]) == 0
    printed = list(yaml.safe_load_all(out.read_text()))
    assert [o["kind"] for o in printed] == ["Namespace", "ConfigMap", "Service", "NetworkPolicy", "Job"]
    assert preflight_namespace(load_stack("multinode").models[0]) in capsys.readouterr().err
    assert main(["preflight", "multinode", "--model", "no-such-model"]) == EXIT_INVALID_CONFIG
    assert "has no model 'no-such-model' (its models: llama-3-1-405b)" in capsys.readouterr().err
    assert main(["preflight", "dev", "--model", load_stack("dev").models[0].name]) == EXIT_INVALID_CONFIG
    assert "runs on one node" in capsys.readouterr().err


# --- the script's checks, on their inputs -------------------------------------------------------------


def test_bus_bandwidth_is_nccl_tests_definition() -> None:
    # 1 GiB in 10 ms over 16 ranks: algorithm 107.4 GB/s, bus x 2(15)/16 = 201.3 GB/s = 1610.6 Gbit/s.
    assert script.bus_bandwidth_gbps(1 << 30, 0.010, 16) == pytest.approx(1610.6, rel=1e-4)
    assert script.bus_bandwidth_gbps(1 << 30, 0.010, 2) == pytest.approx(858.99, rel=1e-4)
    assert script.bus_bandwidth_gbps(1 << 30, 0.010, 1) == 0.0


def test_the_bandwidth_check_fails_below_the_floor() -> None:
    assert script.bandwidth_check(1700.0, 1600.0, 16)["ok"] is True
    below = script.bandwidth_check(40.0, 1600.0, 16)
    assert below["ok"] is False and "40.00 Gbit/s" in below["detail"] and "minimum 1600" in below["detail"]


def _facts(memlock: str | int, fi_info: dict[str, Any]) -> dict[str, Any]:
    return {"locked_memory": {"soft_kib": memlock, "hard_kib": memlock}, "fi_info": fi_info}


def test_the_node_checks_need_unlimited_locked_memory_and_every_efa_device() -> None:
    found = {"found": True, "path": "/opt/amazon/efa/bin/fi_info", "returncode": 0}
    every = {**found, "domains": [f"rdmap{i}s0-rdm" for i in range(32)]}
    assert all(c["ok"] for c in script.node_checks(_facts("unlimited", every), True, 32))
    limited = script.node_checks(_facts(8192, every), True, 32)
    assert [c["ok"] for c in limited] == [False, True] and "ulimit -l 8192" in limited[0]["detail"]
    fewer = script.node_checks(_facts("unlimited", {**found, "domains": ["rdmap0s0-rdm"]}), True, 32)
    assert fewer[1]["ok"] is False and "found 1 device(s)" in fewer[1]["detail"]
    missing = script.node_checks(
        _facts("unlimited", {"found": False, "error": "no fi_info", "domains": []}), True, 32
    )
    assert missing[1]["ok"] is False
    # Without EFA (a CPU run, a type without it) locked memory is reported, not a condition.
    assert all(
        c["ok"]
        for c in script.node_checks(_facts(64, {"found": False, "error": "x", "domains": []}), False, 0)
    )


def test_the_node_facts_are_this_containers_own() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    facts = script.node_facts(0)
    shown = "unlimited" if soft == resource.RLIM_INFINITY else soft // 1024
    assert facts["locked_memory"]["soft_kib"] == shown
    assert facts["index"] == 0 and isinstance(facts["kernel_rdma_devices"], list)


def test_the_network_is_read_from_a_real_nccl_log(tmp_path: Path) -> None:
    """tests/data/nccl-2.28.9-h100-socket.log is NCCL's own log from the script's NCCL path on one lab
    H100 (no EFA); the script reads the network it chose, and the plugin lines, from it."""
    log = (REPO_ROOT / "tests" / "data" / "nccl-2.28.9-h100-socket.log").read_text()
    (tmp_path / f"nccl-preflight.vm.{os.getpid()}.log").write_text(log)
    found = script.nccl_network(tmp_path)
    assert found["networks"] == ["Socket"]
    assert any("NET/Plugin: Could not find: libnccl-net.so" in line for line in found["lines"])
    assert any("NCCL version 2.28.9" in line for line in found["lines"])
