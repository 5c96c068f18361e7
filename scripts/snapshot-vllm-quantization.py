"""Dump the pinned vLLM's quantization methods (`--quantization` values) to infra/data/ as JSON.

Runs inside the vLLM venv (scripts/setup-vllm-cpu.sh), from anywhere:

    VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python scripts/snapshot-vllm-quantization.py [--output PATH]

`vllm serve` takes any string for `--quantization` at parse time and fails only when the engine
starts, so the flags snapshot cannot catch a typo; `vllm-platform validate` checks
`models[].vllm.quantization` against this list (domain/engine_checks.py, quantization_problems).
tests/e2e regenerate it into a temporary file and compare, so it cannot drift from vLLM.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def describe_quantization_methods() -> dict[str, Any]:
    import vllm
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return {
        "vllm_version": vllm.__version__.split("+")[0],
        "source": "vllm.model_executor.layers.quantization.QUANTIZATION_METHODS",
        "generated_by": "scripts/snapshot-vllm-quantization.py",
        "methods": sorted(QUANTIZATION_METHODS),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    snapshot = describe_quantization_methods()
    output = (
        args.output
        or REPO_ROOT / "infra" / "data" / f"vllm-{snapshot['vllm_version']}-quantization-methods.json"
    )
    output.write_text(json.dumps(snapshot, indent=2) + "\n")
    print(f"wrote {output} ({len(snapshot['methods'])} methods)")


if __name__ == "__main__":
    main()
