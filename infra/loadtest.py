"""`vllm-platform loadtest`: drive a deployed endpoint at several concurrency levels and find the
largest one that meets a latency SLO ("max safe concurrency").

The load comes from Locust (https://locust.io, an established load-testing engine, installed with
`pip install 'vllm-platform[loadtest]'`): at each level it runs C users back to back, without think
time, each sending `requests_per_user` streamed chat completions (`POST /v1/chat/completions`,
`stream: true`, the API key as a Bearer token, Server-Sent Events read as they arrive). Locust
counts requests and failures; for every request we stamp the first streamed token (TTFT), the end
and the completion tokens from the usage chunk, so TPOT = (end - first token) / (tokens - 1) as
`vllm bench serve` defines it. Output tokens/s at a level = all completion tokens / (last end -
first start). A level meets the SLO when none of its requests failed and the chosen percentile of
TTFT and of TPOT is within the limits; the max safe concurrency is the largest level that meets it
with every lower level meeting it too.

Prompts never repeat by accident (issue 27): with prefix caching on, as in every stack, a prompt the
server has seen is served mostly from its prefix cache, so a level that re-sent an earlier level's
prompts would measure the cache, not prefill. Every run has a seed (random unless `--seed N` is
given; printed and recorded in loadtest.json), every level draws its prompts from that seed and its
concurrency, and every request of a level gets its own prompt. The `shared-prefix` workload is the
explicit opposite: every prompt starts with one of a few fixed texts, the same in every level, so
the run measures serving with prefix-cache reuse (a long shared system prompt, say).

Why Locust and not vLLM's own `vllm bench serve` (used for the lab numbers in bench/serving):
that one needs vLLM, PyTorch included, on the user's laptop; guidellm 0.8 also pulls in PyTorch,
transformers and datasets. Locust is pure Python plus gevent and runs anywhere. Each level runs in
its own Python process (`python -m infra.loadtest level ...`), because Locust patches the standard
library with gevent when imported; the CLI and the test process stay unpatched.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import random
import secrets
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

LOADTEST_EXTRA = "pip install 'vllm-platform[loadtest]'"
CHAT_PATH = "/v1/chat/completions"
# Long enough to fill several KV blocks (16 tokens on GPUs, 128 on vLLM's CPU backend) with text of
# about one token per word, so the shared part is what the prefix cache can reuse.
DEFAULT_SHARED_PREFIX_WORDS = 512
WORDS = [
    "cluster",
    "node",
    "replica",
    "token",
    "stream",
    "latency",
    "request",
    "model",
    "serve",
    "queue",
    "batch",
    "cache",
    "memory",
    "graph",
    "kernel",
    "prompt",
    "answer",
    "decode",
    "prefill",
    "scale",
    "budget",
    "health",
    "probe",
    "volume",
    "schedule",
]


class LoadtestError(RuntimeError):
    """The load test could not run; the message says why and what to do."""


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    tpot_ms: float
    percentile: float = 95.0


WorkloadKind = Literal["fresh", "shared-prefix"]
WORKLOADS: tuple[WorkloadKind, ...] = ("fresh", "shared-prefix")


@dataclass(frozen=True)
class Workload:
    """What the prompts of a run share with each other.

    `fresh`: nothing. Every request of every level gets new random text, so vLLM's prefix cache has
    nothing to reuse and the levels measure prefill and decode. `shared-prefix`: every prompt starts
    with one of `prefixes` fixed texts of `prefix_words` words (the same texts in every level), then
    fresh text; after the first requests the prefix is served from the prefix cache, so the levels
    measure serving with that reuse, as with a long shared system prompt.
    """

    kind: WorkloadKind = "fresh"
    prefix_words: int = 0
    prefixes: int = 0

    def __post_init__(self) -> None:
        if self.kind == "shared-prefix" and (self.prefix_words < 1 or self.prefixes < 1):
            raise ValueError("a shared-prefix workload needs prefix_words >= 1 and prefixes >= 1")
        if self.kind == "fresh" and (self.prefix_words or self.prefixes):
            raise ValueError("a fresh workload has no shared prefix")

    def describe(self) -> str:
        if self.kind == "fresh":
            return (
                "fresh (no two requests share a prompt, within or across levels: measures the "
                "engine, not vLLM's prefix cache)"
            )
        return (
            f"shared-prefix ({self.prefixes} fixed text(s) of {self.prefix_words} words start every "
            "prompt in every level, then fresh words: measures serving with prefix-cache reuse)"
        )


def new_seed() -> int:
    return secrets.randbelow(2**32)


def _words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def level_prompts(
    seed: int, concurrency: int, count: int, prompt_words: int, workload: Workload
) -> list[str]:
    """The `count` prompts of one level: drawn from the run's seed and the level's concurrency, so
    levels of one run differ from each other, and `--seed` with the same levels repeats them exactly.
    In the shared-prefix workload each prompt is one of the run's shared texts (taken in turn), a
    space, then `prompt_words` fresh words; otherwise `prompt_words` fresh words."""
    rng = random.Random(f"{seed}:level-{concurrency}")  # str seeds hash the same in every process
    fresh = [_words(prompt_words, rng) for _ in range(count)]
    if workload.kind == "fresh":
        return fresh
    shared = random.Random(f"{seed}:shared-prefix")
    prefixes = [_words(workload.prefix_words, shared) for _ in range(workload.prefixes)]
    return [f"{prefixes[index % len(prefixes)]} {text}" for index, text in enumerate(fresh)]


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    error_messages: dict[str, int]
    duration_s: float
    output_tokens: int
    output_tokens_per_s: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    meets_slo: bool = False


@dataclass
class LoadtestReport:
    url: str
    model: str
    engine: str
    slo: Slo
    seed: int = 0
    workload: Workload = field(default_factory=Workload)
    levels: list[LevelResult] = field(default_factory=list)

    @property
    def max_safe_concurrency(self) -> int | None:
        """The largest level that met the SLO with every lower level meeting it too."""
        safe = None
        for level in sorted(self.levels, key=lambda level: level.concurrency):
            if not level.meets_slo:
                break
            safe = level.concurrency
        return safe

    def as_json(self) -> dict[str, Any]:
        document = {**asdict(self), "max_safe_concurrency": self.max_safe_concurrency}
        document["workload"]["measures"] = self.workload.describe()
        return document


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: list[float]) -> dict[str, float]:
    return {f"p{q}": round(percentile(values, q), 3) for q in (50, 90, 95, 99)} | {
        "mean": round(sum(values) / len(values), 3) if values else math.nan
    }


def meets(level: LevelResult, slo: Slo) -> bool:
    key = f"p{slo.percentile:g}"
    return (
        level.errors == 0
        and level.requests > 0
        and level.ttft_ms[key] <= slo.ttft_ms
        and level.tpot_ms[key] <= slo.tpot_ms
    )


def level_from_samples(concurrency: int, raw: dict[str, Any], slo: Slo) -> LevelResult:
    samples = raw["samples"]
    ok = [sample for sample in samples if sample["error"] is None]
    errors: dict[str, int] = {}
    for sample in samples:
        if sample["error"] is not None:
            errors[sample["error"]] = errors.get(sample["error"], 0) + 1
    span = (max(s["end"] for s in ok) - min(s["start"] for s in ok)) if ok else 0.0
    tokens = sum(sample["tokens"] for sample in ok)
    level = LevelResult(
        concurrency=concurrency,
        requests=len(samples),
        errors=len(samples) - len(ok),
        error_messages=errors,
        duration_s=round(span, 3),
        output_tokens=tokens,
        output_tokens_per_s=round(tokens / span, 1) if span > 0 else 0.0,
        ttft_ms=summary([1000 * (s["first"] - s["start"]) for s in ok]),
        tpot_ms=summary([1000 * (s["end"] - s["first"]) / (s["tokens"] - 1) for s in ok if s["tokens"] > 1]),
    )
    level.meets_slo = meets(level, slo)
    return level


def run_loadtest(
    url: str,
    model: str,
    api_key: str | None,
    concurrency: list[int],
    slo: Slo,
    *,
    requests_per_user: int = 4,
    prompt_words: int = 256,
    output_tokens: int = 128,
    seed: int | None = None,
    workload: Workload | None = None,
    level_timeout_s: float = 600,
) -> LoadtestReport:
    """Run every level in turn. Without a seed the run draws one (new prompts on every run)."""
    # Not imported here: importing Locust patches this process's standard library with gevent.
    if importlib.util.find_spec("locust") is None:
        raise LoadtestError(f"the load test needs Locust: {LOADTEST_EXTRA}")
    engine = f"locust {importlib.metadata.version('locust')}"
    report = LoadtestReport(
        url=url, model=model, engine=engine, slo=slo, seed=new_seed() if seed is None else seed,
        workload=workload or Workload(),
    )  # fmt: skip
    for users in concurrency:
        prompts = level_prompts(report.seed, users, users * requests_per_user, prompt_words, report.workload)
        command = [sys.executable, "-m", "infra.loadtest", "level", "--url", url, "--model", model,
                   "--users", str(users), "--requests-per-user", str(requests_per_user),
                   "--output-tokens", str(output_tokens)]  # fmt: skip
        env = dict(os.environ)
        if api_key:
            env["VLLM_PLATFORM_LOADTEST_KEY"] = api_key  # not on the command line (ps shows that)
        try:
            finished = subprocess.run(
                command, input=json.dumps(prompts), capture_output=True, text=True, env=env,
                timeout=level_timeout_s, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as error:
            raise LoadtestError(
                f"concurrency {users} did not finish within {level_timeout_s:.0f} s: the endpoint is "
                "slower than the level needs; lower --requests-per-user or --output-tokens"
            ) from error
        if finished.returncode != 0:
            raise LoadtestError(f"concurrency {users}: the Locust run failed:\n{finished.stderr[-2000:]}")
        raw = json.loads(finished.stdout.strip().splitlines()[-1])
        report.levels.append(level_from_samples(users, raw, slo))
    return report


def format_report(report: LoadtestReport) -> str:
    key = f"p{report.slo.percentile:g}"
    lines = [
        f"load test of {report.url} (model {report.model}, {report.engine}); SLO: {key} TTFT <= "
        f"{report.slo.ttft_ms:g} ms, {key} TPOT <= {report.slo.tpot_ms:g} ms, no errors",
        f"prompts: {report.workload.describe()}; seed {report.seed} (--seed {report.seed} repeats them)",
        f"{'C':>5} {'requests':>8} {'errors':>6} {'out tok/s':>10} {'TTFT p50':>9} {'p95':>8} {'p99':>8} "
        f"{'TPOT p50':>9} {'p95':>7} {'p99':>7}  SLO",
    ]
    for level in report.levels:
        t, p = level.ttft_ms, level.tpot_ms
        lines.append(
            f"{level.concurrency:>5} {level.requests:>8} {level.errors:>6} "
            f"{level.output_tokens_per_s:>10,.1f} "
            f"{t['p50']:>9,.1f} {t['p95']:>8,.1f} {t['p99']:>8,.1f} {p['p50']:>9.2f} {p['p95']:>7.2f} "
            f"{p['p99']:>7.2f}  {'met' if level.meets_slo else 'missed'}"
        )
        for message, count in level.error_messages.items():
            lines.append(f"      {count} x {message}")
    safe = report.max_safe_concurrency
    lines.append(
        f"max safe concurrency: {safe}"
        if safe is not None
        else "max safe concurrency: none of the levels met the SLO"
    )
    return "\n".join(lines)


def plot_report(report: LoadtestReport, target: Path) -> None:
    try:
        import matplotlib
    except ImportError as error:
        raise LoadtestError(f"the plot needs matplotlib: {LOADTEST_EXTRA}") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = f"p{report.slo.percentile:g}"
    levels = [level.concurrency for level in report.levels]
    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    throughput.plot(levels, [level.output_tokens_per_s for level in report.levels], marker="o")
    throughput.set_xlabel("concurrent requests")
    throughput.set_ylabel("output tokens/s")
    safe = report.max_safe_concurrency
    if safe is not None:
        throughput.axvline(safe, color="green", linestyle="--", label=f"max safe concurrency {safe}")
        throughput.legend()
    latency.plot(levels, [level.ttft_ms[key] for level in report.levels], marker="o", label=f"TTFT {key}")
    latency.plot(levels, [level.tpot_ms[key] for level in report.levels], marker="s", label=f"TPOT {key}")
    latency.axhline(report.slo.ttft_ms, color="C0", linestyle=":", label="TTFT SLO")
    latency.axhline(report.slo.tpot_ms, color="C1", linestyle=":", label="TPOT SLO")
    latency.set_xlabel("concurrent requests")
    latency.set_ylabel("ms")
    measured = [level.ttft_ms[key] for level in report.levels] + [
        level.tpot_ms[key] for level in report.levels
    ]
    if any(value > 0 for value in measured):  # all NaN when every request failed
        latency.set_yscale("log")
    latency.legend()
    for axis in (throughput, latency):
        if len(levels) > 1:
            axis.set_xscale("log", base=2)
        axis.set_xticks(levels, [str(level) for level in levels])
        axis.grid(True, alpha=0.3)
    figure.suptitle(f"{report.model} at {report.url}")
    figure.tight_layout()
    figure.savefig(target)
    plt.close(figure)


# --- one level, in its own process (Locust patches the standard library with gevent on import) ---


def _run_level(
    url: str, model: str, users: int, requests_per_user: int, output_tokens: int, prompts: list[str]
) -> dict:
    import gevent
    from locust import HttpUser, constant, events, task
    from locust.env import Environment
    from locust.exception import StopUser

    api_key = os.environ.get("VLLM_PLATFORM_LOADTEST_KEY")
    samples: list[dict[str, Any]] = []
    unsent = list(reversed(prompts))  # one per request, never reused

    class ChatUser(HttpUser):
        wait_time = constant(0)
        host = url

        def on_start(self) -> None:
            self.sent = 0

        @task
        def chat(self) -> None:
            if self.sent >= requests_per_user:
                raise StopUser()
            self.sent += 1
            headers = {"Accept": "text/event-stream"}
            if api_key:
                headers["Authorization"] = f"Bearer {api_key}"
            body = {
                "model": model, "messages": [{"role": "user", "content": unsent.pop()}],
                "max_tokens": output_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True},
            }  # fmt: skip
            sample: dict[str, Any] = {"start": time.perf_counter(), "first": None, "end": None, "tokens": 0}
            sample["error"] = None
            try:
                with self.client.post(
                    CHAT_PATH, json=body, headers=headers, stream=True, catch_response=True, name=CHAT_PATH
                ) as response:
                    if response.status_code != 200:
                        sample["error"] = f"HTTP {response.status_code}: {response.text[:120]}"
                        response.failure(sample["error"])
                    else:
                        for line in response.iter_lines():
                            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                                continue
                            chunk = json.loads(line[6:])
                            if chunk.get("usage"):
                                sample["tokens"] = chunk["usage"]["completion_tokens"]
                            for choice in chunk.get("choices", []):
                                if sample["first"] is None and choice.get("delta", {}).get("content"):
                                    sample["first"] = time.perf_counter()
                        sample["end"] = time.perf_counter()
                        if sample["first"] is None or sample["tokens"] == 0:
                            sample["error"] = "stream ended without tokens or usage"
                            response.failure(sample["error"])
                        else:
                            response.success()
            except Exception as error:  # a dropped connection mid-stream; Locust counts it too
                sample["error"] = f"{type(error).__name__}: {error}"[:160]
            samples.append(sample)

    environment = Environment(user_classes=[ChatUser], events=events)
    runner = environment.create_local_runner()
    runner.start(users, spawn_rate=users)
    if runner.spawning_greenlet is not None:
        runner.spawning_greenlet.join()  # every user started
    expected = users * requests_per_user
    while len(samples) < expected and runner.user_count > 0:
        gevent.sleep(0.05)
    runner.quit()
    stats = environment.stats.total
    return {"samples": samples, "locust": {"requests": stats.num_requests, "failures": stats.num_failures}}


def _level_main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m infra.loadtest level")
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--users", type=int, required=True)
    parser.add_argument("--requests-per-user", type=int, required=True)
    parser.add_argument("--output-tokens", type=int, required=True)
    args = parser.parse_args(argv)
    prompts = json.load(sys.stdin)  # the level's prompts, one per request (level_prompts)
    if len(prompts) != args.users * args.requests_per_user:
        sys.exit(f"expected {args.users * args.requests_per_user} prompts on stdin, got {len(prompts)}")
    result = _run_level(
        args.url.rstrip("/"), args.model, args.users, args.requests_per_user, args.output_tokens, prompts
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["level"]:
        sys.exit("usage: python -m infra.loadtest level ... (run by `vllm-platform loadtest`)")
    sys.exit(_level_main(sys.argv[2:]))
