"""Dump the model classes for which the pinned vLLM serves LoRA adapters to infra/data/ as JSON.

Runs inside the vLLM venv (scripts/setup-vllm-cpu.sh), from anywhere:

    VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python scripts/snapshot-vllm-lora-architectures.py [--output PATH]

vLLM serves adapters only for model classes that implement its `SupportsLoRA` interface (the "LoRA"
column of https://docs.vllm.ai/en/v0.32.0/models/supported_models.html is generated from the same
flag). `vllm serve --enable-lora` parses for any model and fails only when the engine loads it, so
`vllm-platform validate` checks `models[].architecture.architecture_class` of models with `lora`
against this list (domain/engine_checks.py, lora_architecture_problems). tests/e2e regenerate it into a
temporary file and compare, so it cannot drift from vLLM.

Every registered class is imported in this one process and asked `supports_lora` (vLLM's own
predicate, vllm.model_executor.models.interfaces); classes whose module does not import on this
machine (CUDA-only dependencies) are listed apart, so the check can say "unknown" instead of "no".
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def describe_lora_architectures() -> dict[str, Any]:
    import vllm
    from vllm.model_executor.models.interfaces import supports_lora
    from vllm.model_executor.models.registry import ModelRegistry

    logging.disable(logging.WARNING)
    supported, unsupported, not_importable = [], [], []
    for architecture in sorted(ModelRegistry.get_supported_archs()):
        try:
            model_class = ModelRegistry._try_load_model_cls(architecture)
        except Exception:  # a module that needs what this CPU build lacks
            model_class = None
        if model_class is None:
            not_importable.append(architecture)
        elif supports_lora(model_class):
            supported.append(architecture)
        else:
            unsupported.append(architecture)
    return {
        "vllm_version": vllm.__version__.split("+")[0],
        "source": (
            "vllm.model_executor.models.interfaces.supports_lora over ModelRegistry.get_supported_archs()"
        ),
        "generated_by": "scripts/snapshot-vllm-lora-architectures.py",
        "supports_lora": supported,
        "no_lora": unsupported,
        "not_importable_here": not_importable,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    snapshot = describe_lora_architectures()
    output = (
        args.output
        or REPO_ROOT / "infra" / "data" / f"vllm-{snapshot['vllm_version']}-lora-architectures.json"
    )
    output.write_text(json.dumps(snapshot, indent=2) + "\n")
    print(
        f"wrote {output} ({len(snapshot['supports_lora'])} with LoRA, {len(snapshot['no_lora'])} without, "
        f"{len(snapshot['not_importable_here'])} not importable here)"
    )


if __name__ == "__main__":
    main()
