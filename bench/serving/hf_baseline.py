"""The baseline the stack replaces: Hugging Face Transformers `generate` on static batches.

    python3 -m bench.serving.hf_baseline --model-dir /tmp/m/llama8b --out baseline.json

The same model shape as the vLLM runs (config.json of the model directory), random bf16 weights
built directly on the GPU, prompts of `input_len` random token ids, exactly `output_len` new tokens
(`min_new_tokens` = `max_new_tokens`, greedy), batch sizes in increasing order until the first
out-of-memory error. Static batching is the best case for `generate`: every request of a batch
starts together, so TTFT here is one batched prefill; a server that queues requests behind a running
batch would show longer TTFTs.

Times come from a streamer that `generate` calls after every step with the new tokens copied to the
CPU. That copy adds no wait of its own: on CUDA `generate` already reads a GPU flag every step to
decide whether to stop (transformers' `StopCheck`, read in 5.19's generation/utils.py; the lab runs
5.17), so the host waits for each step either way and the stamps are GPU-accurate.

Time budget: before each batch a short probe (prefill, then PROBE_STEPS decode steps at that batch)
measures the prefill and the decode step, and the full run is estimated from them. A decode step of
an 8B model costs nearly the same at batch 1 and 64 (it reads the same 16 GB of weights), so the
earlier estimate, batch 1's duration scaled linearly with the batch, skipped every batch past 1 on
2026-11-29 (batch 8 "needs" 172 s where it takes ~25 s).

Eager decoding launches each small kernel from Python, so it is CPU-bound: the output records the
host's load average and the CPUs this process may use (bench/serving/server.py cpu_facts), the
microseconds one tiny kernel launch took just before each batch, and each run's step-time spread,
so a slow TPOT can be told apart from a busy host.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.serving.server import cpu_facts

PROBE_STEPS = 8
DECODE_GROWTH_MARGIN = 1.3
"""The probe's steps attend over ~input_len tokens; the run's last steps over input_len + output_len
(768 for 512 + 256), and eager Transformers copies the growing KV cache every step. 30 % on top of
the probe's step time covers that for this workload."""
LAUNCH_PROBE_KERNELS = 2000


class OutOfMemory(Exception):
    """The GPU ran out of memory at this batch size."""


@dataclass(frozen=True)
class StepTimes:
    """One `generate` call: its start and the streamer's stamps (prompt, each new token, end)."""

    start: float
    stamps: list[float]

    @property
    def first_token_s(self) -> float:
        return self.stamps[1] - self.start  # stamps[0] is the prompt being handed to the streamer

    @property
    def duration_s(self) -> float:
        return self.stamps[-1] - self.start

    @property
    def step_s(self) -> list[float]:
        """Each decode step after the first token."""
        tokens = self.stamps[1:-1]
        return [later - earlier for earlier, later in itertools.pairwise(tokens)]


def estimate_run_s(probe: StepTimes, output_len: int, margin: float = DECODE_GROWTH_MARGIN) -> float:
    """A full run's duration from a probe at the same batch: its prefill plus output_len - 1 steps."""
    steps = probe.step_s
    if not steps:
        raise ValueError("the probe timed no decode step; it needs at least two new tokens")
    return probe.first_token_s + (output_len - 1) * statistics.median(steps) * margin


def step_spread_ms(times: StepTimes) -> dict[str, float]:
    steps = sorted(times.step_s)
    if not steps:
        return {}

    def at(fraction: float) -> float:
        return round(steps[min(len(steps) - 1, int(fraction * len(steps)))] * 1000, 2)

    return {"p10": at(0.10), "median": at(0.50), "p90": at(0.90), "max": round(steps[-1] * 1000, 2)}


class BatchRunner(Protocol):
    def generate(self, batch: int, new_tokens: int) -> StepTimes:
        """Run `generate` at this batch; raise OutOfMemory when the GPU has no room for it."""
        ...

    def level_extras(self) -> dict[str, Any]:
        """Facts about the run just finished (peak memory), empty where there are none."""
        ...

    def launch_us(self) -> float | None:
        """Microseconds per launch of a tiny kernel right now: the host's speed at dispatching."""
        ...


def run_batches(
    runner: BatchRunner,
    result: dict[str, Any],
    *,
    batch_sizes: list[int],
    output_len: int,
    budget_s: float,
    elapsed_s: Callable[[], float],
    save: Callable[[], None],
    probe_steps: int = PROBE_STEPS,
) -> None:
    """Each batch: probe, estimate, then the full run if it fits the budget; stop at the first OOM."""
    result["estimate"] = {
        "method": f"probe: prefill + {probe_steps} decode steps at the batch itself; full run = prefill"
        f" + (output_len - 1) x median step x {DECODE_GROWTH_MARGIN}",
        "probe_steps": probe_steps,
        "margin": DECODE_GROWTH_MARGIN,
    }
    for batch in batch_sizes:
        launch_us = runner.launch_us()
        try:
            probe = runner.generate(batch, probe_steps + 1)
        except OutOfMemory as error:
            _record_oom(result, batch, f"in the probe: {error}")
            save()
            break
        estimate = estimate_run_s(probe, output_len)
        remaining = budget_s - elapsed_s()
        probe_facts = {
            "prefill_s": round(probe.first_token_s, 3),
            "step_ms_median": round(statistics.median(probe.step_s) * 1000, 2),
            "duration_s": round(probe.duration_s, 2),
        }
        if estimate > remaining:
            result["skipped_for_time"].append(
                {
                    "batch": batch,
                    "estimated_s": round(estimate, 1),
                    "remaining_s": round(remaining, 1),
                    "probe": probe_facts,
                }
            )
            print(f"batch {batch}: skipped, ~{estimate:.0f} s needed, {remaining:.0f} s left", flush=True)
            save()
            continue
        load_before = _load_1m()
        try:
            times = runner.generate(batch, output_len)
        except OutOfMemory as error:
            _record_oom(result, batch, str(error))
            save()
            break
        generated = len(times.stamps) - 2
        input_len = result["workload"]["input_len"]
        level = {
            "batch": batch,
            "duration_s": round(times.duration_s, 3),
            "estimated_s": round(estimate, 1),
            "output_tokens": batch * generated,
            "output_throughput_tok_s": batch * generated / times.duration_s,
            "total_throughput_tok_s": batch * (generated + input_len) / times.duration_s,
            "ttft_ms": times.first_token_s * 1000,
            "tpot_ms": (times.stamps[-1] - times.stamps[1]) / (generated - 1) * 1000,
            "steps_timed": generated,
            "step_ms": step_spread_ms(times),
            "probe": probe_facts,
            "launch_us_before": launch_us,
            "load_1m_before_after": [load_before, _load_1m()],
            **runner.level_extras(),
        }
        result["levels"][str(batch)] = level
        result["largest_batch_served"] = batch
        print(
            f"batch {batch}: {level['output_throughput_tok_s']:.0f} output tok/s, "
            f"TTFT {level['ttft_ms']:.0f} ms, TPOT {level['tpot_ms']:.1f} ms, "
            f"{times.duration_s:.1f} s (estimated {estimate:.1f} s), load {level['load_1m_before_after']}",
            flush=True,
        )
        save()


def _record_oom(result: dict[str, Any], batch: int, message: str) -> None:
    result["oom_at_batch"] = batch
    result["levels"][str(batch)] = {"batch": batch, "oom": True, "error": message[:300]}
    print(f"batch {batch}: out of memory", flush=True)


def _load_1m() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _write(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1))
    temporary.replace(path)


class TransformersRunner:
    """`generate` on a randomly initialised model of the directory's shape."""

    def __init__(
        self, model_dir: Path, device: str, input_len: int, token_id_range: tuple[int, int]
    ) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        self.torch = torch
        self.device = device
        self.on_gpu = device.startswith("cuda")
        self.input_len = input_len
        self.token_id_range = token_id_range
        self.config = LlamaConfig.from_pretrained(str(model_dir))
        torch.set_default_dtype(torch.bfloat16)
        build_began = time.perf_counter()
        with torch.device(device):
            self.model = LlamaForCausalLM(self.config)  # random init on the device itself: no host copy
        self.model.eval()
        self.synchronize()
        self.build_s = round(time.perf_counter() - build_began, 2)
        self.generator = torch.Generator(device="cpu").manual_seed(0)

    def synchronize(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize()

    def generate(self, batch: int, new_tokens: int) -> StepTimes:
        from transformers.generation.streamers import BaseStreamer

        torch = self.torch

        class StepClock(BaseStreamer):
            """put() is called with the prompt first, then once per generated step."""

            def __init__(self) -> None:
                self.stamps: list[float] = []

            def put(self, value: Any) -> None:
                self.stamps.append(time.perf_counter())

            def end(self) -> None:
                self.stamps.append(time.perf_counter())

        low, high = self.token_id_range
        ids = torch.randint(low, high, (batch, self.input_len), generator=self.generator).to(self.device)
        clock = StepClock()
        if self.on_gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        self.synchronize()
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                output = self.model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    pad_token_id=0,
                    eos_token_id=self.config.eos_token_id,
                    streamer=clock,
                )
            self.synchronize()
        except torch.OutOfMemoryError as error:
            raise OutOfMemory(str(error)) from None
        if tuple(output.shape) != (batch, self.input_len + new_tokens):
            raise RuntimeError(
                f"expected output shape {(batch, self.input_len + new_tokens)}, got {tuple(output.shape)}"
            )
        del output
        if len(clock.stamps) != new_tokens + 2:  # the prompt, each new token, the end
            raise RuntimeError(f"the streamer saw {len(clock.stamps) - 2} steps, expected {new_tokens}")
        return StepTimes(start, clock.stamps)

    def level_extras(self) -> dict[str, Any]:
        if not self.on_gpu:
            return {}
        return {
            "peak_memory_allocated_mib": round(self.torch.cuda.max_memory_allocated() / 2**20),
            "peak_memory_reserved_mib": round(self.torch.cuda.max_memory_reserved() / 2**20),
        }

    def launch_us(self) -> float | None:
        if not self.on_gpu:
            return None
        torch = self.torch
        scratch = torch.zeros(1, device=self.device)
        self.synchronize()
        began = time.perf_counter()
        for _ in range(LAUNCH_PROBE_KERNELS):
            scratch.add_(1)
        self.synchronize()
        return round((time.perf_counter() - began) / LAUNCH_PROBE_KERNELS * 1e6, 2)


def run(
    model_dir: Path,
    out: Path,
    *,
    batch_sizes: list[int],
    input_len: int,
    output_len: int,
    device: str,
    budget_s: float,
    token_id_range: tuple[int, int],
    probe_steps: int = PROBE_STEPS,
) -> dict[str, Any]:
    began = time.time()
    import torch
    import transformers

    on_gpu = device.startswith("cuda")
    result: dict[str, Any] = {
        "environment": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": device,
            "gpu": torch.cuda.get_device_name(0) if on_gpu else None,
            "attn_implementation": None,
            "cpu_at_start": cpu_facts(),
        },
        "workload": {
            "input_len": input_len,
            "output_len": output_len,
            "batch_sizes": batch_sizes,
            "decoding": "greedy, min_new_tokens = max_new_tokens",
        },
        "levels": {},
        "largest_batch_served": None,
        "oom_at_batch": None,
        "skipped_for_time": [],
    }
    runner = TransformersRunner(model_dir, device, input_len, token_id_range)
    result["build_s"] = runner.build_s
    result["parameters_billion"] = round(sum(p.numel() for p in runner.model.parameters()) / 1e9, 3)
    result["environment"]["attn_implementation"] = getattr(runner.model.config, "_attn_implementation", None)
    _write(out, result)
    runner.generate(1, 4)  # warm-up: kernels, allocator
    run_batches(
        runner,
        result,
        batch_sizes=batch_sizes,
        output_len=output_len,
        budget_s=budget_s,
        elapsed_s=lambda: time.time() - began,
        save=lambda: _write(out, result),
        probe_steps=probe_steps,
    )
    result["environment"]["cpu_at_end"] = cpu_facts()
    result["total_s"] = round(time.time() - began, 1)
    _write(out, result)
    return result


def tokenizer_id_range(model_dir: Path) -> tuple[int, int]:
    """Token ids a prompt may use: the tokenizer's vocabulary past its special tokens."""
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    specials = len(tokenizer.get("added_tokens", []))
    return max(3, specials), len(tokenizer["model"]["vocab"])


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--model-dir", type=Path, required=True)
    cli.add_argument("--out", type=Path, required=True)
    cli.add_argument("--batch-sizes", default="1,8,16,64,256")
    cli.add_argument("--input-len", type=int, default=512)
    cli.add_argument("--output-len", type=int, default=256)
    cli.add_argument("--device", default="cuda")
    cli.add_argument("--budget-s", type=float, default=300)
    cli.add_argument("--probe-steps", type=int, default=PROBE_STEPS)
    args = cli.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run(
        args.model_dir,
        args.out,
        batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
        input_len=args.input_len,
        output_len=args.output_len,
        device=args.device,
        budget_s=args.budget_s,
        token_id_range=tokenizer_id_range(args.model_dir),
        probe_steps=args.probe_steps,
    )


if __name__ == "__main__":
    main()
