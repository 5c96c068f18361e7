"""API-key check for every route of the vLLM server except `/health` and `/metrics` (issue 15).

This file runs inside the upstream, unmodified `vllm/vllm-openai` image: the Deployment mounts it
from a ConfigMap (it holds code, never the key), puts its folder on PYTHONPATH and passes
`--middleware vllm_platform_auth.ApiKeyMiddleware`, which vLLM adds around its whole ASGI app.
vLLM's own check guards only the `/v1`, `/v2`, `/inference` and `/cohere` prefixes, so
`/invocations`, `/tokenize` and the admin routes answered anyone; this one denies by default, so a
route a future vLLM adds is guarded too.

The key is `VLLM_API_KEY`, which the pod reads from the Secret the Secrets Store CSI driver syncs
from the secret store. An empty or missing key stops the server at start-up: vLLM imports this
module while it builds its app, before it listens, and the import raises, so the process exits and
a pod without a key never serves (it restarts until the Secret holds a key).

Pure ASGI and standard library only: nothing here depends on vLLM's or Starlette's internals, and
streamed (SSE) responses pass through untouched, since only the request line and headers are read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_KEY_ENV = "VLLM_API_KEY"
OPEN_PATHS = frozenset({"/health", "/metrics", "/metrics/"})
"""Kubelet probes (`/health`) and Prometheus (`/metrics`) call without a key; nothing else may."""
POLICY_VIOLATION = 1008
"""WebSocket close code for a refused handshake (uvicorn answers it with HTTP 403)."""


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


def presented_key(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The bearer credential of the request's Authorization header, or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, bearer = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and bearer.strip():
                return bearer.strip()
            return None
    return None


# At import, so `vllm serve` exits while building its app rather than at the first request.
configured_key_digest()


class ApiKeyMiddleware:
    """Outermost ASGI middleware: a request without the right bearer key never reaches vLLM."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.key_digest = configured_key_digest()

    def allowed(self, scope: Scope) -> bool:
        root_path = scope.get("root_path", "")
        path = scope.get("path", "")
        path = path[len(root_path) :] if root_path and path.startswith(root_path) else path
        if path in OPEN_PATHS and scope["type"] == "http" and scope.get("method") in ("GET", "HEAD"):
            return True
        presented = presented_key(list(scope.get("headers") or []))
        return presented is not None and hmac.compare_digest(_digest(presented), self.key_digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": POLICY_VIOLATION})
            return
        body = json.dumps({"error": "Unauthorized"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="vllm"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
