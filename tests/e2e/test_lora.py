"""LoRA adapters served by the real vLLM 0.32.0 (CPU build) and routed by the real vllm-router 0.1.17.

The server runs with the arguments the lora test stack (tests/stacks/Pulumi.lora.yaml) renders for
its model, changed only where a CPU and the tiny model need it (as tests/e2e/conftest.py does for
the dev stack): the tiny model with dummy weights, its context length, loopback. Its two adapters
are made by PEFT for the tiny model (tests/support/tiny_lora.py, ranks from the stack) and laid out
where the preloader puts them (`<root>/.lora-adapters/<model>/<adapter>/<revision>/`), so the
rendered `--lora-modules` paths are used as they are, below a temporary root.

The routers are the rendered router pod's (tests/e2e/test_router.py does the same for the dev
stack): the model's router in front of the server, the front router in multi-model mode with the
model registered by the real registrar's `reconcile` under every served name of the rendered
registrar ConfigMap, and the registrar's `/v1/models` server.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from components.vllm_arguments import LORA_ADAPTERS_DIR
from domain.architecture import ModelShape
from domain.capacity.lora import lora_gpu_bytes
from domain.vllm_metrics import LORA_REQUESTS_INFO
from infra.stack_checks import load_stack
from router.registrar import RouterClient, Worker, desired_workers, reconcile
from tests.conftest import TEST_STACKS_DIR, model_workloads, rendered
from tests.e2e.conftest import (
    API_KEY,
    build_tiny_adapter,
    cpu_arguments,
    healthy_vllm_server,
    pod_auth_environment,
)
from tests.e2e.test_router import loopback_arguments
from tests.support.tiny_model import TINY_LLAMA_CONFIG
from tests.support.vllm_router import (
    RouterVenvMissingError,
    RunningRouter,
    models_server,
    require_router_python,
    start_router,
    stop_router,
)
from tests.support.vllm_server import (
    REPO_ROOT,
    RunningVllmServer,
    vllm_subprocess_env,
)

pytestmark = pytest.mark.e2e

LORA_STACK = TEST_STACKS_DIR / "Pulumi.lora.yaml"
CONFIG = load_stack("lora", stack_file=LORA_STACK)
MODEL = CONFIG.models[0]
assert MODEL.lora is not None and len(MODEL.lora.adapters) >= 2
BASE = MODEL.openai_model_name
ADAPTERS = [adapter.name for adapter in MODEL.lora.adapters]
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TIMEOUT_SECONDS = 120
PROMPT = "def main():"
AMX_PERMISSION = REPO_ROOT / "tests" / "support" / "amx_permission"
"""On PYTHONPATH of every vLLM process here: with LoRA the CPU build runs eager, whose attention
kernel needs the AMX permission nothing else asks for (see its sitecustomize.py)."""


def with_amx_permission(env: dict[str, str]) -> dict[str, str]:
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(AMX_PERMISSION), env.get("PYTHONPATH")]))}


def rendered_lora_server_container() -> dict:
    (workload,) = model_workloads(rendered("lora", LORA_STACK))
    (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    return container


def lora_cpu_arguments(rendered_args: list[str], model_dir: Path, adapter_root: Path) -> list[str]:
    """cpu_arguments, with the adapters of --lora-modules under `adapter_root` instead of the pod's
    volume."""

    def adapter_here(token: str) -> str:
        if "=" in token and f"/{LORA_ADAPTERS_DIR}/" in token:  # a `name=path` of --lora-modules
            name, path = token.split("=", 1)
            below = path.split(f"/{LORA_ADAPTERS_DIR}/", 1)[1]
            return f"{name}={adapter_root}/{LORA_ADAPTERS_DIR}/{below}"
        return token

    return cpu_arguments(rendered_args, model_dir, adapter_here)


@pytest.fixture(scope="module")
def adapter_root(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each adapter of the stack, made by PEFT at its declared rank, where the preloader puts it."""
    assert MODEL.lora is not None
    root = tmp_path_factory.mktemp("model-root")
    for seed, adapter in enumerate(MODEL.lora.adapters, start=1):
        directory = root / LORA_ADAPTERS_DIR / MODEL.name / adapter.name / adapter.source.revision
        build_tiny_adapter(vllm_python, directory, adapter.rank, seed, adapter.name)
        assert json.loads((directory / "adapter_config.json").read_text())["r"] == adapter.rank
    return root


@pytest.fixture(scope="module")
def lora_server(
    tiny_model_dir: Path, adapter_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningVllmServer]:
    args = lora_cpu_arguments(list(rendered_lora_server_container()["args"]), tiny_model_dir, adapter_root)
    env = with_amx_permission(
        {"VLLM_API_KEY": API_KEY, **pod_auth_environment(tmp_path_factory.mktemp("pod-auth-mount-lora"))}
    )
    with healthy_vllm_server(
        args, env=env, log_path=tmp_path_factory.mktemp("vllm-lora") / "vllm-serve.log"
    ) as server:
        yield server


def complete(
    base_url: str, model: str, prompt: str = PROMPT, headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/completions",
        headers=AUTH if headers is None else headers,
        json={"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0},
        timeout=TIMEOUT_SECONDS,
    )


def text_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def metric_samples(server: RunningVllmServer, name: str) -> list[tuple[str, float]]:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    samples = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, value = line.rsplit(" ", 1)
            samples.append((labels, float(value)))
    return samples


def test_the_server_lists_each_adapter_with_the_model_as_its_parent(lora_server: RunningVllmServer) -> None:
    response = httpx.get(f"{lora_server.base_url}/v1/models", headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    listed = {entry["id"]: entry for entry in response.json()["data"]}
    assert sorted(listed) == sorted([BASE, *ADAPTERS])
    assert {name: listed[name]["parent"] for name in ADAPTERS} == dict.fromkeys(ADAPTERS, BASE)


def test_each_adapter_answers_differently_from_the_base_and_the_same_every_time(
    lora_server: RunningVllmServer,
) -> None:
    answers = {name: text_of(complete(lora_server.base_url, name)) for name in [BASE, *ADAPTERS]}
    assert len(set(answers.values())) == len(answers), answers
    again = {name: text_of(complete(lora_server.base_url, name)) for name in ADAPTERS}
    assert again == {name: answers[name] for name in ADAPTERS}


def test_an_unknown_adapter_gets_openais_404(lora_server: RunningVllmServer) -> None:
    response = complete(lora_server.base_url, "no-such-adapter")
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert "no-such-adapter" in error["message"] and "does not exist" in error["message"]


def test_adapters_need_the_models_key(lora_server: RunningVllmServer) -> None:
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        assert complete(lora_server.base_url, ADAPTERS[0], headers=headers).status_code == 401
    # Loading adapters is an operator route (issue 34): the model's key gets 403 before vLLM, which
    # (lora.runtime_loading off by default) does not even offer the route.
    response = httpx.post(
        f"{lora_server.base_url}/v1/load_lora_adapter",
        headers=AUTH,
        json={"lora_name": "uploaded", "lora_path": "/tmp"},
        timeout=30,
    )
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "operator_route"


def test_adapter_requests_count_in_the_base_models_signals(lora_server: RunningVllmServer) -> None:
    """What autoscaling and the dashboards read: an adapter's requests are the base model's work
    (vLLM labels every family with the served model name), and vllm:lora_requests_info names the
    adapters of the batch."""

    def succeeded() -> float:
        return sum(
            v
            for labels, v in metric_samples(lora_server, "vllm:request_success_total")
            if f'model_name="{BASE}"' in labels
        )

    before = succeeded()
    for name in ADAPTERS:
        text_of(complete(lora_server.base_url, name, prompt=f"count me {name}"))
    assert succeeded() == before + len(ADAPTERS)
    names = {labels for labels, _ in metric_samples(lora_server, "vllm:request_success_total")}
    assert not [labels for labels in names if any(f'"{a}"' in labels for a in ADAPTERS)], names
    info = metric_samples(lora_server, LORA_REQUESTS_INFO)
    assert info, f"{LORA_REQUESTS_INFO} is not exported"
    assert all(f'max_lora="{MODEL.lora.max_loras}"' in labels for labels, _ in info), info  # type: ignore[union-attr]
    seen = {name for labels, _ in info for name in ADAPTERS if name in labels}
    assert seen == set(ADAPTERS), info


# --- through the router --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraRouterPod:
    front: RunningRouter
    model_router: RunningRouter
    worker: Worker


@pytest.fixture(scope="module")
def router_pod(
    lora_server: RunningVllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoraRouterPod]:
    try:
        require_router_python()
    except RouterVenvMissingError as error:
        pytest.fail(str(error), pytrace=False)
    result = rendered("lora", LORA_STACK)
    (deployment,) = result.find("Deployment", namespace="vllm-router")
    containers = {
        c["name"]: list(c["args"])
        for c in deployment["spec"]["template"]["spec"]["containers"]
        if c["command"] == ["vllm-router"]
    }
    (model_container,) = [name for name in containers if name.startswith("route-")]
    (config_map,) = result.find("ConfigMap", namespace="vllm-router")
    (rendered_worker,) = desired_workers(json.loads(config_map["data"]["registrar.json"])).values()
    assert rendered_worker.names == (BASE, *ADAPTERS)
    logs = tmp_path_factory.mktemp("lora-routers")
    started: list[RunningRouter] = []
    try:
        started.append(
            start_router(
                loopback_arguments(containers[model_container], [lora_server.base_url]),
                log_path=logs / "model.log",
            )
        )
        started.append(start_router(loopback_arguments(containers["router"]), log_path=logs / "front.log"))
        model_router, front = started
        worker = Worker(
            model_router.base_url,
            rendered_worker.model_id,
            rendered_worker.policy,
            rendered_worker.served_names,
        )
        client = RouterClient(front.base_url)
        assert reconcile(client, {worker.url: worker}) == ([worker.url], [])
        yield LoraRouterPod(front=front, model_router=model_router, worker=worker)
    finally:
        for running in started:
            stop_router(running)


def test_registrar_routes_every_served_name_and_then_leaves_it_alone(router_pod: LoraRouterPod) -> None:
    client = RouterClient(router_pod.front.base_url)
    assert client.models() == {BASE, *ADAPTERS}
    (listed,) = client.workers().values()
    assert listed.model_id == BASE  # the front lists one id per URL: the model's own, posted last
    assert reconcile(client, {router_pod.worker.url: router_pod.worker}) == ([], [])


def test_an_adapter_reaches_the_base_models_replicas_through_the_router(
    router_pod: LoraRouterPod, lora_server: RunningVllmServer
) -> None:
    for name in [BASE, *ADAPTERS]:
        routed = complete(router_pod.front.base_url, name)
        assert routed.json()["model"] == name
        assert text_of(routed) == text_of(complete(lora_server.base_url, name)), name


def test_an_unknown_adapter_gets_openais_404_through_the_router(router_pod: LoraRouterPod) -> None:
    response = complete(router_pod.front.base_url, "no-such-adapter")
    assert response.status_code == 404, response.text
    assert "does not exist" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def models_endpoint(router_pod: LoraRouterPod) -> Iterator[str]:
    with models_server([router_pod.worker]) as url:
        yield url


def test_the_unified_models_list_shows_the_adapters_with_their_parent_for_the_key(
    models_endpoint: str,
) -> None:
    response = httpx.get(f"{models_endpoint}/v1/models", headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    listed = {entry["id"]: entry for entry in response.json()["data"]}
    assert sorted(listed) == sorted([BASE, *ADAPTERS])
    assert {name: listed[name]["parent"] for name in ADAPTERS} == dict.fromkeys(ADAPTERS, BASE)
    one = httpx.get(f"{models_endpoint}/v1/models/{ADAPTERS[0]}", headers=AUTH, timeout=30)
    assert one.status_code == 200 and one.json()["parent"] == BASE
    assert httpx.get(f"{models_endpoint}/v1/models", timeout=30).status_code == 401


# --- capacity ------------------------------------------------------------------------------------------

MEMORY_PROBE = """
import json, sys
from vllm import LLM
llm = LLM(model=sys.argv[1], load_format="dummy", enable_lora=True, max_loras=int(sys.argv[2]),
          max_lora_rank=int(sys.argv[3]), max_model_len=512, enforce_eager=True)

def stacked(worker):
    total, dtypes = 0, set()
    for module in worker.model_runner.model.modules():
        for name in ("lora_a_stacked", "lora_b_stacked"):
            tensors = getattr(module, name, None)
            if tensors is None:
                continue
            for tensor in tensors if isinstance(tensors, (tuple, list)) else [tensors]:
                total += tensor.numel() * tensor.element_size()
                dtypes.add(str(tensor.dtype))
    return {"bytes": total, "dtypes": sorted(dtypes)}

print("LORA-MEMORY " + json.dumps(llm.collective_rpc(stacked)[0]))
"""


def test_the_planner_counts_the_lora_slots_the_real_vllm_allocates(
    vllm_python: Path, tiny_model_dir: Path
) -> None:
    """The CPU server's own log has no line fine enough for a tiny model's slots (it logs the
    process's whole resident memory), so the tensors vLLM allocates are counted inside it."""
    max_loras, rank = 3, 32
    completed = subprocess.run(
        [str(vllm_python), "-c", MEMORY_PROBE, str(tiny_model_dir), str(max_loras), str(rank)],
        cwd=REPO_ROOT,
        env=with_amx_permission(vllm_subprocess_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})),
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("LORA-MEMORY ")]
    assert completed.returncode == 0 and lines, completed.stderr[-3000:]
    measured = json.loads(lines[-1].removeprefix("LORA-MEMORY "))
    (dtype,) = measured["dtypes"]
    dtype_bytes = {"torch.bfloat16": 2, "torch.float16": 2, "torch.float32": 4}[dtype]
    shape = ModelShape.from_values({**TINY_LLAMA_CONFIG})
    assert measured["bytes"] == lora_gpu_bytes(shape, 1, max_loras, rank, dtype_bytes)


# --- the GPU benchmark's adapters ------------------------------------------------------------------------

PEFT_LOADS = """
import json, sys, torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM
from tests.support.tiny_model import TINY_LLAMA_CONFIG

model = PeftModel.from_pretrained(LlamaForCausalLM(LlamaConfig(**TINY_LLAMA_CONFIG)), sys.argv[1])
state = model.state_dict()
saved = load_file(sys.argv[1] + "/adapter_model.safetensors")
loaded = {k: k.replace(".weight", ".default.weight") for k in saved}
missing = sorted(k for k, name in loaded.items() if name not in state)
same = all(torch.equal(state[loaded[k]].to(v.dtype), v) for k, v in saved.items() if k not in missing)
print("PEFT-LOAD " + json.dumps({"tensors": len(saved), "missing": missing, "same": same,
                                 "rank": model.peft_config["default"].r}))
"""


def test_benchmark_adapters_are_what_peft_loads(
    vllm_python: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """bench/lora/make_adapters.py (the GPU table's random rank-16 adapters of the 8B shape) writes
    PEFT's names and shapes: shown on the tiny model's shape, loaded by PEFT itself."""
    made = subprocess.run(
        [
            str(vllm_python),
            "bench/lora/make_adapters.py",
            str(tmp_path),
            "--config-json",
            str(tiny_model_dir / "config.json"),
            "--rank",
            "16",
        ],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    loaded = subprocess.run(
        [str(vllm_python), "-c", PEFT_LOADS, str(tmp_path / "adapter-00")],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in loaded.stdout.splitlines() if line.startswith("PEFT-LOAD ")]
    assert loaded.returncode == 0 and lines, loaded.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("PEFT-LOAD "))
    layers = int(TINY_LLAMA_CONFIG["num_hidden_layers"])  # type: ignore[call-overload]
    assert result == {"tensors": layers * 7 * 2, "missing": [], "same": True, "rank": 16}
