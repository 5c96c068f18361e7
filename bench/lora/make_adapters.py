"""Write N random LoRA adapters for a model shape, in PEFT's on-disk format, without the base model.

For issue 25's GPU table (output tokens/s and p99 TTFT at 256 concurrent with 0, 1, 4 and 16 rank-16
adapters of Llama-3.1-8B in use): vLLM's cost of an adapter depends only on its shape and rank, not
on trained values, so random tensors of the right shape measure it. Each adapter targets the seven
linear layers of every decoder layer (q, k, v, o, gate, up, down), the usual "all-linear" fine-tune.

    python bench/lora/make_adapters.py OUT_DIR --preset llama-3.1-8b --rank 16 --count 16
    python bench/lora/make_adapters.py OUT_DIR --config-json path/to/config.json --rank 16 --count 1

writes OUT_DIR/adapter-00 ... each with adapter_config.json and adapter_model.safetensors (bf16).
Needs torch and safetensors (the vLLM environment has both); the preset is read from
domain/catalogue/model_shapes.yaml. tests/e2e/test_lora.py loads one made for the tiny test model with
PEFT itself, so the names and shapes are PEFT's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def module_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) of each targeted linear layer, from a Llama-style config.json."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads") or heads
    inter = config["intermediate_size"]
    return {
        "self_attn.q_proj": (hidden, heads * head_dim),
        "self_attn.k_proj": (hidden, kv * head_dim),
        "self_attn.v_proj": (hidden, kv * head_dim),
        "self_attn.o_proj": (heads * head_dim, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }


def write_adapter(out_dir: Path, config: dict[str, Any], rank: int, seed: int, scale: float = 0.01) -> Path:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (in_size, out_size) in module_shapes(config).items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(rank, in_size, generator=generator) * scale).to(
                torch.bfloat16
            )
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(out_size, rank, generator=generator) * scale
            ).to(torch.bfloat16)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "target_modules": list(TARGET_MODULES),
        "modules_to_save": None,
        "base_model_name_or_path": None,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    return out_dir


def preset_config(name: str) -> dict[str, Any]:
    import yaml

    catalogue = yaml.safe_load((REPO_ROOT / "domain" / "catalogue" / "model_shapes.yaml").read_text())
    return dict(catalogue["presets"][name]["config_json"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    shape = parser.add_mutually_exclusive_group(required=True)
    shape.add_argument("--preset", help="a preset of domain/catalogue/model_shapes.yaml, e.g. llama-3.1-8b")
    shape.add_argument("--config-json", type=Path, help="a Hugging Face config.json")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = preset_config(args.preset) if args.preset else json.loads(args.config_json.read_text())
    for index in range(args.count):
        print(write_adapter(args.out_dir / f"adapter-{index:02d}", config, args.rank, args.seed + index))


if __name__ == "__main__":
    main()
