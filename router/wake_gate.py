"""The wake gate: only a caller with a valid key for a to-zero model reaches the hold that wakes it.

Why (issue 40, docs/security.md finding 16): a model at zero replicas has no vLLM to check a key,
and its router (vllm-router 0.1.17, single-model mode) holds every request it gets while the model
wakes, counting each held attempt as the demand that wakes it. So anyone who reached the endpoint
woke the model: no key, a wrong key, another tenant's key, even a name no model serves (the front
spreads an unknown name over its workers). Nothing upstream checks a key in front of that hold:
vllm-router 0.1.17 has no option that validates an incoming key (`vllm-router --help`; later
releases' `--api-key-validation-urls` caches every answer for the process's life, so a revoked key
stays valid until a restart, and sees no model name); the ALB checks no keys and cannot read the
body's `model`; there is no Envoy on the path for an ext-authz filter (docs/routing.md, "Choice").

So the registrar registers, for each to-zero model, this gate's port as the model's worker with the
front router instead of the model's router. The gate answers a request here at once unless the
key is one the model's pods accept and the body names a served name of the model that the key may
use (401 / 403 / 404, OpenAI's error shape, as the pod's middleware answers awake); only the rest
goes on to the model's router, unchanged, and its answer streams back unbuffered. A refused
request never reaches the model's router, so it is never counted as demand and never held.

Keys: the same keys the model's pods accept (its tenants' keys, or its own, and the operator key),
mounted from the secret store by the Secrets Store CSI driver into this container only, as files
that the driver rewrites on rotation; they are re-read at most once a second, so a rotated or
revoked key takes effect without a restart. A tenant key that does not start with its tenant's
prefix is ignored, as the pod ignores it (the WAF's rate rules match the prefix).

Past the hold the model's router answers 503 `No available workers`; the gate adds
`Retry-After: <the model's predicted wake, s>` (`vllm-platform plan`'s wake table), which
vllm-router 0.1.17 never sets.

Stdlib only (it runs in the router image beside the registrar). Run:

    python wake_gate.py --config /etc/vllm-router/wake-gate.json

The config (rendered by components/router.py `wake_gate_config`) is
`{"keys_dir", "max_body_bytes", "upstream_timeout_seconds", "models": [{"model", "port",
"model_router_url", "served_names", "retry_after_seconds", "callers": [{"name", "files", "models",
"key_prefix"}]}]}`: a caller is one tenant (its key files, the served names of this model it may
call, its prefix), the operator or the model's own key (every served name, no prefix).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.client
import http.server
import json
import logging
import re
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG = logging.getLogger("vllm-router-wake-gate")

RELOAD_SECONDS = 1.0
"""How stale the key set may be: the mounted files are re-read at most this often (on a request)."""
PASSED_WITHOUT_KEY = frozenset({"/health", "/readiness"})
"""GET/HEAD only: the front router's health check of its worker (`--health-check-endpoint`) goes on to
the model's router, which answers it itself; it never reaches a model, so it wakes nothing."""
LIVENESS_PATH = "/liveness"
"""The gate's own liveness (the kubelet's probe); answered here."""
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)
"""Headers of one connection only (RFC 9110 7.6.1), and the two http.client sets itself."""
SET_HERE = frozenset({"server", "date"})
"""Response headers the gate's own `send_response` writes: not copied from the router's answer."""
STREAM_CHUNK_BYTES = 64 * 1024
CANONICAL_PATH = re.compile(r"(/(?!\.\.?(/|$))[A-Za-z0-9._~-]+)+|/")
"""A request path in canonical form (issue 49; the door's rule, components/router_door.py): segments
of unreserved characters, none empty, `.` or `..`; no percent-encoding, `;` or `\\`. Anything else is
answered 400 here and never forwarded: the model's router (vllm-router) normalises what it forwards,
so `/v1/%2e%2e/workers` would reach its worker API as `/workers`."""


def canonical_target(target: str) -> bool:
    """Whether a request target (origin-form; its query is not judged) has a canonical path."""
    path, _, _ = target.partition("?")
    return CANONICAL_PATH.fullmatch(path) is not None


@dataclass(frozen=True)
class Caller:
    """Whoever holds one of `files`: a tenant, the operator, or the model's own key."""

    name: str
    files: tuple[str, ...]
    models: frozenset[str]
    """The served names of this model the caller may use."""
    key_prefix: str | None = None
    """A tenant's keys must start with it (else ignored, as the pod ignores them)."""
    every_route: bool = False
    """The operator key: every route, as on the pod; others only the inference routes."""


@dataclass(frozen=True)
class GatedModel:
    model: str
    port: int
    model_router_url: str
    served_names: tuple[str, ...]
    """vLLM's default (the name an empty or absent `model` resolves to) first."""
    callers: tuple[Caller, ...]
    retry_after_seconds: int
    """`Retry-After` on the model router's 503 past the hold: the model's predicted wake."""


@dataclass(frozen=True)
class GateConfig:
    keys_dir: Path
    models: tuple[GatedModel, ...]
    max_body_bytes: int
    upstream_timeout_seconds: float
    inference_routes: frozenset[str] = frozenset()
    """The routes a tenant or model key may POST to (the pod middleware's INFERENCE_ROUTES); any
    other route needs the operator key there, so it is refused here too rather than held."""


def gate_config(raw: Mapping[str, Any]) -> GateConfig:
    return GateConfig(
        keys_dir=Path(raw["keys_dir"]),
        max_body_bytes=int(raw["max_body_bytes"]),
        upstream_timeout_seconds=float(raw["upstream_timeout_seconds"]),
        inference_routes=frozenset(raw["inference_routes"]),
        models=tuple(
            GatedModel(
                model=m["model"],
                port=int(m["port"]),
                model_router_url=m["model_router_url"],
                served_names=tuple(m["served_names"]),
                retry_after_seconds=int(m["retry_after_seconds"]),
                callers=tuple(
                    Caller(
                        c["name"],
                        tuple(c["files"]),
                        frozenset(c["models"]),
                        c.get("key_prefix"),
                        bool(c.get("every_route", False)),
                    )
                    for c in m["callers"]
                ),
            )
            for m in raw["models"]
        ),
    )


def _digest(value: bytes) -> bytes:
    # Digests are compared, so a comparison takes the same time whatever the presented key's length.
    return hashlib.sha256(value).digest()


def read_key_digests(keys_dir: Path, callers: Sequence[Caller]) -> tuple[tuple[bytes, Caller], ...]:
    """(SHA-256 of a key, its caller) for every key file of `callers` that holds a usable key."""
    digests = []
    for caller in callers:
        for name in caller.files:
            try:
                key = (keys_dir / name).read_bytes().strip()
            except OSError:  # not mounted yet, or the driver swapping the folder: the next reading sees it
                continue
            if not key:
                continue  # an emptied entry in the store: revoked
            if caller.key_prefix is not None and not key.startswith(caller.key_prefix.encode()):
                LOG.error(
                    "key file %s of %s lacks the key prefix %s: ignored", name, caller.name, caller.key_prefix
                )
                continue
            digests.append((_digest(key), caller))
    return tuple(digests)


@dataclass
class KeyRing:
    """The callers' key digests, re-read from the mounted files when older than RELOAD_SECONDS."""

    keys_dir: Path
    callers: tuple[Caller, ...]
    clock: Callable[[], float] = time.monotonic
    _digests: tuple[tuple[bytes, Caller], ...] = ()
    _read_at: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def caller_for(self, presented: bytes | None) -> Caller | None:
        if presented is None:
            return None
        with self._lock:
            if self.clock() - self._read_at >= RELOAD_SECONDS:
                self._digests = read_key_digests(self.keys_dir, self.callers)
                self._read_at = self.clock()
            digests = self._digests
        presented_digest, found = _digest(presented), None
        for digest, caller in digests:  # no early exit: the same work whichever key matches
            if hmac.compare_digest(presented_digest, digest):
                found = caller
        return found


def presented_key(authorization: str | None) -> bytes | None:
    """The bearer credential of an Authorization header (any case of `Bearer`), or None."""
    if not authorization:
        return None
    scheme, _, credential = authorization.strip().partition(" ")
    credential = credential.strip()
    return credential.encode("latin-1", "replace") if scheme.lower() == "bearer" and credential else None


def openai_error(message: str, code: str, error_type: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    code: str


def _is_json(content_type: str | None, body: bytes) -> bool:
    media = (content_type or "").split(";")[0].strip().lower()
    if media:
        return media == "application/json" or media.endswith("+json")
    return body.lstrip()[:1] in (b"{", b"[")


MODELS_PATH = "/v1/models"


def refusal(
    model: GatedModel,
    caller: Caller | None,
    method: str,
    path: str,
    content_type: str | None,
    body: bytes,
    inference_routes: frozenset[str],
) -> Refusal | None:
    """Why this request may not reach the model's hold, or None; as the model's pods would answer it
    awake (components/pod_files/vllm_platform_auth.py). The key first (a stranger's body is never
    parsed); then the route: a tenant or model key may only POST to an inference route; then the
    served name the JSON body names, resolved as vLLM resolves it: its `model`, empty or absent
    meaning the default (the first served name)."""
    if caller is None:
        return Refusal(401, "Incorrect API key provided.", "invalid_api_key")
    if caller.every_route:
        return None
    if method != "POST" or path not in inference_routes:
        return Refusal(403, "This route needs the operator key.", "operator_route")
    if not _is_json(content_type, body):
        # A multipart upload (audio) names its model in a form field not read here: as the pod does,
        # only a caller that may use every served name passes.
        if caller.models >= set(model.served_names):
            return None
        return Refusal(403, "This key may not use every model served here.", "model_not_allowed")
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return Refusal(400, "The request body is not valid JSON.", "invalid_json")
    if not isinstance(payload, dict):
        return Refusal(400, "The request body must be a JSON object.", "invalid_request")
    name = payload.get("model")
    if name is not None and not isinstance(name, str):
        return Refusal(400, "`model` must be a string.", "invalid_request")
    name = name or model.served_names[0]
    if name not in model.served_names:
        return Refusal(404, f"The model `{name}` does not exist.", "model_not_found")
    if name not in caller.models:
        return Refusal(403, f"This key may not use the model `{name}`.", "model_not_allowed")
    return None


def model_list(model: GatedModel, caller: Caller) -> dict[str, Any]:
    """`GET /v1/models` for this caller, answered here in vLLM's shape (adapters with `parent`): the
    served names it may call, without asking, so without waking, the model."""
    default = model.served_names[0]
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "vllm",
                "parent": None if name == default else default,
            }
            for name in model.served_names
            if name in caller.models
        ],
    }


class GateHandler(http.server.BaseHTTPRequestHandler):
    server: GateServer
    protocol_version = "HTTP/1.1"  # keep-alive with the front router's connection pool
    server_version = "vllm-platform-wake-gate"
    sys_version = ""
    timeout = 120  # an idle or stalled client connection does not hold a thread

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without this, Nagle's algorithm holds the body
        # until the client acknowledges the headers, which it delays (measured: 44 ms an answer, 0.2 with).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        try:
            self.handle_request()
        except Exception:  # one bad request must not leave the front's connection unanswered
            LOG.exception("%s %s for %s failed", self.command, self.path, self.server.gated.model)
            self.close_connection = True
            if not self.answered:
                self.reply(500, openai_error("The wake gate failed.", "internal_error", "server_error"))

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    answered = False

    def send_response(self, code: int, message: str | None = None) -> None:
        self.answered = True
        super().send_response(code, message)

    def handle_request(self) -> None:
        self.answered = False
        # The target as the request line wrote it: http.server's `path` already folds a leading `//`.
        words = self.requestline.split(" ")
        if len(words) != 3 or not canonical_target(words[1]):
            self.close_connection = True  # its body is not read
            self.reply(400, openai_error("The request path is not in canonical form.", "invalid_path"))
            return
        gated, path = self.server.gated, urllib.parse.urlsplit(self.path).path
        if path == LIVENESS_PATH and self.command in ("GET", "HEAD"):
            self.reply(200, {"status": "ok"})
            return
        try:
            body = self.read_body()
        except ConnectionError:
            self.close_connection = True
            self.answered = True  # nobody left to answer
            return
        if body is None:
            return
        if path in PASSED_WITHOUT_KEY and self.command in ("GET", "HEAD"):
            self.forward(body)
            return
        caller = self.server.keys.caller_for(presented_key(self.headers.get("Authorization")))
        if caller is not None and path == MODELS_PATH and self.command == "GET":
            self.reply(200, model_list(gated, caller))
            return
        refused = refusal(
            gated,
            caller,
            self.command,
            path,
            self.headers.get("Content-Type"),
            body,
            self.server.config.inference_routes,
        )
        if refused is not None:
            LOG.debug("%s %s for %s: %d %s", self.command, path, gated.model, refused.status, refused.code)
            self.reply(refused.status, openai_error(refused.message, refused.code))
            return
        self.forward(body)

    def read_body(self) -> bytes | None:
        """The request body (Content-Length or chunked), or None once 413 has been answered. A body
        past the limit is read to its end and dropped, so the answer is a clean 413 and never a reset
        connection, which the front router would count against the model's circuit."""
        limit, kept, total = self.server.config.max_body_bytes, [], 0
        for chunk in self.body_chunks():
            total += len(chunk)
            if total <= limit:
                kept.append(chunk)
        if total > limit:
            limit_mib = limit // (1024 * 1024)
            self.reply(
                413, openai_error(f"The request body is larger than {limit_mib} MiB.", "request_too_large")
            )
            return None
        return b"".join(kept)

    def body_chunks(self) -> Iterator[bytes]:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            while size := int(self.rfile.readline(64).split(b";")[0].strip() or b"0", 16):
                yield from self.read_exactly(size)
                self.rfile.readline(8)
            while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return
        yield from self.read_exactly(int(self.headers.get("Content-Length") or 0))

    def read_exactly(self, size: int) -> Iterator[bytes]:
        while size > 0:
            chunk = self.rfile.read(min(size, STREAM_CHUNK_BYTES))
            if not chunk:
                raise ConnectionError("the client closed the connection inside the body")
            size -= len(chunk)
            yield chunk

    def forward(self, body: bytes) -> None:
        """The request to the model's router, its answer streamed back as it comes."""
        upstream = urllib.parse.urlsplit(self.server.gated.model_router_url)
        connection = http.client.HTTPConnection(
            upstream.hostname or "127.0.0.1",
            upstream.port,
            timeout=self.server.config.upstream_timeout_seconds,
        )
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            connection.connect()
            connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as in setup()
            connection.request(self.command, self.path, body=body if body else None, headers=headers)
            response = connection.getresponse()
        except OSError as error:
            connection.close()
            LOG.warning("%s: the model's router did not answer: %s", self.server.gated.model, error)
            self.reply(502, openai_error("The model's router did not answer.", "bad_gateway", "server_error"))
            return
        try:
            self.relay(response)
        except OSError as error:  # the client went away mid-stream; the upstream request ends with it
            LOG.debug("%s: stream cut: %s", self.server.gated.model, error)
            self.close_connection = True
        finally:
            connection.close()

    def relay(self, response: http.client.HTTPResponse) -> None:
        self.send_response(response.status, response.reason)
        headers = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP | SET_HERE]
        for name, value in headers:
            self.send_header(name, value)
        if response.status == 503 and not any(k.lower() == "retry-after" for k, _ in headers):
            # Past the hold (vllm-router sets none): retry once the predicted wake has passed.
            self.send_header("Retry-After", str(self.server.gated.retry_after_seconds))
        length = response.getheader("Content-Length")
        if self.command == "HEAD" or response.status in (204, 304):
            self.send_header("Content-Length", length or "0")
            self.end_headers()
            return
        if length is not None:
            self.send_header("Content-Length", length)
            self.end_headers()
            while chunk := response.read(STREAM_CHUNK_BYTES):
                self.wfile.write(chunk)
            return
        # Streamed (SSE): each piece goes on as soon as it arrives.
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while chunk := response.read1(STREAM_CHUNK_BYTES):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def reply(self, status: int, body: Mapping[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("%s " + format, self.address_string(), *args)


class GateServer(http.server.ThreadingHTTPServer):
    """One to-zero model's gate, on its own port (the worker URL the front routes the model to)."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], gated: GatedModel, config: GateConfig, keys: KeyRing
    ) -> None:
        super().__init__(address, GateHandler)
        self.gated = gated
        self.config = config
        self.keys = keys


def start_gates(config: GateConfig, host: str = "127.0.0.1") -> list[GateServer]:
    """One server per gated model, each serving in a daemon thread; returned so they can be stopped."""
    servers = []
    for gated in config.models:
        server = GateServer((host, gated.port), gated, config, KeyRing(config.keys_dir, gated.callers))
        threading.Thread(target=server.serve_forever, name=f"gate-{gated.model}", daemon=True).start()
        servers.append(server)
    return servers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = gate_config(json.loads(args.config.read_text()))
    servers = start_gates(config)  # on 127.0.0.1: only the front, in the same pod, reaches a gate
    LOG.info("gates for %s", ", ".join(f"{s.gated.model} on :{s.gated.port}" for s in servers))
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
