"""A tiny random Llama that the real vLLM serves on CPU in about a minute.

Only `config.json` and a tokenizer are written; vLLM serves it with `--load-format dummy` (random
weights), which is enough to exercise the OpenAI API, SSE, API keys and `/metrics` for real.

Needs the `tokenizers` library, which the vLLM venv has; run it there:

    .venv-vllm/bin/python -m tests.support.tiny_model OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

# Small enough to load and warm up in seconds on two cores. head_dim is 32 because vLLM's CPU
# attention backend supports no smaller head (0.32.0: 32, 64, 80, ...); 2 KV heads for 4 query heads
# keep the grouped-query attention path that real Llamas use.
TINY_LLAMA_CONFIG: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
# A fixed, sorted slice of the interpreter's own standard library: local, and the same input on
# every run, so the trained tokenizer is the same too.
TRAINING_MODULES = (
    "argparse.py",
    "ast.py",
    "base64.py",
    "calendar.py",
    "configparser.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "heapq.py",
    "inspect.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "pathlib.py",
    "shlex.py",
    "string.py",
    "textwrap.py",
)


def _training_files() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [stdlib / name for name in TRAINING_MODULES if (stdlib / name).is_file()]
    if len(files) < len(TRAINING_MODULES) // 2:
        raise RuntimeError(f"too few standard-library sources found under {stdlib} to train a tokenizer")
    return [str(path) for path in files]


def build_tiny_llama(out_dir: Path) -> Path:
    """Write a tiny Llama model directory (config + trained BPE tokenizer) into `out_dir`.

    Deterministic for a given Python: the same files in, the same bytes out. Returns `out_dir`.
    """
    # Imported here so that importing this module (e.g. for the config) needs no `tokenizers`.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG, indent=2, sort_keys=True) + "\n")

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(TINY_LLAMA_CONFIG["vocab_size"]),  # type: ignore[call-overload]
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(_training_files(), trainer)
    tokenizer.save(str(out_dir / "tokenizer.json"))

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "model_max_length": TINY_LLAMA_CONFIG["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    tokenizer_config_json = json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n"
    (out_dir / "tokenizer_config.json").write_text(tokenizer_config_json)
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.support.tiny_model OUT_DIR")
    print(build_tiny_llama(Path(sys.argv[1])))
