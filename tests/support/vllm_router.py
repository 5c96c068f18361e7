"""Run the pinned vLLM router (PyPI vllm-router, `.venv-router`) for real, on loopback.

Stdlib only at the top level, like tests/support/vllm_server.py. The venv comes from
`scripts/setup-vllm-router.sh` (CI runs it through scripts/setup-test-tools.sh).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.registrar import ModelsServer, Worker
from tests.support.vllm_server import REPO_ROOT, free_port

SETUP_COMMAND = "scripts/setup-vllm-router.sh"


class RouterVenvMissingError(RuntimeError):
    """The router venv has not been set up."""


class RouterError(RuntimeError):
    """The router exited or did not come up; the message carries its log tail."""


def router_venv() -> Path:
    return Path(os.environ.get("VLLM_ROUTER_VENV") or REPO_ROOT / ".venv-router")


def require_router_python() -> Path:
    python = router_venv() / "bin" / "python"
    if not python.is_file():
        raise RouterVenvMissingError(
            f"the vLLM router venv is missing: no {python}. Create it with `{SETUP_COMMAND} {router_venv()}`."
        )
    return python


def installed_router_version() -> str:
    python = require_router_python()
    completed = subprocess.run(
        [str(python), "-c", "import vllm_router; print(vllm_router.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return completed.stdout.strip()


def parse_router_arguments(args: Sequence[str]) -> str | None:
    """None when the pinned router's own parser and validation accept `vllm-router ARGS`, else its error."""
    python = require_router_python()
    code = (
        "import sys, json\n"
        "from vllm_router.launch_router import parse_router_args\n"
        "a = parse_router_args(json.loads(sys.argv[1]))\n"
        "a._validate_router_args() if hasattr(a, '_validate_router_args') else None\n"
    )
    import json

    completed = subprocess.run(
        [str(python), "-c", code, json.dumps(list(args))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return None if completed.returncode == 0 else (completed.stderr.strip().splitlines() or ["?"])[-1]


@dataclass(frozen=True)
class RunningRouter:
    base_url: str
    metrics_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


DISCOVERY_OPTIONS_WITH_VALUE = ("--service-discovery-namespace", "--service-discovery-port")


def without_kubernetes_discovery(args: Sequence[str]) -> list[str]:
    """Rendered router arguments without the Kubernetes discovery (`--service-discovery`, its
    `--selector` values, namespace and port): a router outside a cluster has no API to watch."""
    kept, index = [], 0
    while index < len(args):
        token = args[index]
        if token in DISCOVERY_OPTIONS_WITH_VALUE:
            index += 2
        elif token == "--service-discovery":
            index += 1
        elif token == "--selector":
            index += 1
            while index < len(args) and not args[index].startswith("--"):
                index += 1
        else:
            kept.append(token)
            index += 1
    return kept


def start_router(
    args: Sequence[str], *, log_path: Path, host: str = "127.0.0.1", startup_timeout_seconds: float = 60
) -> RunningRouter:
    """`vllm-router ARGS --host HOST --port <free> --prometheus-host HOST --prometheus-port <free>`,
    returned once /liveness answers 200. ARGS must not set host or ports."""
    python = require_router_python()
    port, metrics_port = free_port(host), free_port(host)
    command = [
        str(python),
        "-m",
        "vllm_router.launch_router",
        *args,
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(metrics_port),
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    router = RunningRouter(
        f"http://{host}:{port}", f"http://{host}:{metrics_port}/metrics", process, log_path
    )
    deadline = time.monotonic() + startup_timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RouterError(f"vllm-router exited with {process.returncode}:\n{router.log_tail()}")
        try:
            with urllib.request.urlopen(f"{router.base_url}/liveness", timeout=2) as response:
                if response.status == 200:
                    return router
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    stop_router(router)
    raise RouterError(
        f"vllm-router did not answer /liveness within {startup_timeout_seconds:.0f} s:\n{router.log_tail()}"
    )


def held_attempts(router: RunningRouter) -> float:
    """A to-zero model router's `no_available_workers` errors: each is one attempt held while the
    model wakes, the demand that wakes it (components/autoscaling.py `router_demand_query`)."""
    with urllib.request.urlopen(router.metrics_url, timeout=30) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm_router_request_errors_total{")
        and 'error_type="no_available_workers"' in line
    )


def stop_router(router: RunningRouter, timeout_seconds: float = 20) -> None:
    """SIGTERM to the router's own process group, SIGKILL after the timeout."""
    stop_process_group(router.process, timeout_seconds)


@contextlib.contextmanager
def models_server(workers: Sequence[Worker]) -> Iterator[str]:
    """The registrar's `/v1/models` server (router/registrar.py, what the Ingress sends `/v1/models`
    to) over `workers`, in a thread on loopback; yields its base URL and stops it on the way out."""
    server = ModelsServer(("127.0.0.1", 0), list(workers))
    thread = threading.Thread(target=server.serve_forever, name="models", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


@dataclass(frozen=True)
class RunningWakeGate:
    """router/wake_gate.py as the `wake-gate` container runs it, for one to-zero model."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def start_wake_gate(
    rendered_config: dict[str, Any],
    model: str,
    *,
    model_router_url: str,
    keys_dir: Path,
    log_path: Path,
    startup_timeout_seconds: float = 30,
) -> RunningWakeGate:
    """The rendered wake-gate config (components/router_sidecars.py `wake_gate_config`) for `model`
    alone, on a free loopback port, in front of `model_router_url`, reading keys from `keys_dir`;
    returned once its /liveness answers. Started as the container starts it:
    `python wake_gate.py --config FILE`."""
    import json
    import sys

    (gated,) = [m for m in rendered_config["models"] if m["model"] == model]
    port = free_port("127.0.0.1")
    config = {
        **rendered_config,
        "keys_dir": str(keys_dir),
        "models": [{**gated, "port": port, "model_router_url": model_router_url}],
    }
    config_file = log_path.with_suffix(".json")
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(json.dumps(config))
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "router" / "wake_gate.py"), "--config", str(config_file)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    gate = RunningWakeGate(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + startup_timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RouterError(f"the wake gate exited with {process.returncode}:\n{gate.log_tail()}")
        try:
            with urllib.request.urlopen(f"{gate.base_url}/liveness", timeout=2) as response:
                if response.status == 200:
                    return gate
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    stop_process_group(process)
    raise RouterError(f"the wake gate did not answer /liveness within {startup_timeout_seconds:.0f} s")


def stop_process_group(process: subprocess.Popen[bytes], timeout_seconds: float = 20) -> None:
    """SIGTERM to the process's own group, SIGKILL after the timeout."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass(frozen=True)
class RunningDoor:
    """The router pod's door (nginx with the rendered door.conf, components/router_door.py)."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    config_path: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


NGINX_SETUP = "scripts/setup-test-tools.sh (Debian's nginx-light at domain/versions.py NGINX_DEBIAN_VERSION)"


def start_door(
    rendered_conf: str,
    *,
    front_url: str,
    models_url: str,
    directory: Path,
    startup_timeout_seconds: float = 30,
) -> RunningDoor:
    """nginx with the rendered door config, as the `door` container runs it, with only its addresses
    changed for loopback: it listens on a free port, the front and the registrar's models server
    are at `front_url` and `models_url`, and its pid and body files go to `directory`."""
    import shutil

    from components import router_door

    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).is_file():
        raise RouterError(f"nginx is not installed: run {NGINX_SETUP}")
    port = free_port("127.0.0.1")
    replacements = {
        f"listen {router_door.DOOR_PORT} ": f"listen 127.0.0.1:{port} ",
        f"127.0.0.1:{router_door.FRONT_PORT};": front_url.removeprefix("http://") + ";",
        f"127.0.0.1:{router_door.MODELS_PORT};": models_url.removeprefix("http://") + ";",
        router_door.DOOR_TMP_PATH: str(directory),
    }
    conf = rendered_conf
    for rendered, local in replacements.items():
        assert rendered in conf, f"the rendered door config has no {rendered!r}"
        conf = conf.replace(rendered, local)
    directory.mkdir(parents=True, exist_ok=True)
    worker_user = "user root;" if os.geteuid() == 0 else ""
    config_path = directory / router_door.DOOR_CONFIG_FILE
    config_path.write_text(conf)
    log_path = directory / "nginx.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            # As in the pod, the workers run as the master's user (as root, nginx would switch them to
            # `nobody`, who may not enter the test's temporary folder).
            [nginx, "-e", "stderr", "-c", str(config_path), "-g", f"daemon off; {worker_user}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    door = RunningDoor(f"http://127.0.0.1:{port}", process, log_path, config_path)
    deadline = time.monotonic() + startup_timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RouterError(f"nginx exited with {process.returncode}:\n{door.log_tail()}")
        try:
            with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=2)):
                return door
        except OSError:
            time.sleep(0.2)
    stop_process_group(process)
    raise RouterError(f"nginx did not listen within {startup_timeout_seconds:.0f} s:\n{door.log_tail()}")


def stop_door(door: RunningDoor, timeout_seconds: float = 20) -> None:
    stop_process_group(door.process, timeout_seconds)


def raw_request(
    base_url: str,
    method: str,
    target: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    timeout_seconds: float = 10,
) -> tuple[int, bytes]:
    """One request with `target` written into the request line byte for byte (httpx and http.client
    normalise or refuse some targets): (status, body). A status of 0: no answer."""
    host, _, port = base_url.removeprefix("http://").partition(":")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if (body or method in ("POST", "PUT", "PATCH")) and "Content-Length" not in (headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    answer = b""
    with contextlib.closing(socket.create_connection((host, int(port)), timeout=timeout_seconds)) as sock:
        sock.sendall(request)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    return (int(status_line[1]) if len(status_line) > 1 else 0), rest
