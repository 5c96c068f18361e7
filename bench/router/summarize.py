"""Table of a router benchmark run: `python bench/router/summarize.py RAW_DIR` (bench/router/run.sh)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

POLICIES = ("round_robin", "cache_aware")


def _counters(raw: Path, policy: str) -> dict[str, dict[str, float]]:
    before = json.loads((raw / f"{policy}-counters-before.json").read_text())
    after = json.loads((raw / f"{policy}-counters-after.json").read_text())
    return {port: {k: after[port][k] - before[port][k] for k in after[port]} for port in after}


def summarize(raw: Path) -> str:
    rows = [
        "| policy | completed / failed | output tok/s | req/s | TTFT median ms | TTFT mean ms | TTFT p99 ms "
        "| TPOT median ms | prefix-cache hit rate | requests per replica |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for policy in POLICIES:
        result = json.loads((raw / f"{policy}.json").read_text())
        counters = _counters(raw, policy)
        hits = sum(c["vllm:prefix_cache_hits_total"] for c in counters.values())
        queries = sum(c["vllm:prefix_cache_queries_total"] for c in counters.values())
        split = " / ".join(f"{c['vllm:request_success_total']:.0f}" for _, c in sorted(counters.items()))
        # prefix_repetition makes num_prompts // num_prefixes prompts per prefix, so `completed` can be
        # below --num-prompts with no request failed.
        ok = f"{result['completed']} / {result['failed']}"
        ttft = f"{result['median_ttft_ms']:.1f} | {result['mean_ttft_ms']:.1f} | {result['p99_ttft_ms']:.1f}"
        rows.append(
            f"| {policy} | {ok} | {result['output_throughput']:.1f} | {result['request_throughput']:.2f} "
            f"| {ttft} | {result['median_tpot_ms']:.1f} | {hits / queries:.1%} | {split} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1])))
