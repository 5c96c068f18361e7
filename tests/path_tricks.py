"""A corpus of request-target tricks (issue 49): ways a path may be written so that something behind
the first hop reads it as another path, aimed at vllm-router's worker API and the pod's admin routes.

Written by hand, with the verdict each target must get, so that every hop that checks paths (the
router pod's door, the wake gate, the registrar's models server, the vLLM pod's middleware) is held
to the same rule rather than to its own implementation of it:

- a target is *canonical* when it is origin-form (starts with `/`), its path holds only unreserved
  characters (RFC 3986: letters, digits, `-`, `.`, `_`, `~`) and `/`, has no empty segment (`//`, or
  a trailing `/`), no `.` or `..` segment, and no percent-encoding, `;`, `\\`, `#` or control
  character; at the front door, where no route takes one, no query either;
- every NON_CANONICAL target is answered 400 without being forwarded, everywhere; WITH_QUERY targets
  at the door (behind it a query is not routed, so only the path is judged);
- every CANONICAL_UNKNOWN target is canonical but not a route the door forwards: 404, not forwarded.

The worker API of vllm-router 0.1.17 (its routes in `vllm-router`'s server: `/workers`,
`/workers/{url}`, `/add_worker`, `/remove_worker`, `/list_workers`, `/flush_cache`, `/get_loads`,
`/get_server_info`, `/get_model_info`) and the routes a worker API answers with worker data are the
targets; a trap URL stands for "any URL an attacker adds as a worker".
"""

from __future__ import annotations

import itertools

TRAP_WORKER = "http://127.0.0.1:9/trap"
"""The worker an attacker would add (port 9, discard: nothing listens there in a test)."""

WORKER_API_TARGETS = (
    "workers",
    f"add_worker?url={TRAP_WORKER}",
    f"remove_worker?url={TRAP_WORKER}",
    "list_workers",
    "flush_cache",
    "get_loads",
    "get_server_info",
    "get_model_info",
)

# Dot-segments in every encoding an HTTP stack in the path might decode: plain, percent-encoded in
# either case, half-encoded, double-encoded, with a matrix parameter (`..;`, as some servers strip),
# with encoded or backward slashes.
TRAVERSALS = (
    "..",
    "%2e%2e",
    "%2E%2E",
    ".%2e",
    "%2e.",
    "%252e%252e",
    "..;",
    "..%00",
    "..%2f..",
    "%2e%2e%2f%2e%2e",
    "..%5c..",
    "..\\..",
)

# Where under the routed prefix the traversal starts.
PREFIXES = ("/v1/", "/v1/chat/", "/v1/completions/", "/v1/models/")


def _traversals() -> list[str]:
    targets = []
    for prefix, traversal, target in itertools.product(PREFIXES, TRAVERSALS, WORKER_API_TARGETS):
        depth = prefix.count("/") - 1
        climb = "/".join([traversal] * depth)
        targets.append(f"{prefix}{climb}/{target}")
    return targets


NON_CANONICAL = (
    *_traversals(),
    # single dots, doubled and trailing slashes, and the empty segment
    "/./workers",
    "/v1/./../workers",
    "/v1/completions/.",
    "/v1//completions",
    "//v1/completions",
    "/v1/completions/",
    "//workers",
    "/v1/completions//..//..//workers",
    # matrix parameters and fragments after a route
    "/v1/completions;",
    "/v1/completions;/../../workers",
    "/v1/chat/completions#/../../workers",
    # percent-encoding of ordinary characters and of the separator
    "/v1/%63ompletions",
    "/v1%2fcompletions",
    "/v1%2Fcompletions%2F..%2F..%2Fworkers",
    "/v1/completions%3f/../../workers",
    "/v1/completions%23/../../workers",
    "/v1/completions%00",
    # backslashes and other characters no route holds
    "/v1\\completions",
    "/v1/completions\\..\\..\\workers",
    "/v1/completions\t",
    "/v1/completions%20",
    # not origin-form
    "*",
    "v1/completions",
)

WITH_QUERY = (
    # A canonical path with a query: the door refuses it (400: no route it forwards takes a query);
    # behind it, where only the path is routed, the path is judged alone.
    "/v1/completions?",
    "/v1/completions?/../../workers",
    "/v1/completions?url=/workers",
    "/v1/models?x=../../workers",
)

CANONICAL_UNKNOWN = (
    # canonical paths that are not inference routes: the worker API itself, and its look-alikes
    "/workers",
    "/add_worker",
    "/remove_worker",
    "/list_workers",
    "/flush_cache",
    "/get_loads",
    "/get_server_info",
    "/get_model_info",
    "/v1/workers",
    "/v1/add_worker",
    "/V1/completions",
    "/v1/Completions",
    "/v1/completions/workers",
    "/v1/load_lora_adapter",
    "/health/workers",
)

ABSOLUTE_FORM_WORKER_API = (
    # Absolute-form (RFC 9112 3.2.2): a server takes the path and ignores the authority, so these are
    # `/workers` and `/add_worker` to whoever answers; a door must not reach a worker API with them.
    "http://127.0.0.1:8100/workers",
    f"http://127.0.0.1:8100/add_worker?url={TRAP_WORKER}",
    "http://localhost/v1/../workers",
)

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD")
