"""The LoRA model-class snapshot against the real vLLM 0.32.0 it was taken from."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from domain.engine_checks import LORA_ARCHITECTURES_FILE
from tests.support.vllm_server import REPO_ROOT, vllm_subprocess_env

pytestmark = pytest.mark.e2e


def test_snapshot_equals_the_pinned_vllms_own_answers(vllm_python: Path, tmp_path: Path) -> None:
    regenerated = tmp_path / "lora-architectures.json"
    subprocess.run(
        [str(vllm_python), "scripts/snapshot-vllm-lora-architectures.py", "--output", str(regenerated)],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        check=True,
        capture_output=True,
        timeout=600,
    )
    committed, fresh = json.loads(LORA_ARCHITECTURES_FILE.read_text()), json.loads(regenerated.read_text())
    assert fresh == committed, (
        f"{LORA_ARCHITECTURES_FILE.name} is stale. Regenerate it with: "
        "VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python scripts/snapshot-vllm-lora-architectures.py"
    )
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"} <= set(fresh["supports_lora"])
    assert fresh["no_lora"], "some registered class has no LoRA support: the check can fail"
