"""Command line: `model-cache preload ...` and `model-cache verify --dir PATH`.

stdout carries one thing: the directory vLLM should load (last line). Everything else is JSON on
stderr. Failures end with one `error` event and a one-line message in the Kubernetes termination
log, and an exit code from the table in README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from model_cache import __version__
from model_cache.completion import LockSettings
from model_cache.download import MIB, DownloadSettings
from model_cache.errors import ExitCode, IntegrityError, PreloadError, UsageError, is_out_of_space
from model_cache.jsonlog import log
from model_cache.layout import validate_component
from model_cache.manifest import verify_directory
from model_cache.preload import AdapterSpec, PreloadOptions, preload

# Kubernetes shows this file's content in `kubectl describe pod` as the container's last state.
TERMINATION_LOG = Path(os.environ.get("MODEL_CACHE_TERMINATION_LOG", "/dev/termination-log"))


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="model-cache", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"model-cache {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("preload", help="make a model revision available locally, print its path")
    run.add_argument("--model-name", required=True)
    run.add_argument(
        "--source", required=True, help="s3://bucket/prefix (reads prefix/REVISION/) or hf://org/repo"
    )
    run.add_argument("--revision", required=True)
    run.add_argument("--shared-root", type=Path, required=True, help="shared RWX volume (EFS) mount")
    run.add_argument("--local-root", type=Path, help="node-local NVMe mount; served copy when given")
    run.add_argument(
        "--compile-cache-gpu-type", help="with --compile-cache-vllm-version: create the compile cache dir"
    )
    run.add_argument("--compile-cache-vllm-version")
    run.add_argument("--hf-token-file", type=Path, help="file holding a Hugging Face token (secret mount)")
    run.add_argument("--part-size-mib", type=_positive_int, default=64)
    run.add_argument("--concurrency", type=_positive_int, default=16, help="parallel ranged GETs")
    run.add_argument("--lock-ttl-seconds", type=_positive_float, default=60.0)
    run.add_argument("--lock-wait-timeout-seconds", type=_positive_float, default=3600.0)
    run.add_argument(
        "--verify", choices=["sizes", "sha256"], default="sizes", help="check of an existing copy"
    )
    run.add_argument("--endpoint-url", help="S3 API endpoint (or Hugging Face hub URL for hf://)")
    run.add_argument("--read-timeout-seconds", type=_positive_float, default=60.0)
    run.add_argument("--max-attempts", type=_positive_int, default=5, help="per request / per chunk")
    run.add_argument("--progress-interval-seconds", type=_positive_float, default=5.0)
    run.add_argument(
        "--adapter",
        nargs=4,
        action="append",
        default=[],
        metavar=("NAME", "SOURCE", "REVISION", "RANK"),
        help="a LoRA adapter to preload beside the model (repeatable); SOURCE like --source",
    )
    run.add_argument(
        "--skip-etag-check", action="store_true", help="do not compare downloads with MD5-based S3 ETags"
    )

    check = commands.add_parser("verify", help="exit 0 only if DIR has a valid marker and matching files")
    check.add_argument("--dir", type=Path, required=True)
    check.add_argument("--verify", choices=["sizes", "sha256"], default="sha256")
    return parser


def _options(args: argparse.Namespace) -> PreloadOptions:
    return PreloadOptions(
        model_name=args.model_name,
        source=args.source,
        revision=args.revision,
        shared_root=args.shared_root,
        local_root=args.local_root,
        compile_cache_gpu_type=args.compile_cache_gpu_type,
        compile_cache_vllm_version=args.compile_cache_vllm_version,
        hf_token_file=args.hf_token_file,
        endpoint_url=args.endpoint_url,
        verify=args.verify,
        read_timeout_seconds=args.read_timeout_seconds,
        download=DownloadSettings(
            part_size_bytes=args.part_size_mib * MIB,
            concurrency=args.concurrency,
            max_attempts=args.max_attempts,
            etag_check=not args.skip_etag_check,
            progress_interval_seconds=args.progress_interval_seconds,
        ),
        lock=LockSettings(
            ttl_seconds=args.lock_ttl_seconds,
            wait_timeout_seconds=args.lock_wait_timeout_seconds,
            progress_interval_seconds=args.progress_interval_seconds,
        ),
        adapters=tuple(_adapter(*values) for values in args.adapter),
    )


def _adapter(name: str, source: str, revision: str, rank: str) -> AdapterSpec:
    if not rank.isdigit() or int(rank) < 1:
        raise UsageError(f"--adapter {name}: RANK must be a whole number >= 1, not {rank!r}")
    return AdapterSpec(
        name=validate_component(name, "adapter name"), source=source, revision=revision, rank=int(rank)
    )


def _fail(code: ExitCode, message: str) -> int:
    log("error", level="error", exit_code=int(code), exit_name=code.name.lower(), message=message)
    try:
        # Only where Kubernetes created it: never litter /dev on a workstation.
        if TERMINATION_LOG.is_file():
            TERMINATION_LOG.write_text(f"model-cache: {message} (exit {int(code)})\n")
    except OSError:
        pass  # best effort: the JSON event above is the record
    return int(code)


def _verify(args: argparse.Namespace) -> int:
    result = verify_directory(args.dir, args.verify)
    if not result.ok:
        raise IntegrityError(f"integrity: {args.dir}: {'; '.join(result.problems[:5])}")
    log("verified", dir=str(args.dir), verify=args.verify, files=len(result.good))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "verify":
            return _verify(args)
        options = _options(args)
        served = preload(options)
    except PreloadError as error:
        return _fail(error.exit_code, error.message)
    except OSError as error:
        if is_out_of_space(error):
            target = error.filename or "the destination"
            return _fail(ExitCode.DISK_FULL, f"disk full: {error.strerror} writing {target}")
        return _fail(ExitCode.INTERNAL, f"I/O error: {error}")
    except KeyboardInterrupt:
        return _fail(ExitCode.INTERNAL, "interrupted")
    except Exception as error:
        log("traceback", level="error", error=repr(error), traceback=traceback.format_exc())
        return _fail(ExitCode.INTERNAL, f"internal error: {error!r}")
    print(served, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
