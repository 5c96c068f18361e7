"""The quantization-method snapshot against the real vLLM 0.32.0 it was taken from."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from domain.engine_checks import QUANTIZATION_METHODS_FILE, pinned_quantization_methods
from tests.support.vllm_server import REPO_ROOT, vllm_subprocess_env

pytestmark = pytest.mark.e2e


def test_snapshot_equals_the_pinned_vllms_own_list(vllm_python: Path, tmp_path: Path) -> None:
    regenerated = tmp_path / "quantization.json"
    subprocess.run(
        [str(vllm_python), "scripts/snapshot-vllm-quantization.py", "--output", str(regenerated)],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    committed, fresh = json.loads(QUANTIZATION_METHODS_FILE.read_text()), json.loads(regenerated.read_text())
    assert fresh == committed, (
        f"{QUANTIZATION_METHODS_FILE.name} is stale: "
        f"added {sorted(set(fresh['methods']) - set(committed['methods']))}, "
        f"removed {sorted(set(committed['methods']) - set(fresh['methods']))}. Regenerate it with: "
        "VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python scripts/snapshot-vllm-quantization.py"
    )
    assert {"fp8", "awq", "gptq"} <= set(pinned_quantization_methods())
