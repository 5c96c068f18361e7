"""`vllm-platform`: validate, render and plan stacks offline; pull the pinned charts; smoke-test a deployed
endpoint."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from components.helm.cache import ChartCacheError
from domain.config import ConfigError
from infra.loadtest import DEFAULT_SHARED_PREFIX_WORDS

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
    from domain.config.loader import display_path, stack_file_for
    from infra.stack_checks import config_warnings, load_stack

    path = _stack_file(args) or stack_file_for(args.stack)
    config = load_stack(args.stack, stack_file=path)
    for warning in config_warnings(config, stack_file=display_path(path)):
        print(warning, file=sys.stderr)
    print(
        f"stack {args.stack}: config valid ({len(config.models)} models, "
        f"{len(config.node_groups.gpu)} GPU groups, cluster mode {config.cluster.mode})"
    )
    return 0


def command_render(args: argparse.Namespace) -> int:
    from infra.render import render_stack, summarize, write_render

    result = render_stack(
        args.stack, stack_file=_stack_file(args), allow_missing_charts=args.allow_missing_charts
    )
    out_dir = Path(args.out) if args.out else Path("out") / args.stack
    write_render(result, out_dir)
    print(summarize(result))
    print(f"  written to {out_dir}/")
    return 0


def command_preflight(args: argparse.Namespace) -> int:
    import yaml

    from components.preflight import (
        DEFAULT_RENDEZVOUS_SECONDS,
        PreflightError,
        preflight_namespace,
        preflight_objects,
    )
    from infra.stack_checks import load_stack

    config = load_stack(args.stack, stack_file=_stack_file(args))
    models = {model.name: model for model in config.models}
    if args.model not in models:
        print(
            f"error: stack {args.stack} has no model '{args.model}' (its models: {', '.join(models)})",
            file=sys.stderr,
        )
        return EXIT_INVALID_CONFIG
    model = models[args.model]
    try:
        objects = preflight_objects(
            config,
            model,
            min_bus_bandwidth_gbps=args.min_bus_bandwidth_gbps,
            rendezvous_seconds=args.rendezvous_seconds or DEFAULT_RENDEZVOUS_SECONDS,
        )
    except PreflightError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    text = yaml.safe_dump_all(objects, sort_keys=False)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    namespace = preflight_namespace(model)
    print(
        f"# then: kubectl apply -f <this>; kubectl -n {namespace} wait --for=condition=Complete "
        f"job/preflight --timeout=60m; kubectl -n {namespace} logs -l batch.kubernetes.io/job-name=preflight "
        f"--prefix --tail=-1; kubectl delete namespace {namespace}",
        file=sys.stderr,
    )
    return 0


def command_charts(args: argparse.Namespace) -> int:
    from infra.charts import command_digest, command_pull, command_verify

    if args.charts_command == "pull":
        return command_pull(args.dest, args.from_git, args.names)
    if args.charts_command == "verify":
        return command_verify(args.dest)
    return command_digest(args.path)


def command_images(args: argparse.Namespace) -> int:
    from infra.images import format_inventory, inventory, unpinned
    from infra.render import render_stack

    images = inventory(render_stack(args.stack, stack_file=_stack_file(args)))
    if args.json:
        print(
            json.dumps([{"image": use.reference, "used_by": sorted(use.users)} for use in images], indent=2)
        )
    elif args.plain:
        print("\n".join(use.reference for use in images))
    else:
        print(format_inventory(images))
    problems = [f"{use.reference}: {reason}" for use in images if (reason := unpinned(use.reference))]
    for problem in problems:
        print(f"unpinned image {problem}", file=sys.stderr)
    return EXIT_FAILED if problems else 0


def command_plan(args: argparse.Namespace) -> int:
    from domain.capacity import plan_platform
    from domain.capacity.report import format_plan_table, plan_as_json
    from domain.config.loader import display_path, stack_file_for
    from infra.stack_checks import config_warnings, load_stack

    path = _stack_file(args) or stack_file_for(args.stack)
    config = load_stack(args.stack, stack_file=path)
    for warning in config_warnings(config, stack_file=display_path(path)):
        print(warning, file=sys.stderr)
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


def _concurrency_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a comma-separated list of positive integers, e.g. 1,4,16"
        )
    return sorted(set(levels))


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number of at least {least}")
    return value


def _positive_int(text: str) -> int:
    return _whole_number(text, 1)


def _non_negative_int(text: str) -> int:
    return _whole_number(text, 0)


def command_loadtest(args: argparse.Namespace) -> int:
    from infra.loadtest import LoadtestError, Slo, Workload, format_report, plot_report, run_loadtest

    if args.workload == "fresh":
        if args.shared_prefix_words is not None or args.shared_prefixes is not None:
            print(
                "loadtest: error: --shared-prefix-words and --shared-prefixes need --workload shared-prefix",
                file=sys.stderr,
            )
            return EXIT_INVALID_CONFIG
        workload = Workload()
    else:
        workload = Workload(
            kind="shared-prefix",
            prefix_words=args.shared_prefix_words or DEFAULT_SHARED_PREFIX_WORDS,
            prefixes=args.shared_prefixes or 1,
        )
    api_key = os.environ.get(args.api_key_env)
    if api_key is None:
        print(f"note: ${args.api_key_env} is not set; sending requests without an API key", file=sys.stderr)
    slo = Slo(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms, percentile=args.slo_percentile)
    out_dir = Path(args.out)
    try:
        report = run_loadtest(
            args.url.rstrip("/"), args.model, api_key, args.concurrency, slo,
            requests_per_user=args.requests_per_user, prompt_words=args.prompt_words,
            output_tokens=args.output_tokens, seed=args.seed, workload=workload,
        )  # fmt: skip
    except LoadtestError as error:
        print(f"load test failed: {error}", file=sys.stderr)
        return EXIT_FAILED
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "loadtest.json").write_text(json.dumps(report.as_json(), indent=2))
    print(format_report(report))
    try:
        plot_report(report, out_dir / "loadtest.png")
    except LoadtestError as error:
        print(f"no plot: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"  written to {out_dir}/loadtest.json and {out_dir}/loadtest.png")
    if all(level.requests == level.errors for level in report.levels):
        print("load test failed: no request succeeded (see the errors above)", file=sys.stderr)
        return EXIT_FAILED
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
    render.add_argument(
        "--allow-missing-charts",
        action="store_true",
        help="succeed without the pinned charts in the chart cache: write our own objects and every "
        "release's values, and list the releases not expanded (`make dev` does this offline)",
    )
    render.set_defaults(handler=command_render)

    charts = commands.add_parser(
        "charts", help="the pinned Helm charts: pull them into the chart cache, verify it, digest a chart"
    )
    charts_commands = charts.add_subparsers(dest="charts_command", required=True)
    pull = charts_commands.add_parser(
        "pull",
        help="download every locked chart with Helm's client, verify its digests, store it in the cache",
    )
    pull.add_argument(
        "--dest", metavar="DIR", help="chart cache (default: $VLLM_PLATFORM_CHART_CACHE or the user cache)"
    )
    pull.add_argument(
        "--from-git",
        metavar="DIR",
        help="build the charts from local git mirrors of their sources (<owner>+<name> or <owner>/<name>) "
        "at the locked tags instead of downloading them",
    )
    pull.add_argument("names", nargs="*", metavar="CHART", help="only these charts (default: all locked)")
    verify = charts_commands.add_parser(
        "verify", help="check every locked chart in the cache against the lock"
    )
    verify.add_argument("--dest", metavar="DIR", help="chart cache (default as for pull)")
    digest = charts_commands.add_parser(
        "digest", help="the lock digest of a chart directory or package and of its subcharts (for bumps)"
    )
    digest.add_argument("path", help="a chart directory or .tgz package")
    charts.set_defaults(handler=command_charts)

    images = commands.add_parser(
        "images", help="every container image the stack pulls (ours and the charts'), for mirroring"
    )
    _add_stack_arguments(images)
    images.add_argument("--json", action="store_true", help="print JSON with the objects using each image")
    images.add_argument(
        "--plain", action="store_true", help="one image reference a line (for a mirror script)"
    )
    images.set_defaults(handler=command_images)

    plan = commands.add_parser("plan", help="capacity plan per model and GPU group")
    _add_stack_arguments(plan)
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.set_defaults(handler=command_plan)

    preflight = commands.add_parser(
        "preflight",
        help="the Job that checks a multi-node model's nodes before it runs there (locked memory, "
        "libfabric's EFA provider, NCCL's network, an all-reduce's bus bandwidth): YAML for kubectl apply",
    )
    _add_stack_arguments(preflight)
    preflight.add_argument("--model", required=True, help="the multi-node model (its `name` in the stack)")
    preflight.add_argument(
        "--min-bus-bandwidth-gbps",
        type=float,
        help="fail below this all-reduce bus bandwidth, Gbit/s (default: half the instance type's EFA "
        "bandwidth from domain/catalogue/efa_interfaces.yaml)",
    )
    preflight.add_argument(
        "--rendezvous-seconds", type=int, help="how long the pods wait for each other (default 1800)"
    )
    preflight.add_argument("--out", metavar="FILE", help="write the YAML here instead of stdout")
    preflight.set_defaults(handler=command_preflight)

    smoke = commands.add_parser("smoke", help="stream one chat completion from a deployed endpoint")
    smoke.add_argument("--url", required=True, help="base URL, e.g. https://llama-3-1-8b.llm.example.com")
    smoke.add_argument("--model", required=True, help="served model name clients send")
    smoke.add_argument("--api-key", help="API key (default: $VLLM_API_KEY)")
    smoke.add_argument("--max-tokens", type=int, default=64)
    smoke.add_argument("--timeout-seconds", type=float, default=60.0)
    smoke.set_defaults(handler=command_smoke)

    loadtest = commands.add_parser(
        "loadtest",
        help="stream chat completions at several concurrency levels (Locust) and find the largest one "
        "that meets a TTFT/TPOT SLO; needs the loadtest extra",
    )
    loadtest.add_argument("--url", required=True, help="base URL, e.g. https://llama-3-1-8b.llm.example.com")
    loadtest.add_argument("--model", required=True, help="served model name clients send")
    loadtest.add_argument(
        "--api-key-env",
        default="VLLM_API_KEY",
        metavar="VAR",
        help="environment variable holding the API key",
    )
    loadtest.add_argument(
        "--concurrency", type=_concurrency_levels, default=[1, 4, 16], help="e.g. 1,4,16,64"
    )
    loadtest.add_argument("--slo-ttft-ms", type=float, required=True, help="time to first token limit")
    loadtest.add_argument("--slo-tpot-ms", type=float, required=True, help="time per output token limit")
    loadtest.add_argument("--slo-percentile", type=float, default=95.0, choices=[50.0, 90.0, 95.0, 99.0])
    loadtest.add_argument(
        "--requests-per-user", type=int, default=4, help="requests each user sends per level"
    )
    loadtest.add_argument(
        "--prompt-words", type=_positive_int, default=256, help="words of fresh random text per prompt"
    )
    loadtest.add_argument(
        "--seed",
        type=_non_negative_int,
        help="seed of the prompts (default: a new one per run, printed and kept in loadtest.json); the "
        "same seed and levels send the same prompts again",
    )
    loadtest.add_argument(
        "--workload",
        choices=["fresh", "shared-prefix"],
        default="fresh",
        help="fresh (default): no request shares a prompt with another, in any level, so the run "
        "measures the engine, not vLLM's prefix cache; shared-prefix: every prompt starts with one of "
        "--shared-prefixes fixed texts of --shared-prefix-words words, the same in every level, then "
        "--prompt-words fresh words, so the run measures serving with prefix-cache reuse (e.g. a "
        "long shared system prompt)",
    )
    loadtest.add_argument(
        "--shared-prefix-words",
        type=_positive_int,
        help=f"words of each shared text (shared-prefix only; default {DEFAULT_SHARED_PREFIX_WORDS})",
    )
    loadtest.add_argument(
        "--shared-prefixes",
        type=_positive_int,
        help="how many different shared texts, used in turn (shared-prefix only; default 1)",
    )
    loadtest.add_argument("--output-tokens", type=int, default=128, help="tokens generated per request")
    loadtest.add_argument(
        "--out", default="loadtest-out", metavar="DIR", help="loadtest.json and loadtest.png"
    )
    loadtest.set_defaults(handler=command_loadtest)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ConfigError as error:
        print(str(error), file=sys.stderr)
        return EXIT_INVALID_CONFIG
    except ChartCacheError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        # `vllm-platform plan prod | head`: the reader left; that is not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
