"""API-key check and route allow-list in front of every route of the vLLM server (issues 15, 26, 34).

This file runs inside the upstream, unmodified `vllm/vllm-openai` image: the Deployment mounts it
from a ConfigMap (it holds code, never a key), puts its folder on PYTHONPATH and passes
`--middleware vllm_platform_auth.ApiKeyMiddleware`, which vLLM adds around its whole ASGI app.
vLLM's own check guards only the `/v1`, `/v2`, `/inference` and `/cohere` prefixes; this one denies
by default, so a route a future vLLM adds is refused too.

Routes by allow-list (issue 34): `/health` and `/metrics` (GET) answer anyone; a model or tenant key
reaches only the inference routes of INFERENCE_ROUTES (POST, each with its model check) and
`GET /v1/models`; every other route (LoRA loading, elastic EP, abort, SageMaker `/adapters`,
profiling, RL and dev routes, the OpenAPI document) needs the operator key
(`VLLM_PLATFORM_OPERATOR_KEY_FILE`, optional: unset, nobody reaches them). OPERATOR_ROUTES lists the
pinned vLLM's other routes so that tests/test_route_policy.py can check that every route of
infra/data/vllm-0.32.0-routes.json is classified.

Two modes, chosen by the environment the Deployment renders:

- One key per model (no `tenants` in the stack): the key is `VLLM_API_KEY`, which the pod reads
  from the Secret the Secrets Store CSI driver syncs from the secret store. It reaches every name
  this process serves (the base model and its adapters) on the inference routes.
- Tenants (`VLLM_PLATFORM_TENANTS` names a JSON file of the ConfigMap: this pod's served names and,
  per tenant allowed on one of them, the names it may call, its key prefix and its in-flight share;
  `VLLM_PLATFORM_TENANT_MOUNT` names the folder where the CSI driver mounts those tenants' keys as
  `<tenant>.key<n>`). Both are volumes the kubelet and the driver update in place, so the check
  re-reads them (at most once a second): a rotated or revoked key takes effect within the driver's
  rotation interval, without a restart. An unknown key gets 401. The served name a request will get
  is resolved once, as vLLM resolves it (`resolved_names`): the JSON body's `model`, where empty or
  absent means vLLM's default (the base); on `/invocations` the SageMaker adapter header, which
  vLLM writes over the body's `model`; on chat, an adapter named like a content part's type, which
  vLLM applies to a request for the base. A tenant naming a served name it may not call gets 403, a
  name this pod does not serve 404 (before vLLM); `GET /v1/models` lists only the tenant's names.
  Past its share of `max_concurrent_requests` (or the default share on a shared model) a tenant
  gets 429 with `Retry-After`: a share counts sequences (prompts x `n`, `request_sequences`, issue
  49) in flight over every API-server process of the pod (PodInFlight), a request being read
  counting one, checked before its body is read (issue 40) and again with its sequences once it is
  parsed; a request with more sequences than the whole share gets 400. Each tenant's requests get a
  `cache_salt` of their own on the routes that take one (CACHE_SALTED_ROUTES), an HMAC of the
  tenant's name under a secret only the pod holds (issue 49), unless the tenants file says
  `isolated_prefix_cache: false`: tenants do not share vLLM's prefix cache.
  Per-tenant request and token counts are Prometheus series (the tenant's name as label, never the
  key) in vLLM's own `/metrics`.

In both modes, and before any key is looked at, a request whose target is not a canonical path
gets 400 (`is_canonical_target`, issue 49): `/`-separated segments of unreserved characters only, no
dot segment, no empty segment, no percent-encoding; a query may follow. A request body larger than
`VLLM_PLATFORM_MAX_BODY_BYTES` gets 413, a JSON body with more than `VLLM_PLATFORM_MAX_JSON_VALUES`
values 413, one nesting deeper than MAX_JSON_DEPTH 400 and a number of more than
MAX_JSON_NUMBER_DIGITS digits 400, all found chunk by chunk as the body arrives, at C speed
(JsonShape, issues 40 and 49: no tenant's body may hold the event loop that answers `/health` and
the other tenants); a JSON body that does not parse or repeats a key gets 400: it never reaches vLLM
(a 200,000-deep body made vLLM answer 500). With tenants, every piece of the loop's work on a
tenant's body (each chunk's scan, the parse and checks, vLLM's own work after them) waits for the
tenant's turn and is charged to it, refused bodies and parallel connections included (BodyPacer,
issue 49), and a conversation with more messages than `VLLM_PLATFORM_MAX_MODEL_LEN` gets 400.

An empty or missing key (or, with tenants, no key at all) stops the server at start-up: vLLM imports
this module while it builds its app, before it listens, and the import raises, so the process exits
and a pod without a key never serves (it restarts until the store holds a key).

Pure ASGI and the standard library (plus prometheus_client, which vLLM itself uses, for the tenant
series): nothing here depends on vLLM's or Starlette's internals, and streamed (SSE) responses pass
through untouched: response chunks are only read (for the `usage` of the last one), never held back.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from itertools import accumulate
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
OPEN_PATHS = frozenset({"/health", "/metrics"})
"""Kubelet probes (`/health`) and Prometheus (`/metrics`) call without a key; nothing else may (the
mount's other spelling, `/metrics/`, ends in an empty segment: not canonical, 400)."""
MODELS_PATH = "/v1/models"
OPERATOR_KEY_ENV = "VLLM_PLATFORM_OPERATOR_KEY_FILE"
"""Path of the operator key's file (mounted like the tenants' keys); unset: no operator routes."""
MAX_BODY_ENV = "VLLM_PLATFORM_MAX_BODY_BYTES"
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""`security.max_request_body_mib`'s default, for a module loaded without the variable."""
MAX_JSON_DEPTH = 64
"""Deepest JSON nesting passed on: OpenAI-shaped bodies (messages, content parts, tool schemas) stay
far below it, and vLLM's own parsing of a much deeper body ends in a RecursionError (500)."""
MAX_JSON_VALUES_ENV = "VLLM_PLATFORM_MAX_JSON_VALUES"
DEFAULT_MAX_JSON_VALUES = 262_144
"""`security.max_request_json_values`'s default, for a module loaded without the variable."""
TENANT_LOOP_SHARE_ENV = "VLLM_PLATFORM_TENANT_LOOP_SHARE"
DEFAULT_TENANT_LOOP_SHARE = 0.25
"""`security.tenant_body_loop_share`'s default, for a module loaded without the variable."""
MAX_JSON_NUMBER_DIGITS = 64
"""Longest run of digits a JSON number may hold (issue 49). Python converts an integer's digits in
time that grows with their square: 16 MiB of 4,299-digit integers (just under Python's own
4,300-digit limit) took 0.39 s of `json.loads` on the probe's server (0.33 s here), 9.6 MB of
64-digit ones 0.06 s, about what a 16 MiB string costs (check_cost_issue49_results.json). No field
vLLM reads takes an integer beyond a uint64 (20 digits), and JSON encoders write a double with at
most 17 significant digits (JavaScript and Go about 21 digits in a row before they switch to an
exponent): 64 is three times what any client writes."""
MAX_MODEL_LEN_ENV = "VLLM_PLATFORM_MAX_MODEL_LEN"
"""The model's `--max-model-len` (components/server_auth.py renders both from `vllm.max_model_len`):
no conversation of a request may hold more messages, since every message renders to at least one
token (unset: no such bound)."""
CLOSED_CONNECTION_SECONDS = 0.004
"""Loop seconds a tenant is charged, besides the scan, for a body refused before it was read to its
end: the connection is closed, and the next request's new connection (accept, HTTP parse, ASGI set-up,
answer, teardown in uvicorn and the kernel) is work the middleware's CPU clock never sees (issue 49:
a tenant sending 16 MiB bodies refused at their first chunk got 270 answers a second, and another
tenant's completion read 2.3 to 2.7x idle, above the small-body control's 2.1x; its answers took 3.3
ms at the median, round trip, on the 2-core development machine). Charged at about that round trip,
such refusals are held to 62 a second per tenant at the default share, and a client that keeps
sending bodies it knows are refused gains nothing by it."""
CHECK_COST_FACTOR = 2
"""Loop seconds a tenant is charged per second of the middleware's own work on its body: vLLM parses
the same bytes again about as dearly (bench/tenant_stall/check_cost_results.json)."""
VLLM_SECONDS_PER_CHAT_ITEM = 10e-6
"""vLLM 0.32.0's own work per chat message or content part beyond its parse, charged to the tenant
before vLLM does it (issue 49: 37,000 one-token messages cost vLLM far more than twice the
middleware's parse): pydantic's validation of the request, `parse_chat_messages` and the chat
template took 6.7 us of CPU per message (37,000 and 32,768 messages) and 7.2 us per content part
(49,089 in one message) on the 2-core development machine, with the tiny test model's one-line
template (bench/tenant_stall/check_cost_issue49_results.json, 2026-12-07), rounded up: a production
template renders more per message, and the message bound (MAX_MODEL_LEN_ENV) caps the count."""
SAGEMAKER_ADAPTER_HEADER = b"x-amzn-sagemaker-adapter-identifier"
"""vLLM 0.32.0's `/invocations` writes this header's value over the body's `model`
(vllm/entrypoints/sagemaker/api_router.py: `inject_adapter_id(adapter_path="model")`)."""

# Where vLLM 0.32.0 takes a request's served name from, per inference route (POST only).
BODY = "body"
"""The JSON body's `model`; empty or absent: vLLM's default served name (`_is_model_supported`)."""
SAGEMAKER = "sagemaker"
"""The adapter header, which vLLM writes over the body's `model` (absent: None, the default); and
content-part types, as CHAT (vLLM passes a chat-shaped body to its chat handler)."""
CHAT = "chat"
"""As BODY, and content-part types: vLLM applies an adapter named like one (before its first `_`)
to a request for the base (`_get_active_default_mm_loras`, chat only)."""
INFERENCE_ROUTES: dict[str, str] = {
    "/v1/completions": "body",
    "/v1/completions/render": "body",
    "/v1/completions/derender": "body",
    "/v1/chat/completions": "chat",
    "/v1/chat/completions/batch": "chat",
    "/v1/chat/completions/render": "chat",
    "/v1/chat/completions/derender": "chat",
    "/v1/responses": "chat",
    "/v1/responses/render": "chat",
    "/v1/messages": "chat",
    "/v1/messages/count_tokens": "chat",
    "/v1/messages/render": "chat",
    "/cohere/v2/chat": "chat",
    "/cohere/v2/chat/render": "chat",
    "/inference/v1/generate": "chat",
    "/invocations": "sagemaker",
    "/v1/systemone": "body",
    "/generative_scoring": "body",
    "/tokenize": "chat",
    "/detokenize": "body",
    "/v1/embeddings": "chat",
    "/v2/embed": "chat",
    "/pooling": "chat",
    "/classify": "chat",
    "/score": "body",
    "/v1/score": "body",
    "/rerank": "body",
    "/v1/rerank": "body",
    "/v2/rerank": "body",
    "/v1/audio/transcriptions": "body",
    "/v1/audio/translations": "body",
}
"""What a model or tenant key may call (POST), each with its model check, besides GET /v1/models."""
WEBSOCKET_ROUTES = frozenset({"/v1/realtime"})
"""Inference over a WebSocket: the model is named in messages this check does not read, so only a
key that may use every served name of the pod gets one."""
OPERATOR_ROUTES = frozenset(
    {
        # LoRA adapters at run time (vLLM's and SageMaker's routes), elastic EP, aborting any request.
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/adapters",
        "/adapters/{adapter_name}",
        "/scale_elastic_ep",
        "/is_scaling_elastic_ep",
        "/abort_requests",
        "/inference/v1/abort_requests",
        # Stored responses: another tenant's, by id.
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/cancel",
        # Operations, fault tolerance, profiling, the dev-mode and RL routes (weights, sleep, caches, RPC).
        "/ping",
        "/load",
        "/version",
        "/server_info",
        "/ready",
        "/readyz",
        "/fault_tolerance/apply",
        "/fault_tolerance/status",
        "/start_profile",
        "/stop_profile",
        "/collective_rpc",
        "/get_world_size",
        "/is_paused",
        "/pause",
        "/resume",
        "/is_sleeping",
        "/sleep",
        "/wake_up",
        "/reset_prefix_cache",
        "/reset_mm_cache",
        "/reset_encoder_cache",
        "/release_kv_cache_memory",
        "/kv_event_sources",
        "/tokenizer_info",
        "/init_weight_transfer_engine",
        "/shutdown_weight_transfer_engine",
        "/start_weight_update",
        "/start_draft_weight_update",
        "/finish_weight_update",
        "/update_weights",
        "/update_weight_version",
        "/weight_checker",
        "/weight_info",
        # FastAPI's documentation (and --enable-offline-docs' static files).
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/static",
    }
)
"""The pinned vLLM's other routes, classified as operator-only (the default for any path not in
INFERENCE_ROUTES, MODELS_PATH or OPEN_PATHS: this set exists so that a new upstream route is a
decision, checked against the route snapshot by tests/test_route_policy.py)."""
POLICY_VIOLATION = 1008
"""WebSocket close code for a refused handshake (uvicorn answers it with HTTP 403)."""
USAGE_BODY_LIMIT = 8 * 1024 * 1024
"""A non-streamed JSON answer is copied (while it is sent) up to this size to read its `usage`."""
RETRY_AFTER_SECONDS = 1
"""`Retry-After` of a 429 past the tenant's in-flight share: requests usually finish within seconds."""
CACHE_SALT_FIELD = "cache_salt"
CACHE_SALTED_ROUTES = frozenset(
    {
        "/v1/completions",
        "/v1/completions/render",
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/chat/completions/render",
        "/v1/responses",
        "/v1/responses/render",
        "/v1/messages",
        "/v1/messages/render",
        "/v1/systemone",
        "/generative_scoring",
        "/inference/v1/generate",
        "/invocations",
        # Served for pooling models only: their requests take the salt too (PoolingBasicRequestMixin).
        "/v1/embeddings",
        "/pooling",
        "/classify",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
    }
)
"""The inference routes whose vLLM 0.32.0 request models take `cache_salt` (checked against the real
server's OpenAPI document by tests/e2e/test_tenants.py): there the middleware sets each tenant's own
salt, so tenants sharing a model never share its prefix cache."""
STATE_DIR_ENV = "VLLM_PLATFORM_STATE_DIR"
"""A folder on a pod-local tmpfs (the pod's `/dev/shm`) that every API-server process of the pod
shares: the tenants' in-flight counts (PodInFlight) and the cache-salt secret (`pod_salt_secret`).
Unset (a module loaded outside a pod): this process counts alone, with a secret of its own."""
CACHE_SALT_SECRET_FILE = "cache-salt.secret"
CACHE_SALT_SECRET_BYTES = 32
SEQUENCE_FIELDS: dict[str, tuple[str, ...]] = {
    "/v1/completions": ("prompt", "prompt_embeds"),
    "/invocations": ("prompt", "prompt_embeds", "input"),
    "/v1/chat/completions/batch": ("messages",),
    "/generative_scoring": ("items",),
    "/v1/systemone": ("questions",),
    "/v1/embeddings": ("input",),
    "/pooling": ("input",),
    "/classify": ("input",),
    "/v2/embed": ("texts", "images", "inputs"),
    "/score": ("text_1", "text_2", "queries", "documents", "items"),
    "/v1/score": ("text_1", "text_2", "queries", "documents", "items"),
    "/rerank": ("documents",),
    "/v1/rerank": ("documents",),
    "/v2/rerank": ("documents",),
}
"""Where vLLM 0.32.0 takes a batch from, per inference route: each prompt, input, conversation,
item, question or document of these fields is an engine request of its own (a completion's `prompt`
may list up to 1,024 prompts). The other inference routes run one prompt per request."""
PAIRED_ROUTES = frozenset({"/score", "/v1/score"})
"""Their two fields pair up (one to N, or N to N elementwise): the longer one is the batch."""
SEQUENCES_PER_PROMPT_ROUTES = frozenset(
    {"/v1/completions", "/invocations", "/v1/chat/completions", "/v1/chat/completions/batch"}
)
"""Routes whose `n` asks for that many sequences of each prompt (`/inference/v1/generate` takes it
from `sampling_params.n`)."""
CANONICAL_SEGMENT = re.compile(rb"[A-Za-z0-9._~-]+")
"""A path segment of RFC 3986's unreserved characters only (path_tricks.py holds the rule)."""

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


def is_canonical_target(scope: Scope) -> bool:
    """The request's path is canonical (issue 49): it starts with `/` and every segment holds only
    unreserved characters and is not `.` or `..` (so no empty segment, no trailing `/`, no
    percent-encoding, `;`, `\\`, `#` or control character). Read from `raw_path`, the bytes the
    client sent (uvicorn percent-decodes `path`, which would hide `%2e%2e` and `%2f`); the query is
    not part of either and may follow. A path that reads one way here and another way further on
    (a dot segment, an encoded `/`) never reaches a route check."""
    raw = scope.get("raw_path")
    path = raw if isinstance(raw, bytes) else str(scope.get("path", "")).encode("utf-8", "surrogateescape")
    if not path.startswith(b"/"):
        return False
    return all(
        CANONICAL_SEGMENT.fullmatch(segment) is not None and segment not in (b".", b"..")
        for segment in path[1:].split(b"/")
    )


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
    in_flight_limits: dict[str, int] = field(default_factory=dict)
    """Tenant -> most of its sequences (prompts x `n`) the pod's API-server processes answer at once
    (its share of `max_concurrent_requests`, or the stack's default share; the file's
    `max_in_flight`); a tenant without a limit is absent."""
    isolated_prefix_cache: bool = True
    """Each tenant's requests get its own `cache_salt` (the file's `isolated_prefix_cache`; absent:
    isolated), so no tenant's prompt reuses, or reveals, another tenant's cached blocks."""

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
    limits = {name: int(t["max_in_flight"]) for name, t in tenants.items() if t.get("max_in_flight")}
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
    isolated = spec.get("isolated_prefix_cache", True) is not False
    return TenantSet(served, allowed, tuple(digests), limits, isolated)


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


# --- a tenant's share over the pod's API-server processes (issue 49) ------------------------------


class ProcessInFlight:
    """Each tenant's sequences in flight in this process alone (no STATE_DIR_ENV: one process)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def held(self, tenant: str) -> int:
        return self.counts.get(tenant, 0)

    def take(self, tenant: str, count: int, limit: int) -> bool:
        """Add `count` to the tenant's sequences in flight if they stay within `limit`."""
        if self.held(tenant) + count > limit:
            return False
        self.counts[tenant] = self.held(tenant) + count
        return True

    def give(self, tenant: str, count: int) -> None:
        self.counts[tenant] = self.held(tenant) - count


MAX_PROCESS_SLOTS = 4096
"""More than any pod runs API-server processes (vLLM defaults to one per data-parallel rank)."""
_COUNT = struct.Struct("<q")


class PodInFlight:
    """Each tenant's sequences in flight over every API-server process of the pod (issue 49: vLLM
    0.32.0 runs one per data-parallel rank by default, the kernel spreads connections over them, and
    each had counted alone, so a DP=2 leader admitted twice the share). The processes share a folder
    on the pod's tmpfs: in `tenant-<name>` one 8-byte count per process slot, read and written under
    that file's flock (a few system calls; only the pod's processes contend). A process takes a slot
    at its first use by locking that slot's byte of `processes` (a POSIX lock: the kernel drops it
    when the process exits, however it exits), and a slot's count is summed only while its lock is
    held: counts left by a crashed or restarted server (the tmpfs outlives a container restart)
    never hold a share, so the count starts fresh with the server without anyone resetting it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pid: int | None = None
        self.slot = -1
        self.processes = -1
        self.files: dict[str, int] = {}

    def _ready(self) -> None:
        if self.pid == os.getpid():
            return
        # First use in this process (a forked child holds none of its parent's POSIX locks).
        self.pid, self.files = os.getpid(), {}
        self.processes = os.open(self.directory / "processes", os.O_RDWR | os.O_CREAT, 0o600)
        for slot in range(MAX_PROCESS_SLOTS):
            try:
                fcntl.lockf(self.processes, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
            except OSError:
                continue
            self.slot = slot
            break
        else:
            raise RuntimeError(f"no free process slot in {self.directory / 'processes'}")
        # Whatever a dead process left in this slot is not this process's.
        for path in sorted(self.directory.glob("tenant-*")):
            fd = self._file(path.name.removeprefix("tenant-"))
            with _flocked(fd):
                os.pwrite(fd, _COUNT.pack(0), self.slot * _COUNT.size)

    def _file(self, tenant: str) -> int:
        if tenant not in self.files:
            if not KEY_FILE.match(f"{tenant}.key0"):
                raise ValueError(f"not a tenant name: {tenant!r}")
            self.files[tenant] = os.open(self.directory / f"tenant-{tenant}", os.O_RDWR | os.O_CREAT, 0o600)
        return self.files[tenant]

    def _alive(self, slot: int) -> bool:
        if slot == self.slot:
            return True
        try:
            fcntl.lockf(self.processes, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, slot)
        except OSError:
            return True  # another process holds it
        fcntl.lockf(self.processes, fcntl.LOCK_UN, 1, slot)
        return False

    def _counts(self, fd: int) -> tuple[int, int]:
        """(the live processes' sum, this process's own count); call under the file's flock. A dead
        process's count is cleared on the way."""
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        total = mine = 0
        for slot in range(len(data) // _COUNT.size):
            (value,) = _COUNT.unpack_from(data, slot * _COUNT.size)
            if not value:
                continue
            if slot == self.slot:
                mine = value
            elif not self._alive(slot):
                os.pwrite(fd, _COUNT.pack(0), slot * _COUNT.size)
                continue
            total += value
        return total, mine

    def held(self, tenant: str) -> int:
        self._ready()
        fd = self._file(tenant)
        with _flocked(fd):
            return self._counts(fd)[0]

    def take(self, tenant: str, count: int, limit: int) -> bool:
        """Add `count` to the tenant's sequences in flight if the pod's total stays within `limit`."""
        self._ready()
        fd = self._file(tenant)
        with _flocked(fd):
            total, mine = self._counts(fd)
            if total + count > limit:
                return False
            os.pwrite(fd, _COUNT.pack(mine + count), self.slot * _COUNT.size)
            return True

    def give(self, tenant: str, count: int) -> None:
        self._ready()
        fd = self._file(tenant)
        with _flocked(fd):
            _, mine = self._counts(fd)
            os.pwrite(fd, _COUNT.pack(mine - count), self.slot * _COUNT.size)


@contextlib.contextmanager
def _flocked(fd: int) -> Iterator[None]:
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def state_dir(environ: MutableMapping[str, str] | None = None) -> Path | None:
    """STATE_DIR_ENV's folder, created (the tmpfs starts empty); None where it is unset."""
    value = (os.environ if environ is None else environ).get(STATE_DIR_ENV)
    if not value:
        return None
    path = Path(value)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def in_flight_counter(directory: Path | None) -> ProcessInFlight | PodInFlight:
    return ProcessInFlight() if directory is None else PodInFlight(directory)


def pod_salt_secret(directory: Path | None) -> bytes:
    """The secret under which tenants' cache salts are derived (`tenant_cache_salt`): random, made by
    the pod's first API-server process and read by the others (the engines' prefix cache is
    per pod, so the pod's processes must agree on it, and nobody else need know it); without a
    shared folder, one of this process's own."""
    if directory is None:
        return os.urandom(CACHE_SALT_SECRET_BYTES)
    path = directory / CACHE_SALT_SECRET_FILE
    if not path.exists():
        draft = directory / f".{CACHE_SALT_SECRET_FILE}.{os.getpid()}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, os.urandom(CACHE_SALT_SECRET_BYTES))
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(draft, path)  # never replaces one another process made first
        draft.unlink()
    seed = path.read_bytes()
    if len(seed) != CACHE_SALT_SECRET_BYTES:
        raise RuntimeError(f"{path} holds {len(seed)} bytes, not a {CACHE_SALT_SECRET_BYTES}-byte secret")
    return seed


@dataclass
class OperatorKey:
    """The operator key's file, re-read (like the tenants' keys) when older than RELOAD_SECONDS."""

    path: Path
    clock: Callable[[], float] = time.monotonic
    _digest: bytes | None = None
    _read_at: float = float("-inf")

    def matches(self, presented: bytes | None) -> bool:
        now = self.clock()
        if now - self._read_at >= RELOAD_SECONDS:
            try:
                key = self.path.read_bytes().strip()
            except OSError:
                key = b""
            self._digest = _digest(key) if key else None  # emptied in the store: revoked
            self._read_at = now
        if presented is None or self._digest is None:
            return False
        return hmac.compare_digest(_digest(presented), self._digest)


def operator_key_from_environment(environ: MutableMapping[str, str] | None = None) -> OperatorKey | None:
    path = (os.environ if environ is None else environ).get(OPERATOR_KEY_ENV)
    return OperatorKey(Path(path)) if path else None


def max_body_bytes(environ: MutableMapping[str, str] | None = None) -> int:
    value = (os.environ if environ is None else environ).get(MAX_BODY_ENV)
    return int(value) if value else DEFAULT_MAX_BODY_BYTES


def max_json_values(environ: MutableMapping[str, str] | None = None) -> int:
    value = (os.environ if environ is None else environ).get(MAX_JSON_VALUES_ENV)
    return int(value) if value else DEFAULT_MAX_JSON_VALUES


def max_model_len(environ: MutableMapping[str, str] | None = None) -> int | None:
    value = (os.environ if environ is None else environ).get(MAX_MODEL_LEN_ENV)
    return int(value) if value else None


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


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    *,
    challenge: bool = False,
    retry_after: int | None = None,
    close: bool = False,
) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if challenge:
        headers.append((b"www-authenticate", b'Bearer realm="vllm"'))
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    if close:
        # The request's body is not read to its end: uvicorn would read and drop the rest on the
        # event loop (16 MiB of callbacks) to keep the connection; closing it costs nothing.
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Refused(Exception):
    """A request answered here, never passed to vLLM: its status and OpenAI-shaped error; `close`
    when its body was not read to the end (the connection is then closed)."""

    def __init__(
        self, status: int, message: str, code: str, *, close: bool = False, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.close = status, message, code, close
        self.retry_after = retry_after

    async def answer(self, send: Send) -> None:
        await _respond(
            send,
            self.status,
            openai_error(self.message, self.code),
            close=self.close,
            retry_after=self.retry_after,
        )


def _header(scope: Scope, name: bytes) -> list[bytes]:
    return [value for key, value in scope.get("headers") or [] if key.lower() == name]


class JsonShape:
    """Counts a JSON body's values and tracks its nesting chunk by chunk, as the body arrives, with
    bytes methods only (C speed, no parse, no Python step per value): a body past `max_values` or
    MAX_JSON_DEPTH is refused before the rest of it is read, and no chunk costs the event loop more
    than a few microseconds per kilobyte (issue 40: a body of 5.6 million empty objects took 5.5 s
    of Python in the old depth walk, on the loop that answers `/health`).

    Values: every `,`, `[` and `{` outside strings, plus one: at least the number of array elements,
    object members and containers, so any value costs its place in the count. Digits: the longest
    run outside strings (a number's integer, fraction or exponent part; runs that cross a chunk's
    end are joined), refused past MAX_JSON_NUMBER_DIGITS before Python's parse converts it (issue
    49). Strings are found
    exactly: escaped backslashes and quotes are blanked first (an odd run of backslashes at a chunk's
    end waits for the next chunk), then every remaining `"` opens or closes one. The count and depth
    are exact for valid JSON; invalid JSON fails the parse that follows."""

    def __init__(self, max_values: int) -> None:
        self.max_values = max_values
        self.seconds = 0.0
        """CPU time spent in `feed` so far (the event loop thread's: a machine that preempts the
        process does not inflate it), i.e. the loop's cost of this body's scan."""
        self.values = 1
        self.depth = 0
        self.in_string = False
        self.carry = b""
        self.digit_run = 0
        """Digits outside strings at the end of what was fed so far (a number the next chunk goes on)."""

    def feed(self, chunk: bytes) -> None:
        started = time.thread_time()
        try:
            self._feed(chunk)
        finally:
            self.seconds += time.thread_time() - started

    def _feed(self, chunk: bytes) -> None:
        data = self.carry + chunk if self.carry else chunk
        run = len(data) - len(data.rstrip(b"\\"))
        self.carry = b"\\" if run % 2 else b""
        if run % 2:
            data = data[:-1]
        parts = data.replace(b"\\\\", b"  ").replace(b'\\"', b"  ").split(b'"')
        outside = b"".join(parts[1 if self.in_string else 0 :: 2])
        self.in_string ^= len(parts) % 2 == 0
        self._count_digits(outside)
        opened = outside.count(b"[") + outside.count(b"{")
        self.values += outside.count(b",") + opened
        if self.values > self.max_values:
            raise Refused(
                413, f"The request body holds more than {self.max_values} JSON values.", "request_too_large"
            )
        closed = outside.count(b"]") + outside.count(b"}")
        if self.depth + opened > MAX_JSON_DEPTH and self.depth + _nesting_bound(outside) > MAX_JSON_DEPTH:
            # Only now walk the brackets one by one (still in C: accumulate over a map of a list).
            brackets = outside.translate(None, _NOT_BRACKETS)
            levels = list(accumulate(map(_BRACKET_STEP.__getitem__, brackets), initial=self.depth))
            if max(levels) > MAX_JSON_DEPTH:
                raise Refused(
                    400, f"The request body nests deeper than {MAX_JSON_DEPTH} levels.", "invalid_json"
                )
        self.depth += opened - closed

    def _count_digits(self, outside: bytes) -> None:
        digits = outside.translate(_DIGITS_AS_ZEROS)  # every other byte a space: runs of b"0" remain
        leading = len(digits) - len(digits.lstrip(b"0"))
        if self.digit_run + leading > MAX_JSON_NUMBER_DIGITS or _TOO_MANY_DIGITS in digits:
            raise Refused(
                400,
                f"A number in the request body has more than {MAX_JSON_NUMBER_DIGITS} digits.",
                "invalid_request",
            )
        if leading == len(digits):
            self.digit_run += leading
        else:
            self.digit_run = len(digits) - len(digits.rstrip(b"0"))


def _nesting_bound(outside: bytes) -> int:
    """At least how far a chunk's brackets (outside strings) nest above the depth it starts at, from
    bytes methods only: with every bracket made `[` or `]`, each pass of `replace(b"[]", b"")` removes
    exactly the innermost level of matched pairs, so the passes count the matched nesting, and what
    is left (closers, then openers, for valid JSON) adds its openers. A body of many shallow
    containers (issue 40: `{},{},...`) is done in one pass, where a walk would step through every
    bracket in Python's iterator protocol. A pass that leaves more than half of the brackets, or more
    than NESTING_PASSES passes, answer MAX_JSON_DEPTH + 1: such a chunk nests deep, and the caller's
    exact walk then costs less than pass after pass."""
    residue = outside.translate(_SQUARE_BRACKETS, _NOT_BRACKETS)
    for passes in range(NESTING_PASSES + 1):
        reduced = residue.replace(b"[]", b"")
        if len(reduced) == len(residue):
            return passes + residue.count(b"[")
        if len(reduced) > len(residue) // 2:
            break
        residue = reduced
    return MAX_JSON_DEPTH + 1


_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
_DIGITS_AS_ZEROS = bytes(ord("0") if byte in b"0123456789" else ord(" ") for byte in range(256))
_TOO_MANY_DIGITS = b"0" * (MAX_JSON_NUMBER_DIGITS + 1)
_SQUARE_BRACKETS = bytes.maketrans(b"{}", b"[]")
NESTING_PASSES = 8
"""OpenAI-shaped bodies nest about 6 deep (a tool schema's properties a few more)."""
_BRACKET_STEP = [0] * 256
_BRACKET_STEP[ord("[")] = _BRACKET_STEP[ord("{")] = 1
_BRACKET_STEP[ord("]")] = _BRACKET_STEP[ord("}")] = -1


async def _read_body(
    scope: Scope,
    receive: Receive,
    limit: int,
    max_json_values: int | None = None,
    pacer: BodyPacer | None = None,
    tenant: str = "",
) -> tuple[list[Message], bytes]:
    """Every message up to the end of the request body, and the body; Refused(413) past `limit`
    (by the declared Content-Length before reading, else while reading). A JSON body (by its
    content type, else its first byte) is also measured as it arrives (JsonShape): Refused past
    `max_json_values` values, MAX_JSON_DEPTH levels or MAX_JSON_NUMBER_DIGITS digits, before the
    rest is read. With a `pacer`, each chunk's scan waits for the tenant's turn and is charged to it
    (so that a tenant's parallel connections share its one clock, issue 49)."""
    for declared in _header(scope, b"content-length"):
        if declared.strip().isdigit() and int(declared) > limit:
            if pacer is not None:
                pacer.charge(tenant, CLOSED_CONNECTION_SECONDS)
            raise Refused(
                413, f"The request body is larger than {limit} bytes.", "request_too_large", close=True
            )
    shape: JsonShape | None = None
    decided = max_json_values is None
    messages, chunks, size = [], [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        more = message.get("more_body", False)
        if size > limit:
            if pacer is not None and more:
                pacer.charge(tenant, CLOSED_CONNECTION_SECONDS)
            raise Refused(
                413, f"The request body is larger than {limit} bytes.", "request_too_large", close=more
            )
        chunks.append(chunk)
        if not decided and chunk.strip():
            decided = True
            if _is_json(scope, chunk) and max_json_values is not None:
                shape = JsonShape(max_json_values)
                for earlier in chunks[:-1]:
                    shape.feed(earlier)  # whitespace only
        if shape is not None:
            if pacer is not None:
                await pacer.turn(tenant)
            scanned = shape.seconds
            try:
                shape.feed(chunk)
            except Refused as refused:
                refused.close = more
                if pacer is not None and more:
                    pacer.charge(tenant, CLOSED_CONNECTION_SECONDS)
                raise
            finally:
                if pacer is not None:
                    pacer.charge(tenant, CHECK_COST_FACTOR * (shape.seconds - scanned))
        if not more:
            break
    return messages, b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


def _is_json(scope: Scope, body: bytes) -> bool:
    content_type = b"".join(_header(scope, b"content-type")[:1]).split(b";")[0].strip().lower()
    if content_type:
        return content_type == b"application/json" or content_type.endswith(b"+json")
    return body.lstrip()[:1] in (b"{", b"[")


def parse_json_body(body: bytes) -> Any:
    """The parsed JSON body, or Refused(400) when it is not JSON. Its size, value count and depth were
    checked while it was read (`_read_body`), and it is parsed exactly as vLLM 0.32.0 parses it
    (Starlette's `Request.json`: `json.loads`, which FastAPI calls for every route's body), so this
    costs what vLLM's own parse costs, and a key given twice reads the same here as there: the last
    copy (issue 40 dropped a duplicate-key hook that tripled the parse of object-heavy bodies)."""
    try:
        return json.loads(body)
    except RecursionError:
        # Only a body that is not JSON gets here (JsonShape bounded a valid one's depth).
        raise Refused(
            400, f"The request body nests deeper than {MAX_JSON_DEPTH} levels.", "invalid_json"
        ) from None
    except (ValueError, UnicodeDecodeError) as error:
        raise Refused(400, f"The request body is not valid JSON: {error}", "invalid_json") from None


def _content_part_types(payload: dict[str, Any]) -> set[str]:
    """The content-part types of a chat body's messages, cut at the first `_` as vLLM cuts them
    to pick a default multimodal LoRA (serving engine `_get_message_types`)."""
    types: set[str] = set()
    messages = payload.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and isinstance(part.get("type"), str):
                types.add(part["type"].split("_")[0])
    return types


def resolved_names(
    kind: str, payload: dict[str, Any], scope: Scope, served_names: tuple[str, ...]
) -> set[str]:
    """Every served name vLLM 0.32.0 may answer this request with: the one it resolves (the default,
    the first served name, when the name is empty or absent; on `/invocations` the adapter header
    instead of the body's `model`), plus on chat any served name equal to a content-part type."""
    default = served_names[0] if served_names else ""
    model = payload.get("model")
    if kind == SAGEMAKER:
        # The SageMaker wrapper sets the body's `model` to the header's value on every request: to
        # None (vLLM's default) when the header is absent, whatever the body named.
        adapter = _header(scope, SAGEMAKER_ADAPTER_HEADER)
        if len(adapter) > 1:
            raise Refused(400, "Name the SageMaker adapter once.", "invalid_request")
        model = adapter[0].decode("latin-1") if adapter else None  # as Starlette decodes headers
    if model is not None and not isinstance(model, str):
        raise Refused(400, "`model` must be a string.", "invalid_request")
    names = {model or default}
    if kind in (CHAT, SAGEMAKER):  # /invocations hands a chat-shaped body to the chat handler
        names |= _content_part_types(payload) & set(served_names)
    return names


def _batch_size(value: object) -> int:
    """How many prompts a batch field holds: a list of token ids is one prompt, any other list one
    per element (strings, token-id lists, conversations, documents), a mapping one per entry
    (`/v1/systemone`'s questions); anything else one."""
    if isinstance(value, list):
        if all(isinstance(item, int) for item in value):
            return 1
        return len(value)
    if isinstance(value, dict):
        return len(value)
    return 1


def _count_field(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


def request_sequences(path: str, payload: dict[str, Any] | None) -> int:
    """How many sequences the engine runs at once for this request (issue 49: a share counted
    requests, and 8 requests of 256 prompts each, within a share of 8, slowed another tenant's
    completion ~220x): its prompts (SEQUENCE_FIELDS) times the sequences asked of each (`n`;
    beam search's width is `n` too). At least 1: a body this does not read (multipart audio) or
    one vLLM will refuse still counts as one request."""
    if payload is None:
        return 1
    sizes = [_batch_size(payload[name]) for name in SEQUENCE_FIELDS.get(path, ()) if name in payload]
    prompts = (max if path in PAIRED_ROUTES else sum)(sizes) if sizes else 1
    if path in SEQUENCES_PER_PROMPT_ROUTES:
        per_prompt = _count_field(payload.get("n"))
    elif path == "/inference/v1/generate":
        sampling = payload.get("sampling_params")
        per_prompt = _count_field(sampling.get("n") if isinstance(sampling, dict) else None)
    else:
        per_prompt = 1
    return max(1, prompts) * per_prompt


def chat_items(path: str, payload: dict[str, Any] | None) -> tuple[int, int]:
    """(the most messages of one conversation, the messages and content parts of all) that vLLM
    validates, parses and renders one by one for this request (issue 49): `messages` on every route
    (a list of conversations on the batch route), and `input` on the Responses routes, whose items
    are messages too."""
    if payload is None:
        return 0, 0
    conversations: list[list[Any]] = []
    for name in ("messages", "input") if path.startswith("/v1/responses") else ("messages",):
        value = payload.get(name)
        if isinstance(value, list) and value and all(isinstance(item, list) for item in value):
            conversations += value
        elif isinstance(value, list):
            conversations.append(value)
    longest = max(map(len, conversations), default=0)
    items = 0
    for conversation in conversations:
        items += len(conversation)
        for message in conversation:
            content = message.get("content") if isinstance(message, dict) else None
            items += len(content) if isinstance(content, list) else 0
    return longest, items


def tenant_cache_salt(secret: bytes, tenant: str, requested: object) -> str:
    """The `cache_salt` vLLM gets for a tenant's request: HMAC-SHA256 of the tenant's name under the
    pod's secret (`pod_salt_secret`; issue 49: the former `tenant=<name>;` was predictable, so the
    operator key, which may set any salt, could read a tenant's cached prefixes), then `;` and
    whatever salt the client sent: it may split its own cache further, never reach another tenant's
    (every tenant's salt starts with its own 64 hex digits and `;`), and no caller can compute the
    part the pod adds."""
    if requested is not None and not isinstance(requested, str):
        raise Refused(400, "`cache_salt` must be a string.", "invalid_request")
    return f"{hmac.new(secret, tenant.encode(), hashlib.sha256).hexdigest()};{requested or ''}"


def salted(
    scope: Scope, messages: list[Message], body: bytes, payload: dict[str, Any], salt: str
) -> tuple[Scope, list[Message]]:
    """The request with `salt` as its body's `cache_salt` (and Content-Length to match). Without a
    salt of the client's the field is spliced in front of the body's own (no re-encoding of the
    client's bytes); with one, the parsed body is encoded again with the salt replaced."""
    start = body.find(b"{") + 1
    utf8 = body[:start].strip() == b"{" and b"\x00" not in body[:4]
    if CACHE_SALT_FIELD in payload or not payload or not utf8:
        # (or a body in UTF-16/32, or after a byte-order mark, which json.loads also reads)
        new_body = json.dumps({**payload, CACHE_SALT_FIELD: salt}).encode()
    else:
        field_start = f'{{"{CACHE_SALT_FIELD}": {json.dumps(salt)},'.encode()
        new_body = field_start + body[start:]
    headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(new_body)).encode()))
    rest = messages[-1:] if messages and messages[-1]["type"] != "http.request" else []
    return {**scope, "headers": headers}, [
        {"type": "http.request", "body": new_body, "more_body": False},
        *rest,
    ]


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


@dataclass
class BodyPacer:
    """Keeps each tenant's request bodies to `share` of the event loop that also answers `/health`
    and every other tenant (issue 40: one tenant sending its worst bodies back to back kept that loop
    busy and made the others wait). Each tenant has one clock, `next_start`: every piece of the
    loop's work on its bodies (each chunk's scan; the parse and checks with vLLM's work after them)
    first waits for its `turn` (until that clock is not in the future), then is `charge`d: the clock
    moves on by the piece's loop seconds / `share`. What a piece costs: the middleware's own CPU time
    times CHECK_COST_FACTOR (vLLM parses the same bytes again), charged as it is spent, so a body
    refused at any point after its scan began is charged too; and vLLM's own work beyond its parse
    (per chat message and content part, VLLM_SECONDS_PER_CHAT_ITEM), charged before the body is
    handed over (issue 49). The turn comes before the work, not after it: a tenant's parallel
    connections share the one clock, so together they too get `share` of the loop (issue 49: 8
    connections each had their scans and parses before any pacing). Ordinary bodies cost
    microseconds (no wait a client can notice); a full-context prompt waits tens of milliseconds,
    against seconds of prefill. One loop: no lock; a piece that finds the clock moved on by another
    connection while it slept waits again."""

    share: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    next_start: dict[str, float] = field(default_factory=dict)

    def wait(self, tenant: str) -> float:
        """Seconds until the tenant's turn (0: now)."""
        if self.share >= 1.0:
            return 0.0
        return max(0.0, self.next_start.get(tenant, float("-inf")) - self.clock())

    async def turn(self, tenant: str) -> None:
        """Returns once the tenant's earlier pieces fit its share of the time since."""
        while (seconds := self.wait(tenant)) > 0:
            await self.sleep(seconds)

    def charge(self, tenant: str, loop_seconds: float) -> None:
        """The tenant's next piece waits `loop_seconds` / share longer."""
        if self.share >= 1.0:
            return
        now = self.clock()
        self.next_start[tenant] = max(now, self.next_start.get(tenant, now)) + loop_seconds / self.share


def tenant_loop_share(environ: MutableMapping[str, str] | None = None) -> float:
    value = (os.environ if environ is None else environ).get(TENANT_LOOP_SHARE_ENV)
    return float(value) if value else DEFAULT_TENANT_LOOP_SHARE


class ApiKeyMiddleware:
    """Outermost ASGI middleware: a request without a valid bearer key never reaches vLLM, and a
    model or tenant key reaches only the inference routes and the model list."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.tenant_keys = tenant_keys_from_environment()
        self.key_digest = None if self.tenant_keys else configured_key_digest()
        self.operator_key = operator_key_from_environment()
        self.max_body_bytes = max_body_bytes()
        self.max_json_values = max_json_values()
        shared = state_dir()
        self.in_flight = in_flight_counter(shared)
        """Each tenant's sequences in flight over the pod's API-server processes."""
        self.salt_seed = pod_salt_secret(shared) if self.tenant_keys is not None else b""
        """The pod's secret that tenants' cache salts are derived under (`tenant_cache_salt`)."""
        self.pacer = BodyPacer(tenant_loop_share())
        self.max_model_len = max_model_len()
        """No conversation of a request may hold more messages (None: no bound)."""

    def is_operator(self, presented: bytes | None) -> bool:
        return self.operator_key is not None and self.operator_key.matches(presented)

    def allowed(self, scope: Scope) -> bool:
        """One key per model: the request carries the model's key (any route's check comes after)."""
        if is_open(scope):
            return True
        presented = presented_key(scope.get("headers") or [])
        return presented is not None and hmac.compare_digest(_digest(presented), self.key_digest or b"")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            if not is_canonical_target(scope):
                raise Refused(
                    400,
                    "The request path is not canonical: `/`-separated segments of letters, digits, `-`, "
                    "`.`, `_` and `~`, without `.` or `..` segments, empty segments or percent-encoding.",
                    "invalid_path",
                    close=True,  # its body is not read
                )
            await self.route(scope, receive, send)
        except Refused as refused:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": POLICY_VIOLATION})
            else:
                await refused.answer(send)

    async def route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if is_open(scope):
            await self.app(scope, receive, send)
            return
        presented = presented_key(scope.get("headers") or [])
        if self.is_operator(presented):
            await self.pass_on(scope, receive, send)
            return
        if self.tenant_keys is not None:
            await self.serve_tenant(scope, receive, send, presented)
            return
        if not self.allowed(scope):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": POLICY_VIOLATION})
                return
            body = json.dumps({"error": "Unauthorized"}).encode()
            await _respond(send, 401, body, challenge=True)
            return
        # The model's key: every served name, on the inference routes and the model list only.
        path, method = request_path(scope), scope.get("method", "GET")
        if scope["type"] == "websocket":
            if path not in WEBSOCKET_ROUTES:
                raise Refused(403, "This route needs the operator key.", "operator_route")
            await self.app(scope, receive, send)
            return
        if method in ("GET", "HEAD") and path == MODELS_PATH:
            await self.app(scope, receive, send)
            return
        if method != "POST" or path not in INFERENCE_ROUTES:
            raise Refused(403, "This route needs the operator key.", "operator_route")
        messages, body = await _read_body(scope, receive, self.max_body_bytes, self.max_json_values)
        if _is_json(scope, body):
            parse_json_body(body)
        await asyncio.sleep(0)
        await self.app(scope, _replay(messages, receive), send)

    async def pass_on(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The operator: every route, with the body limit and the JSON checks."""
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(scope, receive, self.max_body_bytes, self.max_json_values)
        if body and _is_json(scope, body):
            parse_json_body(body)
        await asyncio.sleep(0)
        await self.app(scope, _replay(messages, receive), send)

    async def serve_tenant(self, scope: Scope, receive: Receive, send: Send, presented: bytes | None) -> None:
        assert self.tenant_keys is not None
        tenants = self.tenant_keys.current()
        tenant = tenants.tenant_for(presented)
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
        path, method = request_path(scope), scope.get("method", "GET")
        if scope["type"] == "websocket":
            # A WebSocket names its model in messages this check does not read: only a tenant that
            # may use every name of this pod gets one.
            if path not in WEBSOCKET_ROUTES or not may_use_all:
                await send({"type": "websocket.close", "code": POLICY_VIOLATION})
                return
            await self.app(scope, receive, send)
            return
        if method in ("GET", "HEAD") and path == MODELS_PATH:
            await self.app(scope, receive, _listing_only(allowed, send))
            return
        if method != "POST" or path not in INFERENCE_ROUTES:
            raise Refused(403, "This route needs the operator key.", "operator_route")
        # A first gate before the body is read and parsed (issue 40): one sequence of the share is
        # taken, so a tenant past it costs the server nothing more, and its requests being read
        # count against it. Its other sequences are taken once the body says how many (issue 49).
        share = TakenShare(self.in_flight, tenant, tenants.in_flight_limits.get(tenant))
        if not share.take(1):
            raise share.refusal(close=True)  # its body is not read
        try:
            await self.check_and_serve(tenants, tenant, scope, receive, send, share)
        finally:
            share.give_back()

    async def check_and_serve(
        self, tenants: TenantSet, tenant: str, scope: Scope, receive: Receive, send: Send, share: TakenShare
    ) -> None:
        """A tenant's inference request within its share: the body's checks, then vLLM, each piece of
        the loop's work in the tenant's turn and charged to it (BodyPacer), refused or not."""
        messages, body = await _read_body(
            scope, receive, self.max_body_bytes, self.max_json_values, self.pacer, tenant
        )
        await self.pacer.turn(tenant)
        started, vllm_seconds = time.thread_time(), 0.0
        try:
            request = self.checked(tenants, share, scope, messages, body)
            vllm_seconds = request.vllm_seconds
        finally:
            # What the checks cost, refused or not; and vLLM's own work on the body before it begins
            # (the tenant's next piece waits for both).
            self.pacer.charge(tenant, CHECK_COST_FACTOR * (time.thread_time() - started) + vllm_seconds)
        # The loop answers what waits (probes, other tenants) before vLLM parses the body.
        await asyncio.sleep(0)
        await self.count(tenant, request.label, request.scope, _replay(request.messages, receive), send)

    def checked(
        self, tenants: TenantSet, share: TakenShare, scope: Scope, messages: list[Message], body: bytes
    ) -> CheckedRequest:
        """The parse and every check of a tenant's body that was read (no `await`: one turn of the
        tenant's): the request as vLLM gets it, or Refused."""
        allowed = tenants.allowed.get(share.tenant, frozenset())
        path = request_path(scope)
        payload: dict[str, Any] | None = None
        if not _is_json(scope, body):
            # A multipart upload (audio) names its model in a form field this check does not read.
            if not allowed >= set(tenants.served_names):
                raise Refused(
                    403,
                    "This request does not name its model in a JSON body, and this key may not use every "
                    "model served here.",
                    "model_not_allowed",
                )
            names: set[str] = set(tenants.served_names)
        else:
            payload = parse_json_body(body)
            if not isinstance(payload, dict):
                raise Refused(400, "The request body must be a JSON object.", "invalid_request")
            names = resolved_names(INFERENCE_ROUTES[path], payload, scope, tenants.served_names)
        for name in sorted(names):
            if name not in tenants.served_names:
                # vLLM would answer its own 404; answered here, nothing unknown reaches it.
                raise Refused(404, f"The model `{name}` does not exist.", "model_not_found")
            if name not in allowed:
                raise Refused(403, f"This key may not use the model `{name}`.", "model_not_allowed")
        longest, items = chat_items(path, payload)
        if self.max_model_len is not None and longest > self.max_model_len:
            raise Refused(
                400,
                f"A conversation of this request has {longest} messages, more than this model's context "
                f"of {self.max_model_len} tokens can hold (every message is at least one token).",
                "context_length_exceeded",
            )
        share.take(request_sequences(path, payload), whole=True)
        if tenants.isolated_prefix_cache and payload is not None and path in CACHE_SALTED_ROUTES:
            salt = tenant_cache_salt(self.salt_seed, share.tenant, payload.get(CACHE_SALT_FIELD))
            scope, messages = salted(scope, messages, body, payload, salt)
        label = min(names) if len(names) == 1 else "several"
        return CheckedRequest(scope, messages, label, VLLM_SECONDS_PER_CHAT_ITEM * items)

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


@dataclass(frozen=True)
class CheckedRequest:
    """A tenant's request that passed every check, as vLLM gets it (salted)."""

    scope: Scope
    messages: list[Message]
    label: str
    """The served name for the tenant's metrics ('several' when the request may reach more)."""
    vllm_seconds: float
    """vLLM's own loop work on it beyond its parse (VLLM_SECONDS_PER_CHAT_ITEM per chat item)."""


@dataclass
class TakenShare:
    """What one request holds of its tenant's share (`limit` sequences in flight over the pod; None:
    no limit): one sequence while its body is read, then all of its sequences until it is answered."""

    in_flight: ProcessInFlight | PodInFlight
    tenant: str
    limit: int | None
    taken: int = 0

    def take(self, sequences: int, *, whole: bool = False) -> bool:
        """Hold `sequences` in all (taking what is not held yet) if the share has room. With `whole`,
        a request that would not fit is refused: 400 past the whole share, else 429."""
        if self.limit is None or sequences <= self.taken:
            return True
        if whole and sequences > self.limit:
            raise Refused(
                400,
                f"This request runs {sequences} sequences at once (its prompts x `n`), more than this "
                f"key's share of {self.limit} in flight: send its prompts in smaller requests.",
                "too_many_sequences",
            )
        if not self.in_flight.take(self.tenant, sequences - self.taken, self.limit):
            if whole:
                raise self.refusal(close=False)
            return False
        self.taken = sequences
        return True

    def refusal(self, *, close: bool) -> Refused:
        return Refused(
            429,
            f"Too many sequences in flight for this key (at most {self.limit} per server, counting "
            "each prompt x `n`).",
            "rate_limit_exceeded",
            close=close,
            retry_after=RETRY_AFTER_SECONDS,
        )

    def give_back(self) -> None:
        if self.taken:
            self.in_flight.give(self.tenant, self.taken)
            self.taken = 0


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
    pod_salt_secret(state_dir())  # the shared folder is writable, and the pod's secret made once
