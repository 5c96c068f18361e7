"""API-key check for every route of the vLLM server except `/health` and `/metrics` (issues 15, 26).

This file runs inside the upstream, unmodified `vllm/vllm-openai` image: the Deployment mounts it
from a ConfigMap (it holds code, never a key), puts its folder on PYTHONPATH and passes
`--middleware vllm_platform_auth.ApiKeyMiddleware`, which vLLM adds around its whole ASGI app.
vLLM's own check guards only the `/v1`, `/v2`, `/inference` and `/cohere` prefixes, so
`/invocations`, `/tokenize` and the admin routes answered anyone; this one denies by default, so a
route a future vLLM adds is guarded too.

Two modes, chosen by the environment the Deployment renders:

- One key per model (no `tenants` in the stack): the key is `VLLM_API_KEY`, which the pod reads
  from the Secret the Secrets Store CSI driver syncs from the secret store. It reaches every name
  this process serves (the base model and its adapters).
- Tenants (`VLLM_PLATFORM_TENANTS` names a JSON file of the ConfigMap: this pod's served names and,
  per tenant allowed on one of them, the names it may call and its key prefix;
  `VLLM_PLATFORM_TENANT_MOUNT` names the folder where the CSI driver mounts those tenants' keys as
  `<tenant>.key<n>`). Both are volumes the kubelet and the driver update in place, so the check
  re-reads them (at most once a second): a rotated or revoked key takes effect within the driver's
  rotation interval, without a restart. An unknown key gets 401; a known tenant naming a served
  name it may not call gets 403 (the name is the JSON body's `model`; the body is re-fed to vLLM
  unchanged); a name this pod does not serve goes on to vLLM, which answers its own 404;
  `GET /v1/models` lists only the tenant's names. Per-tenant request and token counts are
  Prometheus series (the tenant's name as label, never the key) in vLLM's own `/metrics`.

An empty or missing key (or, with tenants, no key at all) stops the server at start-up: vLLM imports
this module while it builds its app, before it listens, and the import raises, so the process exits
and a pod without a key never serves (it restarts until the store holds a key).

Pure ASGI and the standard library (plus prometheus_client, which vLLM itself uses, for the tenant
series): nothing here depends on vLLM's or Starlette's internals, and streamed (SSE) responses pass
through untouched: response chunks are only read (for the `usage` of the last one), never held back.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_KEY_ENV = "VLLM_API_KEY"
TENANTS_ENV = "VLLM_PLATFORM_TENANTS"
"""Path of the tenants file (JSON): {"served_names": [...], "tenants": {name: {"models", "key_prefix"}}}."""
TENANT_KEYS_ENV = "VLLM_PLATFORM_TENANT_MOUNT"
"""Folder of the tenants' key files, `<tenant>.key<n>` (one key each; other files are ignored)."""
KEY_FILE = re.compile(r"^(?P<tenant>[a-z][-a-z0-9]*)\.key[0-9]+$")
RELOAD_SECONDS = 1.0
"""How stale the key set may be: the files are re-read at most this often (on a request)."""
OPEN_PATHS = frozenset({"/health", "/metrics", "/metrics/"})
"""Kubelet probes (`/health`) and Prometheus (`/metrics`) call without a key; nothing else may."""
MODELS_PATH = "/v1/models"
POLICY_VIOLATION = 1008
"""WebSocket close code for a refused handshake (uvicorn answers it with HTTP 403)."""
USAGE_BODY_LIMIT = 8 * 1024 * 1024
"""A non-streamed JSON answer is copied (while it is sent) up to this size to read its `usage`."""

LOG = logging.getLogger("vllm_platform_auth")


class MissingApiKeyError(RuntimeError):
    """The server was started without a key: refusing to serve rather than serve unauthenticated."""


def _digest(value: bytes) -> bytes:
    # Compare digests, so the comparison takes the same time whatever the presented key's length.
    return hashlib.sha256(value).digest()


def configured_key_digest(environ: MutableMapping[str, str] | None = None) -> bytes:
    key = (os.environ if environ is None else environ).get(API_KEY_ENV, "")
    if not key.strip():
        raise MissingApiKeyError(
            f"{API_KEY_ENV} is empty or unset: vllm-platform refuses to start a server without an API key "
            "(check the model's api_key_secret in the secret store and the synced Secret vllm-api-key)"
        )
    return _digest(key.encode())


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The bearer credential of the request's Authorization header, or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, bearer = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and bearer.strip():
                return bearer.strip()
            return None
    return None


def request_path(scope: Scope) -> str:
    root_path = scope.get("root_path", "")
    path = scope.get("path", "")
    return path[len(root_path) :] if root_path and path.startswith(root_path) else path


def is_open(scope: Scope) -> bool:
    return (
        request_path(scope) in OPEN_PATHS
        and scope["type"] == "http"
        and scope.get("method") in ("GET", "HEAD")
    )


# --- tenants --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantSet:
    """One reading of the tenants file and the key folder."""

    served_names: tuple[str, ...]
    allowed: dict[str, frozenset[str]]
    """Tenant -> the served names of this pod it may call."""
    key_digests: tuple[tuple[bytes, str], ...]
    """(SHA-256 of a key, its tenant), for every key currently in the folder."""

    def tenant_for(self, presented: bytes | None) -> str | None:
        if presented is None:
            return None
        digest = _digest(presented)
        found = None
        for key_digest, tenant in self.key_digests:  # no early exit: the same work for every key
            if hmac.compare_digest(digest, key_digest):
                found = tenant
        return found


def read_tenant_set(tenants_file: Path, keys_dir: Path) -> TenantSet:
    spec = json.loads(tenants_file.read_text())
    served = tuple(spec["served_names"])
    tenants = spec["tenants"]
    allowed = {name: frozenset(t["models"]) & frozenset(served) for name, t in tenants.items()}
    digests = []
    for path in sorted(keys_dir.iterdir()) if keys_dir.is_dir() else []:
        match = KEY_FILE.match(path.name)
        if not match or match["tenant"] not in tenants:
            continue
        try:
            key = path.read_bytes().strip()
        except OSError:  # the driver swapping the folder: the next reading sees it
            continue
        if not key:
            continue  # an emptied entry in the store: revoked
        prefix = tenants[match["tenant"]]["key_prefix"].encode()
        if not key.startswith(prefix):
            # The WAF's rate rule matches the prefix: a key without it would escape the tenant's limit.
            LOG.error(
                "key file %s of tenant %s does not start with the tenant's key prefix %s: ignored",
                path.name,
                match["tenant"],
                prefix.decode(),
            )
            continue
        digests.append((_digest(key), match["tenant"]))
    return TenantSet(served, allowed, tuple(digests))


@dataclass
class TenantKeys:
    """The tenant set, re-read from the mounted files when it is older than RELOAD_SECONDS."""

    tenants_file: Path
    keys_dir: Path
    clock: Callable[[], float] = time.monotonic
    _current: TenantSet | None = None
    _read_at: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def current(self) -> TenantSet:
        now = self.clock()
        if self._current is None or now - self._read_at >= RELOAD_SECONDS:
            with self._lock:
                try:
                    self._current = read_tenant_set(self.tenants_file, self.keys_dir)
                except (OSError, ValueError, KeyError, TypeError) as error:
                    if self._current is None:
                        raise
                    # A half-written ConfigMap update: keep the last good reading, try again soon.
                    LOG.warning("tenants file unreadable (%s); keeping the previous reading", error)
                self._read_at = now
        return self._current


def tenant_keys_from_environment(environ: MutableMapping[str, str] | None = None) -> TenantKeys | None:
    env = os.environ if environ is None else environ
    if not env.get(TENANTS_ENV):
        return None
    keys = TenantKeys(Path(env[TENANTS_ENV]), Path(env.get(TENANT_KEYS_ENV, "")))
    current = keys.current()
    # No tenant may call this model (validate warns): it serves 401s. Tenants but none of their
    # keys readable: the store is not delivering, so the server does not start.
    if current.allowed and not current.key_digests:
        raise MissingApiKeyError(
            f"no tenant key in {env.get(TENANT_KEYS_ENV)}: vllm-platform refuses to start a server without "
            "an API key (check the tenants' api_key_secrets in the secret store and their key_prefix)"
        )
    return keys


class TenantMetrics:
    """Per-tenant usage in vLLM's own /metrics. With `--api-server-count` > 1 vLLM runs
    prometheus_client in multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set before the API server
    processes start, and /metrics served through a MultiProcessCollector: vLLM 0.32.0's
    vllm/v1/metrics/prometheus.py): these counters then write there too and that collector sums them."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self.requests = Counter(
            "vllm_platform_tenant_requests",
            "POST requests of a tenant that reached vLLM, by served "
            "name and HTTP status ('other': a name this pod does not serve).",
            ["tenant", "model", "code"],
        )
        self.tokens = Counter(
            "vllm_platform_tenant_tokens",
            "Tokens of a tenant's requests as vLLM's `usage` reports them (kind: prompt or completion).",
            ["tenant", "model", "kind"],
        )
        self.in_flight = Gauge(
            "vllm_platform_tenant_requests_in_flight",
            "A tenant's requests being answered now.",
            ["tenant"],
            multiprocess_mode="livesum",
        )


_METRICS: TenantMetrics | None = None


def tenant_metrics() -> TenantMetrics:
    global _METRICS
    if _METRICS is None:  # once per process: prometheus_client refuses a second registration
        _METRICS = TenantMetrics()
    return _METRICS


def openai_error(message: str, code: str) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    ).encode()


async def _respond(send: Send, status: int, body: bytes, *, challenge: bool = False) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if challenge:
        headers.append((b"www-authenticate", b'Bearer realm="vllm"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> tuple[list[Message], bytes]:
    """Every message up to the end of the request body, and the body."""
    messages, chunks = [], []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return messages, b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


def _json_or_none(text: bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _usage_of(payload: Any) -> tuple[int, int] | None:
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else 0, completion if isinstance(completion, int) else 0)


class UsageReader:
    """Reads the `usage` of an answer from the chunks as they go by (the last one seen wins: with
    vLLM's --enable-force-include-usage a stream's final chunk carries it)."""

    def __init__(self, content_type: bytes) -> None:
        self.streamed = content_type.startswith(b"text/event-stream")
        self.json = content_type.startswith(b"application/json")
        self.buffer = bytearray()
        self.usage: tuple[int, int] | None = None

    def feed(self, chunk: bytes) -> None:
        if self.streamed:
            self.buffer += chunk
            *lines, rest = bytes(self.buffer).split(b"\n")
            self.buffer = bytearray(rest)
            for line in lines:
                if line.startswith(b"data:") and b'"usage"' in line:
                    self.usage = _usage_of(_json_or_none(line[5:])) or self.usage
        elif self.json and len(self.buffer) + len(chunk) <= USAGE_BODY_LIMIT:
            self.buffer += chunk

    def finish(self) -> tuple[int, int] | None:
        if self.json and self.buffer:
            self.usage = _usage_of(_json_or_none(bytes(self.buffer)))
        return self.usage


class ApiKeyMiddleware:
    """Outermost ASGI middleware: a request without a valid bearer key never reaches vLLM."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.tenant_keys = tenant_keys_from_environment()
        self.key_digest = None if self.tenant_keys else configured_key_digest()

    def allowed(self, scope: Scope) -> bool:
        """One key per model: the request may go on."""
        if is_open(scope):
            return True
        presented = presented_key(scope.get("headers") or [])
        return presented is not None and hmac.compare_digest(_digest(presented), self.key_digest or b"")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.tenant_keys is not None:
            await self.serve_tenant(scope, receive, send)
            return
        if self.allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": POLICY_VIOLATION})
            return
        body = json.dumps({"error": "Unauthorized"}).encode()
        await _respond(send, 401, body, challenge=True)

    async def serve_tenant(self, scope: Scope, receive: Receive, send: Send) -> None:
        if is_open(scope):
            await self.app(scope, receive, send)
            return
        assert self.tenant_keys is not None
        tenants = self.tenant_keys.current()
        tenant = tenants.tenant_for(presented_key(scope.get("headers") or []))
        if tenant is None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": POLICY_VIOLATION})
            else:
                await _respond(
                    send, 401, openai_error("Incorrect API key provided.", "invalid_api_key"), challenge=True
                )
            return
        allowed = tenants.allowed.get(tenant, frozenset())
        may_use_all = allowed >= set(tenants.served_names)
        if scope["type"] == "websocket":
            # A WebSocket names its model in messages this check does not read: only a tenant that
            # may use every name of this pod gets one.
            if not may_use_all:
                await send({"type": "websocket.close", "code": POLICY_VIOLATION})
                return
            await self.app(scope, receive, send)
            return
        path, method = request_path(scope), scope.get("method", "GET")
        if method in ("GET", "HEAD"):
            if path == MODELS_PATH:
                await self.app(scope, receive, _listing_only(allowed, send))
                return
            if path.startswith(MODELS_PATH + "/"):
                name = urllib.parse.unquote(path[len(MODELS_PATH) + 1 :])
                if name in tenants.served_names and name not in allowed:
                    # The same answer as for a name that does not exist: no probing of others' names.
                    await _respond(
                        send, 404, openai_error(f"The model `{name}` does not exist.", "model_not_found")
                    )
                    return
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        name = _named_model(body, tenants.served_names)
        if name is None and not may_use_all:
            await _respond(
                send,
                403,
                openai_error(
                    "This request does not name its model in a JSON body, and this key may not use every "
                    "model served here.",
                    "model_not_allowed",
                ),
            )
            return
        if name is not None and name in tenants.served_names and name not in allowed:
            await _respond(
                send, 403, openai_error(f"This key may not use the model `{name}`.", "model_not_allowed")
            )
            return
        label = name if name in tenants.served_names else "other"
        await self.count(tenant, label, scope, _replay(messages, receive), send)

    async def count(self, tenant: str, model: str, scope: Scope, receive: Receive, send: Send) -> None:
        metrics = tenant_metrics()
        status: list[int] = []
        reader: list[UsageReader] = []

        async def observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                content_type = dict(message.get("headers") or []).get(b"content-type", b"")
                reader.append(UsageReader(content_type))
            elif message["type"] == "http.response.body" and reader:
                reader[0].feed(message.get("body", b""))
            await send(message)

        gauge = metrics.in_flight.labels(tenant)
        gauge.inc()
        try:
            await self.app(scope, receive, observed)
        finally:
            gauge.dec()
            metrics.requests.labels(tenant, model, str(status[0]) if status else "none").inc()
            usage = reader[0].finish() if reader else None
            if usage is not None:
                metrics.tokens.labels(tenant, model, "prompt").inc(usage[0])
                metrics.tokens.labels(tenant, model, "completion").inc(usage[1])


def _named_model(body: bytes, served_names: tuple[str, ...]) -> str | None:
    """The served name a POST body asks for: its `model`, or vLLM's default (the first served name)
    when a JSON object names none; None when the body is not a JSON object (multipart uploads)."""
    try:
        payload = json.loads(body) if body.strip() else {}
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    model = payload.get("model")
    if model is None:
        return served_names[0] if served_names else None
    return model if isinstance(model, str) else ""


def _listing_only(allowed: frozenset[str], send: Send) -> Send:
    """A `send` that holds vLLM's `/v1/models` answer and passes on only the entries of `allowed`."""
    held: list[Message] = []
    chunks: list[bytes] = []

    async def filtered(message: Message) -> None:
        if message["type"] == "http.response.start":
            held.append(message)
            return
        if message["type"] != "http.response.body" or not held:
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        start, body = held[0], b"".join(chunks)
        if start["status"] == 200:
            try:
                listing = json.loads(body)
                listing["data"] = [e for e in listing.get("data") or [] if e.get("id") in allowed]
                body = json.dumps(listing).encode()
            except (ValueError, AttributeError, TypeError):
                body = openai_error("vLLM's model list could not be read.", "internal_error")
                start = {**start, "status": 502}
        headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return filtered


# At import, so `vllm serve` exits while building its app rather than at the first request.
if not os.environ.get(TENANTS_ENV):
    configured_key_digest()
else:
    tenant_keys_from_environment()
