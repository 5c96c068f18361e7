"""The lab's model folder (bench/serving/mkmodel.py) in the real vLLM 0.32.0 venv: its tokenizer, as
vLLM loads it, knows every id the Llama-3.1-8B-shaped model can emit, so a server with random weights
detokenises what it emits as a real tokenizer would (issue 27: the GPU recipe's 16,000-entry tokenizer
left 112,256 ids unknown, and vLLM's output processor spends ~9x as long on those). And the
detokenising benchmark (bench/serving/detokenize.py) runs against this vLLM's output processor."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

from tests.support.vllm_server import REPO_ROOT, vllm_subprocess_env

KNOWS_EVERY_ID = """
import json, sys
from vllm.tokenizers import get_tokenizer
tokenizer = get_tokenizer(sys.argv[1])
vocab = json.load(open(sys.argv[1] + "/config.json"))["vocab_size"]
tokens = tokenizer.convert_ids_to_tokens(list(range(vocab)))
print(json.dumps({"vocab": vocab, "unknown": sum(token is None for token in tokens),
                  "text": tokenizer.decode([vocab - 1, 20000, 300])}))
"""


def _run(vllm_python: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(vllm_python), *args], cwd=REPO_ROOT, env=vllm_subprocess_env(),
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _lab_module():
    spec = importlib.util.spec_from_file_location("lab", REPO_ROOT / "bench" / "serving" / "lab.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lab_model_folder_tokenizer_knows_every_id_the_model_emits(
    vllm_python: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "llama8b"
    built = _run(vllm_python, "-m", "bench.serving.mkmodel", str(folder))
    assert built.returncode == 0, built.stderr[-2000:]
    assert '"tokenizer_entries": 128256' in built.stdout
    checked = _run(vllm_python, "-c", KNOWS_EVERY_ID, str(folder))
    assert checked.returncode == 0, checked.stderr[-2000:]
    facts = json.loads(checked.stdout.strip().splitlines()[-1])
    assert (facts["vocab"], facts["unknown"]) == (128256, 0)
    assert facts["text"].strip()  # ids above the recipe's 16,000 decode to text
    # What lab.py records in session.json, and what the report groups the session's servers by.
    assert _lab_module().model_folder_facts(folder) == {"model_vocab": 128256, "tokenizer_knows": 128256}


def test_the_detokenising_benchmark_runs_on_vllms_output_processor(vllm_python: Path, tmp_path: Path) -> None:
    out = tmp_path / "detokenize.json"
    ran = _run(
        vllm_python, "-m", "bench.serving.detokenize", "--out", str(out),
        "--streams", "4", "--tokens", "8", "--repeats", "1",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["host"]["vllm"] == "0.32.0"
    assert result["tokenizers"] == {
        "full": {"entries": 128256, "unknown_ids": 0},
        "small": {"entries": 16000, "unknown_ids": 112256},
    }
    assert len(result["median_ms_per_step"]) == 4
    assert all(len(entry["values"]) == 1 for entry in result["median_ms_per_step"].values())
