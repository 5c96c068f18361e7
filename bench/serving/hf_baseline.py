"""The baseline the stack replaces: Hugging Face Transformers `generate` on static batches.

    python3 -m bench.serving.hf_baseline --model-dir /tmp/m/llama8b --out baseline.json

The same model shape as the vLLM runs (config.json of the model directory), random bf16 weights
built directly on the GPU, prompts of `input_len` random token ids, exactly `output_len` new tokens
(`min_new_tokens` = `max_new_tokens`, greedy), batch sizes in increasing order until the first
out-of-memory error. Static batching is the best case for `generate`: every request of a batch
starts together, so TTFT here is one batched prefill; a server that queues requests behind a running
batch would show longer TTFTs. Times come from a streamer that `generate` calls after every step
with the new tokens copied to the CPU (a synchronising copy), so they are GPU-accurate.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def _write(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1))
    temporary.replace(path)


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
) -> dict[str, Any]:
    began = time.time()
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.generation.streamers import BaseStreamer

    class StepClock(BaseStreamer):
        """put() is called with the prompt first, then once per generated step."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def put(self, value: Any) -> None:
            self.times.append(time.perf_counter())

        def end(self) -> None:
            self.times.append(time.perf_counter())

    on_gpu = device.startswith("cuda")
    result: dict[str, Any] = {
        "environment": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": device,
            "gpu": torch.cuda.get_device_name(0) if on_gpu else None,
            "attn_implementation": None,
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
    config = LlamaConfig.from_pretrained(str(model_dir))
    dtype = torch.bfloat16
    torch.set_default_dtype(dtype)
    build_began = time.perf_counter()
    with torch.device(device):
        model = LlamaForCausalLM(config)  # random init on the device itself: seconds, no host copy
    model.eval()
    if on_gpu:
        torch.cuda.synchronize()
    result["build_s"] = round(time.perf_counter() - build_began, 2)
    result["parameters_billion"] = round(sum(p.numel() for p in model.parameters()) / 1e9, 3)
    result["environment"]["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    _write(out, result)

    generator = torch.Generator(device="cpu").manual_seed(0)

    def generate(batch: int, new_tokens: int) -> tuple[float, StepClock, Any]:
        ids = torch.randint(token_id_range[0], token_id_range[1], (batch, input_len), generator=generator).to(
            device
        )
        clock = StepClock()
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            output = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=config.eos_token_id,
                streamer=clock,
            )
        if on_gpu:
            torch.cuda.synchronize()
        return start, clock, output

    generate(1, 4)  # warm-up: kernels, allocator
    previous: tuple[int, float] | None = None
    for batch in batch_sizes:
        remaining = budget_s - (time.time() - began)
        if previous is not None:
            estimate = previous[1] * batch / previous[0]  # decode time grows at most linearly with batch
            if estimate > remaining:
                result["skipped_for_time"].append(
                    {"batch": batch, "estimated_s": round(estimate, 1), "remaining_s": round(remaining, 1)}
                )
                print(f"batch {batch}: skipped, ~{estimate:.0f} s needed, {remaining:.0f} s left", flush=True)
                continue
        if on_gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            start, clock, output = generate(batch, output_len)
        except torch.OutOfMemoryError as error:
            result["oom_at_batch"] = batch
            result["levels"][str(batch)] = {"batch": batch, "oom": True, "error": str(error)[:300]}
            print(f"batch {batch}: out of memory", flush=True)
            _write(out, result)
            break
        end = clock.times[-1]
        first = clock.times[1]  # times[0] is the prompt being handed to the streamer
        generated = output.shape[1] - input_len
        if tuple(output.shape) != (batch, input_len + output_len):
            raise RuntimeError(
                f"expected output shape {(batch, input_len + output_len)}, got {tuple(output.shape)}"
            )
        duration = end - start
        level = {
            "batch": batch,
            "duration_s": round(duration, 3),
            "output_tokens": batch * generated,
            "output_throughput_tok_s": batch * generated / duration,
            "total_throughput_tok_s": batch * (generated + input_len) / duration,
            "ttft_ms": (first - start) * 1000,
            "tpot_ms": (end - first) / (generated - 1) * 1000,
            "steps_timed": len(clock.times) - 2,
        }
        if on_gpu:
            level["peak_memory_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
            level["peak_memory_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20)
        result["levels"][str(batch)] = level
        result["largest_batch_served"] = batch
        previous = (batch, duration)
        print(
            f"batch {batch}: {level['output_throughput_tok_s']:.0f} output tok/s, "
            f"TTFT {level['ttft_ms']:.0f} ms, "
            f"TPOT {level['tpot_ms']:.1f} ms, {duration:.1f} s",
            flush=True,
        )
        _write(out, result)
        del output
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
    )


if __name__ == "__main__":
    main()
