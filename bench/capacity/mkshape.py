"""Writes a model directory of a catalogue preset's shape, servable by vLLM with --load-format dummy.

    python3 bench/capacity/mkshape.py qwen2.5-7b /tmp/m/qwen7b --tokenizer-from /tmp/m/llama8b

config.json is the preset's config.json values from domain/catalogue/model_shapes.yaml (architectures,
model_type, rope settings, ...) in bfloat16; the tokenizer files are copied from another model
directory (e.g. the one shared/gpu/mkmodel.py writes), whose bos/eos token ids replace the preset's
so the copied tokenizer and the config agree. The model's vocabulary may be larger than the
tokenizer's: with dummy weights the extra rows are never produced by the tokenizer, and memory is
that of the real model. Needs only Python and PyYAML (present wherever vLLM is installed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import yaml

CATALOGUE = Path(__file__).resolve().parents[2] / "domain" / "catalogue" / "model_shapes.yaml"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


def preset_config_json(name: str, catalogue: Path = CATALOGUE) -> dict:
    presets = yaml.safe_load(catalogue.read_text())["presets"]
    if name not in presets:
        raise SystemExit(f"unknown preset '{name}'; {catalogue} has: {', '.join(sorted(presets))}")
    config = dict(presets[name]["config_json"])
    config["torch_dtype"] = "bfloat16"
    return config


def write_model_dir(name: str, out_dir: Path, tokenizer_from: Path) -> Path:
    config = preset_config_json(name)
    source_config = tokenizer_from / "config.json"
    if source_config.is_file():
        source = json.loads(source_config.read_text())
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if key in source:
                config[key] = source[key]
    copied = [file for file in TOKENIZER_FILES if (tokenizer_from / file).is_file()]
    if "tokenizer.json" not in copied and "tokenizer.model" not in copied:
        raise SystemExit(f"{tokenizer_from} has no tokenizer.json or tokenizer.model to copy")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for file in copied:
        shutil.copyfile(tokenizer_from / file, out_dir / file)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", help="a preset of domain/catalogue/model_shapes.yaml, e.g. qwen2.5-7b")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--tokenizer-from", type=Path, required=True, help="model directory to copy the tokenizer from"
    )
    args = parser.parse_args(argv)
    out = write_model_dir(args.preset, args.out_dir, args.tokenizer_from)
    print(f"model dir ready: {out} ({args.preset})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
