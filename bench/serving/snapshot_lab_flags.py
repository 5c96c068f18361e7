"""Dump the lab GPU's vLLM (0.26.0) `vllm serve` parser in the format of scripts/snapshot-vllm-flags.py.

The stack pins vLLM 0.32.0; the lab H200 can only run 0.26.0 (its PyTorch 2.11 pin). prepare.py
translates the rendered arguments with this snapshot, and the GPU selftest re-dumps the parser
there and compares, so the committed file cannot drift from the vLLM that actually runs.

    # on the GPU host (vLLM 0.26.0 importable):
    python3 -m bench.serving.snapshot_lab_flags --output /tmp/flags.json
    # anywhere, from the staged wheel unpacked into DIR, inside the vLLM CPU venv:
    .venv-vllm/bin/python -m bench.serving.snapshot_lab_flags --vllm-source DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "data" / "vllm-0.26.0-server-flags.json"


def _use_cpu_platform() -> None:
    """A CUDA wheel on a machine without a GPU detects no platform; the parser only needs one."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()


def describe(vllm_source: Path | None) -> dict:
    if vllm_source is not None:
        sys.path.insert(0, str(vllm_source))
        _use_cpu_platform()
    sys.path.insert(0, str(REPO_ROOT))
    spec = __import__("importlib").util.spec_from_file_location(
        "snapshot_vllm_flags", REPO_ROOT / "scripts" / "snapshot-vllm-flags.py"
    )
    module = __import__("importlib").util.module_from_spec(spec)
    spec.loader.exec_module(module)
    snapshot = module.describe_serve_parser()
    snapshot["generated_by"] = "bench/serving/snapshot_lab_flags.py"
    snapshot["target_device"] = "lab GPU vLLM (CUDA wheel)"
    return snapshot, module.format_snapshot


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument(
        "--vllm-source", type=Path, help="an unpacked vLLM wheel to import instead of the installed one"
    )
    cli.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = cli.parse_args()
    snapshot, format_snapshot = describe(args.vllm_source)
    text = format_snapshot(snapshot)
    assert json.loads(text) == snapshot
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(
        f"{len(snapshot['options'])} option strings of vllm {snapshot['vllm_version']} serve -> {args.output}"
    )


if __name__ == "__main__":
    main()
