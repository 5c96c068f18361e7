"""Writes the lab's model folder: a Llama-3.1-8B-shaped config and a tokenizer that knows every token id
the model can emit. vLLM loads it with `--load-format dummy` (or reads the weights mkckpt.py writes).

    python3 bench/serving/mkmodel.py OUT_DIR [--vocab-size N]

Why our own: the GPU recipe's model folder has a 16,000-entry tokenizer for a model of 128,256 output
ids. A model with random weights emits arbitrary ids, and vLLM's output processor (the API-server
process's detokenising step) spends about ten times as long on an id its tokenizer does not know
(bench/serving/detokenize.py measures it), so a lab server with one API process was measuring how
many unknown ids its random weights happened to emit (issue 27). A real checkpoint's tokenizer knows
every id of its model; so does this one: byte-level BPE trained on the Python standard library's
sources (sorted, so the same interpreter gives the same tokenizer), then, until it has exactly
`vocab_size` entries, tokens made of two trained ones. Those never come out of encoding (no merge
makes them) but decode to ordinary text, as a real tokenizer's rare tokens do.
Needs `tokenizers` (on the lab GPU host's image and in the vLLM CPU venv).
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
from pathlib import Path

LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
"""The shape of Llama-3.1-8B (its published config.json), with this tokenizer's special-token ids."""
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "model_max_length": 131072,
    "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:",
}
CORPUS_FILES = 1500


def corpus() -> list[str]:
    """The standard library's Python sources in UTF-8 (a few test files are not), sorted, the first
    CORPUS_FILES: the training text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(stdlib.rglob("*.py")):
        try:
            path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        files.append(str(path))
        if len(files) == CORPUS_FILES:
            break
    return files


def build_tokenizer(vocab_size: int, files: list[str], entries: int | None = None):  # -> tokenizers.Tokenizer
    """A byte-level BPE tokenizer with exactly `vocab_size` entries, ids 0..vocab_size-1 all decodable.
    With `entries` below `vocab_size`: trained to that many and not filled, so the ids above are
    unknown, as in the GPU recipe's model folder (16,000 entries), which detokenize.py measures."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    trained = Tokenizer(models.BPE(unk_token=None))
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.train(
        files,
        trainers.BpeTrainer(
            vocab_size=entries or vocab_size,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    state = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = dict(state["vocab"])
    merges = [
        tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ", 1)) for merge in state["merges"]
    ]
    if len(vocab) > vocab_size:
        raise ValueError(f"trained {len(vocab)} entries, more than the model's {vocab_size}")
    words = [token for token in vocab if token not in SPECIAL_TOKENS]
    draw = random.Random(0)
    while entries is None and len(vocab) < vocab_size:
        token = draw.choice(words) + draw.choice(words)
        if token not in vocab:
            vocab[token] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    for token in SPECIAL_TOKENS:
        tokenizer.add_special_tokens([token])
    return tokenizer


def unknown_ids(tokenizer, vocab_size: int) -> list[int]:
    """The ids below `vocab_size` the tokenizer has no entry for (none for a usable model folder)."""
    return [index for index in range(vocab_size) if tokenizer.id_to_token(index) is None]


def write_model_folder(
    out: Path,
    vocab_size: int = LLAMA_3_1_8B["vocab_size"],
    entries: int | None = None,
    files: list[str] | None = None,
):  # -> tokenizers.Tokenizer
    """config.json, tokenizer.json and tokenizer_config.json in `out`; the tokenizer built for them.
    Without `entries` the tokenizer must know every id below `vocab_size`; with it, it is trained to
    that many entries and the rest stay unknown (detokenize.py's small tokenizer). `files`: the
    training text, `corpus()` when not given."""
    out.mkdir(parents=True, exist_ok=True)
    config = {**LLAMA_3_1_8B, "vocab_size": vocab_size}
    tokenizer = build_tokenizer(vocab_size, corpus() if files is None else files, entries=entries)
    if entries is None:
        missing = unknown_ids(tokenizer, vocab_size)
        if missing or tokenizer.get_vocab_size() != vocab_size:
            raise ValueError(
                f"tokenizer has {tokenizer.get_vocab_size()} entries, {len(missing)} ids unknown"
            )
    (out / "config.json").write_text(json.dumps(config))
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    return tokenizer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab-size", type=int, default=LLAMA_3_1_8B["vocab_size"])
    options = parser.parse_args()
    tokenizer = write_model_folder(options.out, options.vocab_size)
    facts = {"model_vocab": options.vocab_size, "tokenizer_entries": tokenizer.get_vocab_size()}
    print("model dir ready", options.out, json.dumps(facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
