"""Dump the pinned vLLM's `vllm serve` argument parser to infra/data/ as JSON.

Runs inside the vLLM venv (scripts/setup-vllm-cpu.sh), from anywhere:

    VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python scripts/snapshot-vllm-flags.py [--output PATH]

The snapshot lets `domain/vllm_flags.py` check server arguments at preview time without vLLM
installed. tests/e2e regenerate it into a temporary file and compare, so it cannot drift from the
parser it describes. The parser is built as `vllm serve` builds it (tests/support/vllm_server.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from tests.support.vllm_server import build_serve_parser, serve_subparser  # noqa: E402


def _choices(action: argparse.Action) -> list[str] | None:
    if action.choices is None:
        return None
    # As they are spelled on a command line: `None` is the string vLLM's optional types map to None.
    return [str(choice) for choice in action.choices]


def _nargs(action: argparse.Action) -> int | str | None:
    return action.nargs if isinstance(action.nargs, (int, str)) or action.nargs is None else str(action.nargs)


def describe_serve_parser() -> dict[str, Any]:
    import vllm

    serve = serve_subparser(build_serve_parser())
    deprecated: set[argparse.Action] = getattr(serve, "_deprecated", set())
    options: dict[str, dict[str, Any]] = {}
    positionals: list[dict[str, Any]] = []
    for action in serve._actions:
        if not action.option_strings:
            positionals.append({"dest": action.dest, "nargs": _nargs(action), "choices": _choices(action)})
            continue
        for option in action.option_strings:
            options[option] = {
                "dest": action.dest,
                "action": type(action).__name__,
                "takes_value": action.nargs != 0,
                "nargs": _nargs(action),
                "choices": _choices(action),
                "deprecated": action in deprecated or type(action).__name__.startswith("Deprecated"),
            }
    return {
        "vllm_version": vllm.__version__,
        "command": "vllm serve",
        "generated_by": "scripts/snapshot-vllm-flags.py",
        "target_device": os.environ.get("VLLM_TARGET_DEVICE", ""),
        "allow_abbrev": serve.allow_abbrev,
        "positionals": positionals,
        "options": dict(sorted(options.items())),
    }


def format_snapshot(snapshot: dict[str, Any]) -> str:
    """JSON with one line per option, so a vLLM upgrade reads as a short diff."""
    header = {key: value for key, value in snapshot.items() if key != "options"}
    lines = [json.dumps(header, indent=1)[:-2] + ",", ' "options": {']
    options = list(snapshot["options"].items())
    for position, (name, spec) in enumerate(options):
        comma = "," if position < len(options) - 1 else ""
        lines.append(f"  {json.dumps(name)}: {json.dumps(spec, sort_keys=True)}{comma}")
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--output", type=Path, help="default: infra/data/vllm-<version>-server-flags.json")
    args = cli.parse_args()
    snapshot = describe_serve_parser()
    default_name = f"vllm-{snapshot['vllm_version']}-server-flags.json"
    output = args.output or REPO_ROOT / "infra" / "data" / default_name
    output.parent.mkdir(parents=True, exist_ok=True)
    text = format_snapshot(snapshot)
    assert json.loads(text) == snapshot
    output.write_text(text)
    print(f"{len(snapshot['options'])} option strings of vllm {snapshot['vllm_version']} serve -> {output}")


if __name__ == "__main__":
    main()
