"""Why the wake gate (router/wake_gate.py) and not vllm-router's own key check: the pinned release's
options, run (issue 40; docs/security.md, "Waking a model at zero").

vllm-router 0.1.17's CLI has only `--api-key`, the key it sends to workers. Its Rust core also takes
`api_key_validation_urls` (no CLI flag; given here through its Python API, `Router.from_args`): it
asks a URL with the client's bearer token and accepts the request on 200. Measured below: the
kubelet's probes and the worker API then need a key too, an answer is kept for the process's life
(a key revoked at the validator still passes), and the check never sees the request's model. If a
later pin changes any of this, this test fails and the choice is worth revisiting.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from tests.support.vllm_router import RouterVenvMissingError, require_router_python
from tests.support.vllm_server import REPO_ROOT, free_port

pytestmark = pytest.mark.e2e

LAUNCH = """
import sys
from vllm_router.launch_router import parse_router_args
from vllm_router.router import Router
args = parse_router_args(sys.argv[2:])
args._validate_router_args()
args.api_key_validation_urls = [sys.argv[1]]
Router.from_args(args).start()
"""


@dataclass
class Validator:
    """The URL the router asks: 200 for the one valid token while `valid` holds."""

    valid: bool = True
    asked: list[str | None] = field(default_factory=list)


@dataclass(frozen=True)
class Running:
    url: str
    validator: Validator


@pytest.fixture(scope="module")
def router_with_validation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    try:
        python = require_router_python()
    except RouterVenvMissingError as error:
        pytest.fail(str(error), pytrace=False)
    validator = Validator()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            token = self.headers.get("Authorization")
            validator.asked.append(token)
            self.send_response(200 if validator.valid and token == "Bearer good" else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port("127.0.0.1")
    log = tmp_path_factory.mktemp("router-key-options") / "router.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(python),
                "-c",
                LAUNCH,
                f"http://127.0.0.1:{server.server_port}/validate",
                *("--host", "127.0.0.1", "--port", str(port)),
                *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port("127.0.0.1"))),
                *("--retry-max-retries", "1"),
            ],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()[-2000:]
            try:
                httpx.get(f"{url}/liveness", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.5)
        yield Running(url, validator)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        server.shutdown()
        server.server_close()


def chat(url: str, key: str | None, model: str = "any-model") -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body, timeout=30).status_code


def test_the_cli_offers_no_check_of_the_clients_key() -> None:
    python = require_router_python()
    help_text = subprocess.run(
        [str(python), "-m", "vllm_router.launch_router", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    assert "--api-key API_KEY" in help_text and "authorization with workers" in help_text
    assert "validation" not in help_text


def test_validation_urls_lock_out_the_probes_and_the_worker_api(router_with_validation: Running) -> None:
    url = router_with_validation.url
    assert httpx.get(f"{url}/liveness", timeout=10).status_code == 401
    assert httpx.get(f"{url}/readiness", timeout=10).status_code == 401
    assert httpx.get(f"{url}/workers", timeout=10).status_code == 401


def test_validation_urls_keep_a_revoked_key_and_never_see_the_model(router_with_validation: Running) -> None:
    url, validator = router_with_validation.url, router_with_validation.validator
    assert chat(url, None) == 401 and chat(url, "made-up") == 401
    # Past the check (no worker: 503), whatever model the body names.
    assert chat(url, "good", "a-model-nobody-serves") == 503
    asked = len(validator.asked)
    validator.valid = False  # revoked at the validator
    assert chat(url, "good") == 503, "the revoked key is still accepted: the answer is cached"
    assert len(validator.asked) == asked, "the validator was not asked again"
