"""Three of the flags `validate` refuses (issue 40), run on the real pinned vLLM (0.32.0, CPU build):

- `--uds`: the server answers on the Unix socket and nothing listens on `--host`/`--port`, so the
  probes (HTTP GET /health on the port), the router and the load balancer would reach nothing
  (components/vllm_arguments.py LISTENER_RULES).
- `--disable-log-stats`: `/metrics` holds none of vLLM's `vllm:*` series, even after a request, so
  the autoscaler's queue and KV-cache signals, the alerts and the dashboards would read nothing
  (components/scrape.py series_gaps).

- `--api-server-count 0`: vLLM runs headless (engine only) and the port stays closed.

One server with the first two flags, one with the third (69 s and 39 s on the 2-core machine,
2026-12-04); each is stopped by its process group, and every wait is bounded.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.scrape import series_gaps
from components.vllm_arguments import disables_statistics, listener_problems
from domain.config.loader import load_stack_config
from tests.e2e.test_lora import with_amx_permission
from tests.support.vllm_server import (
    REPO_ROOT,
    RunningVllmServer,
    VllmServerError,
    listening_tcp_ports,
    start_vllm_server,
    stop_vllm_server,
)

pytestmark = pytest.mark.e2e

STARTUP_TIMEOUT_SECONDS = 300
SERVED_NAME = "tiny"
EAGER_ENV = with_amx_permission({"PYTHONPATH": str(REPO_ROOT)})
"""Both servers run --enforce-eager (no compile: a faster start), whose CPU attention kernel dies with
SIGILL on a CPU with AMX unless the process asked for the AMX state (tests/support/amx_permission).
Without it the worker died on the first completion on CI's machine and here ("Worker proc
VllmWorker-0 died unexpectedly", 500 "EngineCore encountered an issue"), 2026-12-05."""


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (stdlib only)."""

    def __init__(self, path: Path, timeout: float = 30) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def over_socket(path: Path, method: str, route: str, body: dict | None = None) -> tuple[int, str]:
    connection = UnixHTTPConnection(path)
    try:
        payload = json.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, route, body=payload, headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


@pytest.fixture(scope="module")
def unix_socket_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningVllmServer, Path]]:
    folder = tmp_path_factory.mktemp("vllm-uds")
    socket_path = folder / "vllm.sock"
    arguments = [
        str(tiny_model_dir),
        "--load-format", "dummy",
        "--max-model-len", "512",
        "--enforce-eager",
        "--served-model-name", SERVED_NAME,
        "--uds", str(socket_path),
        "--disable-log-stats",
    ]  # fmt: skip
    # start_vllm_server adds --host 127.0.0.1 --port <free>, which --uds makes vLLM ignore.
    server = start_vllm_server(arguments, log_path=folder / "vllm-serve.log", env=EAGER_ENV)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while True:
            if server.process.poll() is not None:
                raise VllmServerError(f"vLLM exited with {server.process.returncode}:\n{server.log_tail()}")
            if socket_path.exists():
                try:
                    if over_socket(socket_path, "GET", "/health")[0] == 200:
                        break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise VllmServerError(
                    f"no 200 on the socket's /health in {STARTUP_TIMEOUT_SECONDS} s:\n{server.log_tail()}"
                )
            time.sleep(1)
        yield server, socket_path
    finally:
        stop_vllm_server(server)


def test_validate_refuses_both_flags_of_this_server() -> None:
    arguments = ["--uds", "/tmp/vllm.sock", "--disable-log-stats"]
    assert [flag for flag, _ in listener_problems(arguments)] == ["--uds"]
    assert disables_statistics(arguments) == "--disable-log-stats"
    prod = load_stack_config("prod")
    model = prod.models[0]
    changed = model.model_copy(update={"vllm": model.vllm.model_copy(update={"extra_args": arguments})})
    assert "vllm" in series_gaps(prod, changed)


def test_listening_tcp_ports_sees_a_listener_of_the_servers_session_and_no_other(tmp_path: Path) -> None:
    """The control for the two checks below, which expect an empty answer."""
    code = (
        "import socket, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); time.sleep(60)\n"
    )
    with socket.socket() as outsider:  # a listener of this process, outside the session
        outsider.bind(("127.0.0.1", 0))
        outsider.listen()
        process = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            assert process.stdout is not None
            port = int(process.stdout.readline())
            server = RunningVllmServer(f"http://127.0.0.1:{port}", port, process, tmp_path / "none.log")
            assert listening_tcp_ports(server) == {port}
        finally:
            process.kill()
            process.wait(timeout=10)


def test_with_uds_the_api_answers_on_the_socket_and_nothing_listens_on_the_port(
    unix_socket_server: tuple[RunningVllmServer, Path],
) -> None:
    server, socket_path = unix_socket_server
    assert over_socket(socket_path, "GET", "/health")[0] == 200
    # Read from /proc: the port the helper passed is free again, and a parallel test may take it
    # (CI, 2026-12-04: a connect to it succeeded), so what counts is what vLLM's processes listen on.
    # (Its engine and worker listen on ports of their own, for torch.distributed and ZMQ.)
    assert server.port not in listening_tcp_ports(server), "with --uds the server still opened --port"


def test_without_statistics_metrics_holds_no_vllm_series_even_after_a_request(
    unix_socket_server: tuple[RunningVllmServer, Path],
) -> None:
    _, socket_path = unix_socket_server
    status, completion = over_socket(
        socket_path, "POST", "/v1/completions", {"model": SERVED_NAME, "prompt": "hello", "max_tokens": 4}
    )
    assert status == 200, completion
    status, metrics = over_socket(socket_path, "GET", "/metrics")
    assert status == 200
    vllm_series = sorted(
        {line.split("{")[0].split(" ")[0] for line in metrics.splitlines() if line.startswith("vllm:")}
    )
    assert vllm_series == [], vllm_series
    assert "http_requests_total" in metrics, "the HTTP instrumentation still exports: /metrics itself works"


HEADLESS_LOG_LINE = "in headless mode"
"""vLLM 0.32.0's run_headless logs `Launching N data parallel engine(s) in headless mode, ...`."""


def test_with_api_server_count_0_vllm_runs_headless_and_nothing_listens_on_the_port(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    arguments = [
        str(tiny_model_dir),
        "--load-format", "dummy",
        "--max-model-len", "512",
        "--enforce-eager",
        "--api-server-count", "0",
    ]  # fmt: skip
    assert [flag for flag, _ in listener_problems(arguments[1:])] == ["--api-server-count"]
    server = start_vllm_server(arguments, log_path=tmp_path / "vllm-serve.log", env=EAGER_ENV)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while HEADLESS_LOG_LINE not in server.log_path.read_text(errors="replace"):
            assert server.process.poll() is None, f"vLLM exited first:\n{server.log_tail()}"
            assert time.monotonic() < deadline, (
                f"no headless start in {STARTUP_TIMEOUT_SECONDS} s:\n{server.log_tail()}"
            )
            time.sleep(1)
        # The engine is starting without any API server: the probes' port is closed now and stays so
        # (checked for 20 s while the engine loads).
        until = time.monotonic() + 20
        while time.monotonic() < until:
            assert server.port not in listening_tcp_ports(server), "the API port opened"
            time.sleep(2)
    finally:
        stop_vllm_server(server)
