"""Issue 49: the real vLLM 0.32.0 server answers 400 to every request target that is not a canonical
path (tests/path_tricks.py), before any key check, and reaches nothing with one.

The session's server (tests/e2e/conftest.py: the dev stack's rendered arguments and middleware) is
asked with raw request lines over a socket: httpx and http.client normalise dot segments or refuse
some of these targets before they leave the client. Each request is sent with the model's key and
with the operator key as well as without one, so a refusal cannot be the key check's.
"""

from __future__ import annotations

import json
import socket

import pytest

from tests import path_tricks
from tests.e2e.conftest import API_KEY, OPERATOR_KEY
from tests.support.vllm_server import RunningVllmServer

pytestmark = pytest.mark.e2e

SOCKET_TIMEOUT_SECONDS = 30
FOLDED_BY_THE_HTTP_PARSER = {"/v1/chat/completions#/../../workers": "/v1/chat/completions"}
"""Targets the server's HTTP parser (uvicorn over httptools, the vllm/vllm-openai image's) turns into
another path before any application code sees the request: it drops a fragment, so this one reaches
the middleware as its canonical path and is judged as that path (401 without a key). Nothing behind
the parser ever reads the dropped part."""


def raw_request(port: int, method: str, target: str, key: str | None) -> tuple[int, bytes, bytes]:
    """(status, content type, body) of one request line sent as is, on its own connection."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close", "Content-Length: 0"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in header_lines if b": " in line)
    return int(status_line.split()[1]), headers.get(b"content-type", b""), body


def test_every_non_canonical_target_gets_400_whatever_the_key(vllm_server: RunningVllmServer) -> None:
    answered: dict[tuple[str, str, str], int] = {}
    refused_by_the_parser: set[str] = set()
    for target in path_tricks.NON_CANONICAL:
        if target in FOLDED_BY_THE_HTTP_PARSER:
            continue
        for method, key, who in (
            ("GET", None, "no key"),
            ("POST", API_KEY, "model key"),
            ("PUT", OPERATOR_KEY, "operator"),
        ):
            status, content_type, body = raw_request(vllm_server.port, method, target, key)
            if status != 400:
                answered[(method, target, who)] = status
            elif content_type.startswith(b"application/json"):
                assert json.loads(body)["error"]["code"] == "invalid_path", (target, body)
            else:
                refused_by_the_parser.add(target)  # uvicorn's own 400: it never parsed a request
    assert answered == {}
    # The middleware answers all but the request lines the HTTP parser itself cannot read.
    assert refused_by_the_parser <= {"*", "v1/completions", "/v1/completions\t"}, refused_by_the_parser


def test_canonical_targets_and_a_query_are_judged_by_the_key_as_before(
    vllm_server: RunningVllmServer,
) -> None:
    port = vllm_server.port
    for target in (*path_tricks.CANONICAL_UNKNOWN, *path_tricks.WITH_QUERY, *FOLDED_BY_THE_HTTP_PARSER):
        assert raw_request(port, "POST", target, None)[0] == 401, target
    # The open routes, with a query too, answer without a key; other spellings of them do not.
    assert raw_request(port, "GET", "/health", None)[0] == 200
    assert raw_request(port, "GET", "/metrics?x=1", None)[0] == 200
    for spelling in ("/health/", "//health", "/./health", "/%68ealth", "/metrics/", "/metrics/."):
        assert raw_request(port, "GET", spelling, None)[0] == 400, spelling
