"""Writes a real-size Llama-3.1-8B checkpoint of random bf16 tensors (safetensors, 4 shards) on local disk.

    python3 bench/startup/mkckpt.py MODEL_DIR OUT_DIR   # MODEL_DIR: bench/serving/mkmodel.py's folder

The weight-loading measurement (issue 24) needs real bytes on disk: `--load-format dummy` skips the
read. Values are uniform in [-1e-3, 1e-3], as vLLM's dummy loader draws them, so activations stay finite
and the served speed is the dummy's. Tensor names and shapes are the Hugging Face Llama layout that
vLLM's loader maps; `model.safetensors.index.json` lists the shards as a hub checkpoint does.
Needs torch and safetensors (both on the lab GPU host's image).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path


def shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    vocab = config["vocab_size"]
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        out += [
            (f"{p}.input_layernorm.weight", (hidden,)),
            (f"{p}.self_attn.q_proj.weight", (heads * head_dim, hidden)),
            (f"{p}.self_attn.k_proj.weight", (kv_heads * head_dim, hidden)),
            (f"{p}.self_attn.v_proj.weight", (kv_heads * head_dim, hidden)),
            (f"{p}.self_attn.o_proj.weight", (hidden, heads * head_dim)),
            (f"{p}.post_attention_layernorm.weight", (hidden,)),
            (f"{p}.mlp.gate_proj.weight", (inter, hidden)),
            (f"{p}.mlp.up_proj.weight", (inter, hidden)),
            (f"{p}.mlp.down_proj.weight", (hidden, inter)),
        ]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def main() -> int:
    import torch
    from safetensors.torch import save_file

    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.is_file():
            shutil.copy(item, out / item.name)
    config = json.loads((model_dir / "config.json").read_text())
    entries = shapes(config)
    total = sum(2 * _numel(shape) for _, shape in entries)
    shards, budget = 4, total / 4
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(0)
    began, index, part, size, weight_map = time.monotonic(), 1, {}, 0, {}

    def flush() -> None:
        nonlocal part, size, index
        name = f"model-{index:05d}-of-{shards:05d}.safetensors"
        save_file({k: v.cpu() for k, v in part.items()}, str(out / name), metadata={"format": "pt"})
        for key in part:
            weight_map[key] = name
        part, size, index = {}, 0, index + 1

    for name, shape in entries:
        tensor = torch.empty(shape, dtype=torch.bfloat16, device=device).uniform_(
            -1e-3, 1e-3, generator=generator
        )
        part[name] = tensor
        size += 2 * tensor.numel()
        if size >= budget and index < shards:
            flush()
    if part:
        flush()
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=1))
    seconds = time.monotonic() - began
    print(json.dumps({"dir": str(out), "bytes": total, "shards": index - 1, "write_s": round(seconds, 1)}))
    return 0


def _numel(shape: tuple[int, ...]) -> int:
    result = 1
    for dim in shape:
        result *= dim
    return result


if __name__ == "__main__":
    sys.exit(main())
