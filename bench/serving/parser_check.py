"""Parse argument lists with the installed vLLM's own `vllm serve` parser (run inside vLLM's Python).

    echo '{"stack": ["/tmp/m/llama8b", "--max-num-seqs", "256"]}' | python3 -m bench.serving.parser_check
    # the lab's 0.26.0 without a GPU: PYTHONPATH=<unpacked wheel> BENCH_FORCE_CPU_PLATFORM=1 (vLLM CPU venv)

Prints one line `PARSER_CHECK={"stack": "accepted" | "<vLLM's error>", ...}`. It also compares the
installed parser with the committed snapshot of the same version (data/vllm-<version>-server-flags.json)
and reports flags that differ under "snapshot".
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


def _validator():
    for module in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args"):
        with contextlib.suppress(ImportError, AttributeError):
            return __import__(module, fromlist=["validate_parsed_serve_args"]).validate_parsed_serve_args
    return None


def _force_cpu_platform() -> None:
    """For a GPU wheel on a machine without a GPU (local checks against the staged 0.26.0 wheel)."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()


def check(argument_lists: dict[str, list[str]]) -> dict[str, str]:
    if os.environ.get("BENCH_FORCE_CPU_PLATFORM") == "1":
        _force_cpu_platform()
    import vllm

    from tests.support.vllm_server import build_serve_parser, serve_subparser

    parser = build_serve_parser()
    validate = _validator()
    results: dict[str, str] = {}
    for name, args in argument_lists.items():
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                namespace = parser.parse_args(["serve", *args])
            if validate is not None:
                validate(namespace)
            results[name] = "accepted"
        except SystemExit:
            lines = [line for line in stderr.getvalue().splitlines() if "error:" in line]
            results[name] = lines[-1] if lines else stderr.getvalue().strip()[-500:]
        except (ValueError, TypeError, AssertionError) as error:
            results[name] = f"rejected: {error}"
    snapshot = DATA / f"vllm-{vllm.__version__}-server-flags.json"
    if snapshot.exists():
        known = set(json.loads(snapshot.read_text())["options"])
        actual = {option for action in serve_subparser(parser)._actions for option in action.option_strings}
        results["snapshot"] = (
            "matches"
            if known == actual
            else f"differs: only installed {sorted(actual - known)[:20]}, "
            f"only snapshot {sorted(known - actual)[:20]}"
        )
    return results


if __name__ == "__main__":
    print("PARSER_CHECK=" + json.dumps(check(json.loads(sys.stdin.read()))), flush=True)
