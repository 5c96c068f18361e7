"""Every `vllm serve` flag that decides where and how the API listens is checked against what the
probes, the router and the load balancer need (issue 40): plain HTTP on 0.0.0.0:vllm.port from one
pod. Rules: components/vllm_arguments.py LISTENER_RULES."""

from __future__ import annotations

import re

import pytest

from components.vllm_arguments import (
    LISTENER_FLAGS_THAT_KEEP_THE_PORT,
    LISTENER_RULES,
    RESERVED_FLAGS,
    build_server_arguments,
    disables_statistics,
    listener_problems,
    serves_render_endpoints,
)
from domain.config.loader import load_stack_config
from domain.vllm_flags import load_server_flags

# Flag names of the pinned snapshot that may concern the listener: host, port, socket, TLS, API
# processes, protocol, path prefix, HTTP parsing, CORS, docs, access logs, multi-node and
# data-parallel placement. A vLLM bump that adds one makes test_every_listener_flag_is_classified fail
# until it is sorted into LISTENER_RULES or LISTENER_FLAGS_THAT_KEEP_THE_PORT.
LISTENER_LIKE = re.compile(
    r"host|port|ssl|uds|headless|api-server|api-key|grpc|root-path|nnodes|node-rank|master-|"
    r"data-parallel|middleware|uvicorn|h11|allowed-(?:origins|methods|headers)|allow-credentials|fastapi|offline-docs|"
    r"access-log|request-id|sse-|server-load"
)


def _listener_like_dests() -> set[str]:
    options = load_server_flags().options
    return {
        option.dest
        for name, option in options.items()
        if name.startswith("--") and LISTENER_LIKE.search(name)
    }


def test_every_listener_flag_of_the_pinned_vllm_is_classified() -> None:
    classified = {rule.dest for rule in LISTENER_RULES} | set(LISTENER_FLAGS_THAT_KEEP_THE_PORT)
    reserved = {
        load_server_flags().options[spelling].dest
        for flag in RESERVED_FLAGS
        for spelling in flag.spellings
        if spelling in load_server_flags().options
    }
    unclassified = _listener_like_dests() - classified - reserved
    assert unclassified == set(), (
        f"sort these into LISTENER_RULES or LISTENER_FLAGS_THAT_KEEP_THE_PORT: {unclassified}"
    )


def test_the_listener_lists_name_only_flags_the_pinned_vllm_has() -> None:
    dests = {option.dest for option in load_server_flags().options.values()}
    named = {rule.dest for rule in LISTENER_RULES} | set(LISTENER_FLAGS_THAT_KEEP_THE_PORT)
    assert named - dests == set()


@pytest.mark.parametrize(
    ("arguments", "flag", "effect"),
    [
        (["--headless"], "--headless", "without any API server"),
        (["--api-server-count", "0"], "--api-server-count", "starts no API-server process"),
        (["-asc=0"], "-asc", "starts no API-server process"),
        (["--api_server_count", "0"], "--api-server-count", "starts no API-server process"),
        (["--uds", "/tmp/vllm.sock"], "--uds", "on a Unix socket"),
        (["--grpc"], "--grpc", "gRPC API instead of the OpenAI HTTP API"),
        (["--ssl-keyfile", "/k.pem"], "--ssl-keyfile", "speak TLS"),
        (["--ssl-cert-reqs", "2"], "--ssl-cert-reqs", "ask for client certificates"),
        (["--nnodes", "2"], "--nnodes", "several pods"),
        (["--node-rank", "1"], "--node-rank", "headless worker"),
        (["--data-parallel-rank", "0"], "--data-parallel-rank", "data-parallel rank"),
    ],
)
def test_a_flag_that_takes_the_api_off_the_port_is_refused_naming_who_needs_it(
    arguments: list[str], flag: str, effect: str
) -> None:
    [(found, message)] = listener_problems(arguments)
    assert found == flag
    assert effect in message
    assert "probes" in message and "the router" in message and "load balancer" in message


@pytest.mark.parametrize(
    "arguments",
    [
        ["--api-server-count", "4"],
        ["--nnodes", "1"],
        ["--node-rank", "0"],
        ["--root-path", "/llm"],
        ["--disable-fastapi-docs", "--enable-request-id-headers"],
        ["--uvicorn-log-level", "warning"],
    ],
)
def test_flags_that_keep_the_api_on_the_port_pass(arguments: list[str]) -> None:
    assert listener_problems(arguments) == []


def test_the_platforms_own_arguments_keep_the_api_on_the_port() -> None:
    for stack in ("dev", "staging", "prod"):
        config = load_stack_config(stack)
        for model in config.models:
            arguments = build_server_arguments(
                model,
                "/mnt/models/x",
                render_endpoints=serves_render_endpoints(config, model),
                adapter_root="/mnt/models",
                tenants=bool(config.tenants),
            )
            assert listener_problems(arguments) == [], (stack, model.name)
            assert disables_statistics(arguments) is None


def test_statistics_off_is_found_in_any_spelling() -> None:
    assert disables_statistics(["--disable-log-stats"]) == "--disable-log-stats"
    assert disables_statistics(["--disable_log_stats"]) == "--disable-log-stats"
    assert disables_statistics(["--max-num-seqs", "8"]) is None
