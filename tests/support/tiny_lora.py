"""A tiny LoRA adapter for the tiny test model (tests/support/tiny_model.py), made by PEFT itself.

PEFT (pinned in scripts/setup-vllm-cpu.sh) wraps a Transformers Llama of the tiny model's config and
writes `adapter_config.json` and `adapter_model.safetensors` with `save_pretrained`, exactly what a
fine-tune publishes. Its A and B matrices are drawn from a seeded generator and scaled up
(`init_lora_weights=False` leaves B non-zero, unlike a fresh fine-tune), so at temperature 0 the
adapter answers differently from the base model and always the same.

Needs torch, transformers and peft, which the vLLM venv has; run it there:

    .venv-vllm/bin/python -m tests.support.tiny_lora OUT_DIR RANK SEED
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.tiny_model import TINY_LLAMA_CONFIG

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
WEIGHT_SCALE = 8.0
"""vLLM's dummy base weights are uniform in ±1e-3, so an adapter of this size dominates the output."""


def build_tiny_lora(out_dir: Path, rank: int, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    base = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA_CONFIG))
    config = LoraConfig(
        r=rank,
        lora_alpha=rank,
        target_modules=TARGET_MODULES,
        lora_dropout=0.0,
        bias="none",
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * WEIGHT_SCALE / rank**0.5)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m tests.support.tiny_lora OUT_DIR RANK SEED")
    print(build_tiny_lora(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
