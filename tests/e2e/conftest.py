"""One real vLLM 0.32.0 (CPU build) server for the whole session, serving a tiny random Llama.

It is started with the arguments the stack renders for the dev stack's model (its Deployment's
`vllm serve` arguments, from the real program under mocks), changed only where a CPU and a tiny
model need it (see `server_arguments`), and with the API key only in the environment as
`VLLM_API_KEY`, as the pod gets it from the model's Kubernetes secret, never from argv. The API-key
middleware those arguments name is loaded as the pod loads it: the rendered ConfigMap's files in a
folder, and the rendered container's PYTHONPATH pointing there (`pod_auth_environment`).

The vLLM venv is required: without it every test here fails and says how to create it.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.vllm_server import (
    REPO_ROOT,
    RunningVllmServer,
    VllmServerError,
    VllmVenvMissingError,
    require_vllm_venv,
    start_vllm_server,
    stop_vllm_server,
    vllm_subprocess_env,
    wait_until_healthy,
)

API_KEY = f"e2e-{secrets.token_hex(8)}"
OPERATOR_KEY = f"e2e-operator-{secrets.token_hex(8)}"
"""The session server's operator key (issue 34), a file as `security.operator_key_secret` mounts it:
the dev stack sets none, so without it no key would reach the OpenAPI document the sweeps read."""
# About 80 s on an idle 2-core machine (most of it torch.compile), 165 s on a busy one.
STARTUP_TIMEOUT_SECONDS = 300
RENDERED_STACK = "dev"
# The tiny model has 4096 positions; the rendered 8192 is for the real model on a GPU.
CPU_MAX_MODEL_LEN = "512"


def rendered_server_arguments(stack: str = RENDERED_STACK) -> list[str]:
    """The `vllm serve` arguments of the first model's Deployment in `stack`, as rendered."""
    from tests.conftest import rendered

    for deployment in rendered(stack).find("Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "vllm":
                assert container["command"] == ["vllm", "serve"], container["command"]
                return list(container["args"])
    raise AssertionError(f"no vLLM Deployment rendered for stack {stack}")


def rendered_server_container(stack: str = RENDERED_STACK) -> dict:
    from tests.conftest import rendered

    for deployment in rendered(stack).find("Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "vllm":
                return container
    raise AssertionError(f"no vLLM Deployment rendered for stack {stack}")


@contextmanager
def healthy_vllm_server(
    args: Sequence[str], *, env: Mapping[str, str], log_path: Path, timeout_seconds: float = 300
) -> Iterator[RunningVllmServer]:
    """A started vLLM server, yielded once /health answers and stopped on exit, for a module's own
    fixture; one that never gets healthy fails the test with vLLM's message (its log's tail), not a
    fixture traceback."""
    server = start_vllm_server(args, env=env, log_path=log_path)
    try:
        wait_until_healthy(server, timeout_seconds=timeout_seconds)
    except VllmServerError as error:
        stop_vllm_server(server)
        pytest.fail(str(error), pytrace=False)
    try:
        yield server
    finally:
        stop_vllm_server(server)


def pod_auth_environment(directory: Path, stack: str = RENDERED_STACK) -> dict[str, str]:
    """Write the rendered auth ConfigMap where the container mounts it (below `directory`) and return
    the container's PYTHONPATH with the mount path replaced by that folder."""
    from components.server_auth import CONFIG_MAP_NAME
    from tests.conftest import rendered

    container = rendered_server_container(stack)
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "auth-middleware")
    config_map = next(
        c for c in rendered(stack).find("ConfigMap") if c["metadata"]["name"] == CONFIG_MAP_NAME
    )
    for file_name, text in config_map["data"].items():
        (directory / file_name).write_text(text)
    pythonpath = next(e["value"] for e in container["env"] if e["name"] == "PYTHONPATH")
    assert pythonpath == mount, (pythonpath, mount)
    # The repository stays on the path too, for the serve wrapper (tests.support.vllm_server);
    # the middleware itself is importable only from the ConfigMap's copy.
    return {"PYTHONPATH": os.pathsep.join([str(directory), str(REPO_ROOT)])}


def _option_value(args: list[str], option: str) -> str:
    return args[args.index(option) + 1]


def cpu_arguments(
    rendered_args: Sequence[str], model_dir: Path, rewrite: Callable[[str], str] = lambda token: token
) -> list[str]:
    """Rendered `vllm serve` arguments with only what a CPU run of a tiny model needs changed: the
    weights (the tiny model, dummy weights), the context length (the tiny model's), no --host/--port
    (the helper picks a free port on loopback), and each other token through `rewrite` (a path on the
    pod's volume to its place here). Everything else is exactly what the pod runs."""
    args = [str(model_dir)]
    index = 1
    while index < len(rendered_args):
        token = rendered_args[index]
        if token in ("--host", "--port"):
            index += 2
            continue
        if token == "--max-model-len":
            args += [token, CPU_MAX_MODEL_LEN]
            index += 2
            continue
        args.append(rewrite(token))
        index += 1
    return [*args, "--load-format", "dummy"]


def server_arguments(model_dir: Path) -> list[str]:
    """The rendered arguments of the dev stack's model, for a CPU run of the tiny model (cpu_arguments)."""
    return cpu_arguments(rendered_server_arguments(), model_dir)


SERVED_MODEL_NAME = _option_value(rendered_server_arguments(), "--served-model-name")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM venv's python; fails (never skips) when the venv is missing."""
    try:
        return require_vllm_venv()
    except VllmVenvMissingError as error:
        pytest.fail(str(error), pytrace=False)


def build_tiny_adapter(vllm_python: Path, directory: Path, rank: int, seed: int, name: str) -> Path:
    """A PEFT LoRA adapter for the tiny model (tests/support/tiny_lora.py), made in the vLLM venv
    (which has PEFT); its weights depend on `seed`. Fails the test with PEFT's error."""
    built = subprocess.run(
        [str(vllm_python), "-m", "tests.support.tiny_lora", str(directory), str(rank), str(seed)],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if built.returncode != 0:
        pytest.fail(f"PEFT could not make adapter {name}:\n{built.stderr[-3000:]}", pytrace=False)
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built in the vLLM venv, which has the `tokenizers` library the main venv does not need.
    out_dir = tmp_path_factory.mktemp("tiny-llama")
    built = subprocess.run(
        [str(vllm_python), "-m", "tests.support.tiny_model", str(out_dir)],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if built.returncode != 0:
        pytest.fail(f"building the tiny model failed:\n{built.stderr[-3000:]}", pytrace=False)
    return out_dir


@pytest.fixture(scope="session")
def booting_vllm_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningVllmServer]:
    """The session's server, started but maybe not healthy yet; stopped at the end of the session."""
    keys = tmp_path_factory.mktemp("key-mount")
    (keys / "platform-operator.key").write_text(OPERATOR_KEY + "\n")
    server = start_vllm_server(
        server_arguments(tiny_model_dir),
        env={
            "VLLM_API_KEY": API_KEY,
            "VLLM_PLATFORM_OPERATOR_KEY_FILE": str(keys / "platform-operator.key"),
            **pod_auth_environment(tmp_path_factory.mktemp("pod-auth-mount")),
        },
        log_path=tmp_path_factory.mktemp("vllm-server") / "vllm-serve.log",
    )
    yield server
    stop_vllm_server(server)


@pytest.fixture(scope="session")
def vllm_server(booting_vllm_server: RunningVllmServer) -> RunningVllmServer:
    try:
        wait_until_healthy(booting_vllm_server, timeout_seconds=STARTUP_TIMEOUT_SECONDS)
    except VllmServerError as error:
        pytest.fail(str(error), pytrace=False)
    return booting_vllm_server


def boot_server_now_if_the_session_needs_it(request: pytest.FixtureRequest) -> None:
    """Start the server before a slow vLLM parser check, so that it loads meanwhile, but only
    when some test of this session will use it."""
    server_fixtures = {"vllm_server", "served_one_request"}
    if any(server_fixtures & set(item.fixturenames) for item in request.session.items):
        request.getfixturevalue("booting_vllm_server")


@pytest.fixture(scope="session")
def served_one_request(vllm_server: RunningVllmServer) -> RunningVllmServer:
    """The server after one finished completion, so its histograms have observations."""
    response = httpx.post(
        f"{vllm_server.base_url}/v1/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"model": SERVED_MODEL_NAME, "prompt": "def main():", "max_tokens": 8},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return vllm_server
