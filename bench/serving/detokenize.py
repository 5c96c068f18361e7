"""What one API-server process spends per decode step on detokenising, with vLLM's own output processor,
for a tokenizer that knows every id the model emits and for one that knows 16,000 of 128,256.

    .venv-vllm/bin/python -m bench.serving.detokenize --out bench/serving/cpu/<date>/detokenize.json

Runs vLLM's `OutputProcessor.process_outputs` (the step the API server runs on every engine output,
vllm/v1/engine/output_processor.py) for `--streams` streamed requests (DELTA outputs, as the OpenAI
server asks for them), one new token per request per step, `--tokens` steps, on the CPU: no GPU and no
engine, only the frontend's per-token work. Token ids are drawn uniformly from the model's 128,256
(a model with random weights emits arbitrary ids, often long runs of the same few), from the ids the
small tokenizer does not know, or from those it knows. Each case runs
`--repeats` times, interleaved; the result is the median time per step and its range. The model
folders are bench/serving/mkmodel.py's, built in a temporary folder. Issue 27: the lab's servers with
one API process served a third less on one set of random weights than on another; this measures why.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.serving import mkmodel, report

SMALL = 16000
"""Entries of the GPU recipe's lab tokenizer (its mkmodel.py), which the 2026-12-01-b to 2026-12-02-b
sessions served with."""


def step_times(tokenizer_dir: Path, draw: Any, streams: int, tokens: int) -> list[float]:
    """Seconds per process_outputs call, one call per decode step of `streams` requests."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest
    from vllm.v1.engine.output_processor import OutputProcessor

    processor = OutputProcessor(get_tokenizer(str(tokenizer_dir)), log_stats=False)
    for index in range(streams):
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        request = EngineCoreRequest(
            request_id=f"r{index}", prompt_token_ids=[5] * 512, mm_features=None, sampling_params=params,
            pooling_params=None, arrival_time=time.time(), lora_request=None, cache_salt=None,
            data_parallel_rank=None, external_req_id=f"r{index}",
        )  # fmt: skip
        processor.add_request(request, prompt=None)
    times = []
    for _ in range(tokens - 1):  # the last token would finish the requests
        outputs = [
            EngineCoreOutput(request_id=f"r{index}", new_token_ids=[draw()]) for index in range(streams)
        ]
        began = time.perf_counter()
        processor.process_outputs(outputs)
        times.append(time.perf_counter() - began)
    return times


def measure(streams: int, tokens: int, repeats: int, seed: int) -> dict[str, Any]:
    vocab = mkmodel.LLAMA_3_1_8B["vocab_size"]
    files = mkmodel.corpus()
    draw = random.Random(seed)

    def above() -> int:
        return draw.randrange(SMALL, vocab)

    def below() -> int:
        return draw.randrange(3, SMALL)

    def anywhere() -> int:
        return draw.randrange(vocab)

    with tempfile.TemporaryDirectory() as scratch:
        folders = {}
        for name, entries in (("full", None), ("small", SMALL)):
            folder = Path(scratch) / name
            tokenizer = mkmodel.write_model_folder(folder, vocab, entries=entries, files=files)
            folders[name] = (folder, tokenizer.get_vocab_size(), len(mkmodel.unknown_ids(tokenizer, vocab)))
        cases = {
            "16,000-entry tokenizer, ids it does not know (>= 16,000)": ("small", above),
            "full tokenizer, the same ids": ("full", above),
            "16,000-entry tokenizer, ids it knows (< 16,000)": ("small", below),
            "16,000-entry tokenizer, any of the model's ids": ("small", anywhere),
        }
        per_case: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(repeats):
            for name, (folder_name, id_draw) in cases.items():
                times = step_times(folders[folder_name][0], id_draw, streams, tokens)
                per_case[name].append(statistics.median(times) * 1e3)
    return {
        "streams": streams,
        "tokens": tokens,
        "repeats": repeats,
        "seed": seed,
        "model_vocab": vocab,
        "tokenizers": {
            name: {"entries": entries, "unknown_ids": unknown}
            for name, (_, entries, unknown) in folders.items()
        },
        "median_ms_per_step": {
            name: report.distribution(values, digits=2) for name, values in per_case.items()
        },
    }


def host_facts() -> dict[str, Any]:
    from vllm import __version__ as vllm_version

    return {
        "cpus": os.cpu_count(),
        "load_average_before": list(os.getloadavg()),
        "python": sys.version.split()[0],
        "vllm": vllm_version,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    host = host_facts()
    result = {"host": host, **measure(options.streams, options.tokens, options.repeats, options.seed)}
    result["host"]["load_average_after"] = list(os.getloadavg())
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, entry in result["median_ms_per_step"].items():
        spread = f"{entry['min']}-{entry['max']}"
        print(f"{name}: {entry['median']} ms per step of {options.streams} tokens ({spread})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
