"""`vllm-platform`: validate, render and plan stacks offline; smoke-test a deployed endpoint."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from infra.config import ConfigError

EXIT_INVALID_CONFIG = 2
EXIT_FAILED = 1


def _stack_file(args: argparse.Namespace) -> Path | None:
    return Path(args.file) if args.file else None


def _add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stack", help="stack name: dev, staging, prod (reads stacks/Pulumi.<stack>.yaml)")
    parser.add_argument(
        "--file", metavar="PATH", help="read this stack file instead of stacks/Pulumi.<stack>.yaml"
    )


def command_validate(args: argparse.Namespace) -> int:
    from infra.stack_checks import load_stack

    config = load_stack(args.stack, stack_file=_stack_file(args))
    print(
        f"stack {args.stack}: config valid ({len(config.models)} models, "
        f"{len(config.node_groups.gpu)} GPU groups, cluster mode {config.cluster.mode})"
    )
    return 0


def command_render(args: argparse.Namespace) -> int:
    from infra.render import render_stack, summarize, write_render

    result = render_stack(args.stack, stack_file=_stack_file(args))
    out_dir = Path(args.out) if args.out else Path("out") / args.stack
    write_render(result, out_dir)
    print(summarize(result))
    print(f"  written to {out_dir}/")
    return 0


def command_plan(args: argparse.Namespace) -> int:
    from infra.capacity import plan_platform
    from infra.capacity.report import format_plan_table, plan_as_json
    from infra.stack_checks import load_stack

    config = load_stack(args.stack, stack_file=_stack_file(args))
    plan = plan_platform(config)
    if args.json:
        print(json.dumps(plan_as_json(plan), indent=2))
    else:
        print(format_plan_table(plan))
    return 0


def command_smoke(args: argparse.Namespace) -> int:
    from infra.smoke import SmokeError, format_smoke_result, run_smoke

    api_key = args.api_key or os.environ.get("VLLM_API_KEY")
    try:
        result = run_smoke(
            args.url, args.model, api_key, max_tokens=args.max_tokens, timeout_seconds=args.timeout_seconds
        )
    except SmokeError as error:
        print(f"smoke test failed: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(format_smoke_result(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-platform", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    validate = commands.add_parser(
        "validate", help="check a stack's config (exit 2 with the problems if invalid)"
    )
    _add_stack_arguments(validate)
    validate.set_defaults(handler=command_validate)

    render = commands.add_parser(
        "render", help="run the Pulumi program under mocks and write what it would deploy"
    )
    _add_stack_arguments(render)
    render.add_argument("--out", metavar="DIR", help="output directory (default: out/<stack>)")
    render.set_defaults(handler=command_render)

    plan = commands.add_parser("plan", help="capacity plan per model and GPU group")
    _add_stack_arguments(plan)
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.set_defaults(handler=command_plan)

    smoke = commands.add_parser("smoke", help="stream one chat completion from a deployed endpoint")
    smoke.add_argument("--url", required=True, help="base URL, e.g. https://llama-3-1-8b.llm.example.com")
    smoke.add_argument("--model", required=True, help="served model name clients send")
    smoke.add_argument("--api-key", help="API key (default: $VLLM_API_KEY)")
    smoke.add_argument("--max-tokens", type=int, default=64)
    smoke.add_argument("--timeout-seconds", type=float, default=60.0)
    smoke.set_defaults(handler=command_smoke)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ConfigError as error:
        print(str(error), file=sys.stderr)
        return EXIT_INVALID_CONFIG
    except BrokenPipeError:
        # `vllm-platform plan prod | head`: the reader left; that is not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
