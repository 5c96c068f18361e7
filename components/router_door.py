"""The router pod's front door: nginx on the pod's only served port, forwarding nothing but the
OpenAI routes it lists, in canonical form (issue 49; docs/security.md, "The router's front door").

Why a door (finding 17): vllm-router 0.1.17 in multi-model mode forwards a path it has no route for,
with its method and body, to one of its workers, and the URL it forwards is normalised on the way,
so `/v1/%2e%2e/workers` reached a model router as `/workers`: its worker-management API, which
checks no key. No option of 0.1.17 (the newest release on PyPI) turns that API off, guards it with
a key or moves it to another listener. So nothing outside the pod may reach a vllm-router at all:

    load balancer ──► door :8000 (this container, nginx)   400: a non-canonical target
                        │                                    404/405: no such route (method)
                        │                                    413: a body past the stack's limit
                        ├─ POST <an inference route under /v1/>   ──► front 127.0.0.1:8001
                        ├─ GET/HEAD /v1/models, /v1/models/<id>   ──► registrar 127.0.0.1:8090
                        └─ GET/HEAD /readiness (the ALB's and kubelet's health check) ──► front

The rule is an allow-list of whole request targets, compared byte for byte with what the client
sent (`$request_uri`, before nginx decodes or merges anything), not a list of bad patterns: a
target is forwarded only when it is one of the listed routes as written, and anything else is
answered here. The front, every model router and every wake gate listen on 127.0.0.1 only (their
probes run inside the container), so the door is the only way in; the registrar, on the same
loopback, is the only writer of their worker lists.

Why nginx (Debian's `nginx-light`, pinned in domain/versions.py and installed into the router image
by apt, which checks the archive's signatures): a well-kept proxy that streams SSE unbuffered,
holds no request body in memory past a small buffer (the rest goes to a file on the pod's
`door-tmp` volume, so the front never takes more than one limit-sized body from the door at a
time per connection, and an oversized body is refused from its Content-Length or as it arrives),
and answers its own refusals without a hop. Everything it needs is in the rendered config below.
"""

from __future__ import annotations

import json
import re
from typing import Any

from components.server_auth import inference_routes, max_body_bytes
from components.vllm_pod import container_security_context
from domain.config.platform import PlatformConfig, RouterConfig, SecurityConfig
from domain.versions import VLLM_ROUTER_IMAGE

DOOR_CONTAINER = "door"
DOOR_PORT = 8000
"""The pod's served port (Service port `http`, the ALB's target): the door listens here."""
FRONT_PORT = 8001
"""The front vllm-router, on 127.0.0.1 only, behind the door."""
DOOR_CONFIG_FILE = "door.conf"
DOOR_TMP_VOLUME = "door-tmp"
DOOR_TMP_PATH = "/tmp/door"
"""nginx's pid file and request-body files: an emptyDir (the root filesystem is read-only)."""
BODY_BUFFER_BYTES = 256 * 1024
"""A request body up to this size stays in memory; a larger one goes to a file on `door-tmp`."""
CONCURRENT_FULL_BODIES = 64
"""How many bodies at the stack's limit the door's volume holds at once (its sizeLimit); past that
the kubelet evicts the pod, so the WAF's rate rules (docs/aws.md) must bound a flood before it."""
WORKER_CONNECTIONS = 4096
PUBLIC_PREFIX = "/v1/"
MODELS_PATH = "/v1/models"
READINESS_PATH = "/readiness"
MODELS_PORT = 8090
"""The registrar's models server (components/router.py MODELS_PORT)."""

CANONICAL_TARGET = r"^(/(?!\.\.?(/|$))[A-Za-z0-9._~-]+)+$"
"""One or more segments of unreserved characters (RFC 3986), none `.` or `..`: no empty segment, no
trailing slash, no percent-encoding, `;`, `\\`, query or fragment (tests/path_tricks.py)."""
MODEL_ID_TARGET = r"^/v1/models(/(?!\.\.?(/|$))[A-Za-z0-9._~-]+)+$"
"""`GET /v1/models/<id>`: a served name may hold `/` (`org/model`), each part canonical."""


def public_inference_routes() -> list[str]:
    """The pod middleware's inference routes under /v1/: what the load balancer ever sent to the front."""
    return sorted(route for route in inference_routes() if route.startswith(PUBLIC_PREFIX))


def _exactly(path: str) -> str:
    """`path` as a PCRE matching only itself (routes hold letters, digits, `/`, `_`, `-`, `.`)."""
    return re.escape(path).replace("\\/", "/")


def _error(status: int, message: str, code: str) -> str:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    # nginx's `return` takes the body as a quoted string: JSON needs its own quotes kept.
    return f"return {status} '{json.dumps(body)}';"


def door_config(config: PlatformConfig) -> str:
    """nginx.conf of the door: rendered into the router's ConfigMap, read by `nginx -c`."""
    router = config.router
    limit = max_body_bytes(config)
    limit_mib = limit // (1024 * 1024)
    # Regular expressions (`~`), never nginx's plain map strings, which it compares ignoring case.
    public = public_inference_routes()
    routes = "\n".join(f'        "~^POST {_exactly(route)}$" front;' for route in public)
    known = "\n".join(f'        "~^{_exactly(route)}$" 1;' for route in public)
    timeout = router.request_timeout_seconds
    return f"""# The router pod's front door (components/router_door.py, docs/security.md): rendered.
worker_processes 2;
pid {DOOR_TMP_PATH}/nginx.pid;
error_log stderr warn;
worker_shutdown_timeout {timeout}s;
events {{
    worker_connections {WORKER_CONNECTIONS};
}}
http {{
    access_log off;
    server_tokens off;
    merge_slashes off;
    default_type application/json;
    client_max_body_size {limit};
    client_body_buffer_size {BODY_BUFFER_BYTES};
    client_body_timeout 60s;
    client_header_timeout 30s;
    client_body_temp_path {DOOR_TMP_PATH}/body;
    proxy_temp_path {DOOR_TMP_PATH}/proxy;
    fastcgi_temp_path {DOOR_TMP_PATH}/fastcgi;
    uwsgi_temp_path {DOOR_TMP_PATH}/uwsgi;
    scgi_temp_path {DOOR_TMP_PATH}/scgi;

    # Whole request targets, byte for byte as the client sent them (never nginx's decoded $uri).
    map $request_uri $door_canonical {{
        "~{CANONICAL_TARGET}" 1;
        default 0;
    }}
    map "$request_method $request_uri" $door_upstream {{
{routes}
        "~^(GET|HEAD) {_exactly(MODELS_PATH)}$" models;
        "~^(GET|HEAD) {MODEL_ID_TARGET[1:]}" models;
        "~^(GET|HEAD) {_exactly(READINESS_PATH)}$" front;
        default "";
    }}
    map $request_uri $door_route_known {{
{known}
        "~^{_exactly(MODELS_PATH)}$" 1;
        "~{MODEL_ID_TARGET}" 1;
        "~^{_exactly(READINESS_PATH)}$" 1;
        default 0;
    }}

    upstream front {{
        server 127.0.0.1:{FRONT_PORT};
        keepalive 64;
    }}
    upstream models {{
        server 127.0.0.1:{MODELS_PORT};
        keepalive 8;
    }}

    server {{
        listen {DOOR_PORT} default_server;
        # A body past the limit in OpenAI's shape. (A request line nginx cannot parse at all gets
        # nginx's own 400 page: an error page needs a parsed URI.)
        error_page 413 @too_large;

        location / {{
            if ($door_canonical = 0) {{
                {_error(400, "The request path is not in canonical form.", "invalid_path")}
            }}
            if ($door_route_known = 0) {{
                {_error(404, "No such route.", "not_found")}
            }}
            if ($door_upstream = "") {{
                {_error(405, "Method not allowed on this route.", "method_not_allowed")}
            }}
            # No URI part: the target goes on exactly as the client sent it (checked above).
            proxy_pass http://$door_upstream$request_uri;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            # SSE: each event goes on as it comes; the body is read whole first (to {DOOR_TMP_PATH}/body).
            proxy_buffering off;
            proxy_request_buffering on;
            proxy_read_timeout {timeout}s;
            proxy_send_timeout 60s;
            proxy_connect_timeout 5s;
        }}
        location @too_large {{
            {_error(413, f"The request body is larger than {limit_mib} MiB.", "request_too_large")}
        }}
    }}
}}
"""


def loopback_liveness(port: int, path: str = "/liveness") -> dict[str, Any]:
    """A liveness probe for a server that listens on 127.0.0.1 only: the kubelet's httpGet comes to
    the pod IP, so the probe runs in the container (the router image's Python)."""
    check = f"import urllib.request as r; r.urlopen('http://127.0.0.1:{port}{path}', timeout=2)"
    return {
        "exec": {"command": ["python", "-c", check]},
        "periodSeconds": 10,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }


def door_container(router: RouterConfig, config_dir: str, config_volume: str) -> dict[str, Any]:
    """nginx, as the router image's user; drains like the front: the load balancer deregisters the
    pod during preStop's sleep, then a graceful quit lets every stream in flight end."""
    conf = f"{config_dir}/{DOOR_CONFIG_FILE}"
    drain = router.drain_seconds
    return {
        "name": DOOR_CONTAINER,
        "image": VLLM_ROUTER_IMAGE.reference,
        "imagePullPolicy": "IfNotPresent",
        "command": ["nginx", "-e", "stderr", "-c", conf, "-g", "daemon off;"],
        "ports": [{"name": "http", "containerPort": DOOR_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"port": "http", "path": READINESS_PATH},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "timeoutSeconds": 3},
        # Kubernetes stops a container with SIGTERM, nginx's fast shutdown: preStop quits it gracefully
        # (SIGQUIT: stop accepting, finish every open stream, bounded by worker_shutdown_timeout).
        "lifecycle": {
            "preStop": {
                "exec": {
                    "command": [
                        "/bin/sh",
                        "-c",
                        f"sleep {drain}; nginx -e stderr -c {conf} -s quit; "
                        f"while [ -e {DOOR_TMP_PATH}/nginx.pid ]; do sleep 1; done",
                    ]
                }
            }
        },
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": container_security_context(read_only_root_filesystem=True),
        "volumeMounts": [
            {"name": config_volume, "mountPath": config_dir, "readOnly": True},
            {"name": DOOR_TMP_VOLUME, "mountPath": DOOR_TMP_PATH},
        ],
    }


def door_tmp_volume(security: SecurityConfig) -> dict[str, Any]:
    size_mib = CONCURRENT_FULL_BODIES * security.max_request_body_mib
    return {"name": DOOR_TMP_VOLUME, "emptyDir": {"sizeLimit": f"{size_mib}Mi"}}
