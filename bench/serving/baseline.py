"""The baseline the stack replaces: Hugging Face Transformers `generate` on static batches.

    python3 bench/serving/baseline.py --model-dir /tmp/m/llama8b --out DIR --budget-s 150

The model of the vLLM runs (its config.json), random bf16 weights built on the GPU, SDPA attention,
prompts of 512 random token ids, exactly 256 new tokens (min_new_tokens = max_new_tokens, greedy),
one static batch per size (64 first: the size the 10x target compares at). Static batching is
`generate`'s best case: every request of a batch starts together. TTFT and TPOT come from a
streamer `generate` calls after each step. A batch runs only if, from the previous batch's step
time, it fits the time left. Runs alone on the host; its load is recorded. Writes DIR/baseline.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


class Stamps:
    """A streamer: the time of every put (the prompt, then each step's new tokens) and of end."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, _value: object) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        self.times.append(time.perf_counter())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=150)
    parser.add_argument("--batches", default="64,256,16,1")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    options = parser.parse_args()
    began = time.monotonic()
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_default_dtype(torch.bfloat16)
    config = LlamaConfig.from_pretrained(str(options.model_dir))
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).eval()  # random weights built on the GPU (SDPA attention)
    result = {
        "engine": f"transformers {transformers.__version__} generate (static batches, greedy)",
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "cpus": os.cpu_count(),
        "input_len": options.input_len, "output_len": options.output_len, "levels": {},
    }  # fmt: skip
    options.out.mkdir(parents=True, exist_ok=True)
    step_s = None
    for batch in (int(value) for value in options.batches.split(",")):
        left = options.budget_s - (time.monotonic() - began)
        estimate = (
            30.0 if step_s is None else 2.0 + options.output_len * step_s * (1.2 if batch > 64 else 1.0)
        )
        if estimate > left:
            result["levels"][str(batch)] = {"skipped": f"needs ~{estimate:.0f} s, {left:.0f} s left"}
            continue
        ids = torch.randint(3, config.vocab_size, (batch, options.input_len), device="cuda")
        stamps = Stamps()
        load_before = os.getloadavg()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                model.generate(
                    ids, attention_mask=torch.ones_like(ids), do_sample=False, streamer=stamps,
                    max_new_tokens=options.output_len, min_new_tokens=options.output_len, pad_token_id=0,
                )  # fmt: skip
        except torch.OutOfMemoryError:
            result["levels"][str(batch)] = {"error": "out of memory"}
            torch.cuda.empty_cache()
            continue
        torch.cuda.synchronize()
        duration = time.perf_counter() - start
        first_token = stamps.times[1] - start  # times[0]: the prompt handed to the streamer
        step_s = (stamps.times[-1] - stamps.times[1]) / (options.output_len - 1)
        result["levels"][str(batch)] = {
            "output_throughput": round(batch * options.output_len / duration, 1),
            "ttft_ms": round(first_token * 1000, 1), "tpot_ms": round(step_s * 1000, 2),
            "duration_s": round(duration, 2),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()),
        }  # fmt: skip
        print(f"baseline batch {batch}: {result['levels'][str(batch)]}", flush=True)
        (options.out / "baseline.json").write_text(json.dumps(result, indent=1))
        del ids
    (options.out / "baseline.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
