"""The request bodies one tenant floods with in bench/tenant_stall/ (no imports of the repository's
packages: check_cost.py runs in the vLLM venv)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

SERVED_NAME = "tiny"
FORBIDDEN_NAME = "tiny-forbidden"
"""The bench server's second served name, which the flooding tenant may not use (its bodies get 403
after the middleware parsed them: issue 49's probe)."""
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
PARALLEL_CONNECTIONS = 8
"""Issue 49's probe: 8 connections of one tenant, within a share of 8."""
CHAT_MESSAGES_PROBED = 37_000
"""Issue 49's probe: a chat of about 37,000 one-token messages."""


@dataclass(frozen=True)
class FloodBody:
    """A body, the route it is sent to, and on how many connections at once (each back to back)."""

    make: Callable[[], bytes]
    path: str = COMPLETIONS
    connections: int = 1


def bodies(max_bytes: int, max_values: int, max_model_len: int) -> dict[str, FloodBody]:
    """Every body at these limits (the body limit, the JSON value bound and the context the
    middleware bounds a conversation by)."""

    def head(model: str = SERVED_NAME) -> bytes:
        return f'{{"model": "{model}", "max_tokens": 1, "prompt": '.encode()

    def filled(unit: bytes, count: int, end: bytes, model: str = SERVED_NAME) -> bytes:
        return head(model) + b"[" + unit * count + end + b"]}"

    def chat(messages: int) -> bytes:
        message = {"role": "user", "content": "a"}
        return json.dumps({"model": SERVED_NAME, "max_tokens": 1, "messages": [message] * messages}).encode()

    def content_parts(parts: int) -> bytes:
        content = [{"type": "text", "text": "a"}] * parts
        message = {"role": "user", "content": content}
        return json.dumps({"model": SERVED_NAME, "max_tokens": 1, "messages": [message]}).encode()

    room = max_bytes - len(head()) - 16
    deep = b"[" * 62 + b"0" + b"]" * 62  # with the body and `prompt`'s list: 64 levels
    huge = b"9" * 4299  # just under Python's own 4,300-digit limit: the costliest integer it parses
    wide = b"9" * 64  # the most digits the middleware admits (MAX_JSON_NUMBER_DIGITS)
    every = {
        "small_body_control": FloodBody(lambda: filled(b"{},", 1, b"{}")),
        "issue_empty_objects_16mib": FloodBody(lambda: filled(b"{},", room // 3, b"{}")),
        # An empty object counts twice (a value, and a container opened): max_values / 2 of them.
        "empty_objects_under_value_limit": FloodBody(lambda: filled(b"{},", max_values // 2 - 16, b"{}")),
        "token_ids_under_value_limit": FloodBody(lambda: filled(b"1234,", max_values - 16, b"1")),
        "prompt_string_16mib": FloodBody(lambda: head() + json.dumps("word, " * (room // 6)).encode() + b"}"),
        # Within the body limit since issue 49: 109 bytes over it before, it got a 413 for its declared
        # length, before any scan.
        "nesting_64_deep_repeated": FloodBody(
            lambda: filled(deep + b",", (room - len(deep)) // (len(deep) + 1), deep)
        ),
        # Issue 49: 16 MiB of huge integers naming a model the tenant may not use (0.39 s of parse,
        # then 403), and the largest such body the middleware still parses.
        "huge_integers_forbidden_model": FloodBody(
            lambda: filled(huge + b",", room // (len(huge) + 1) - 1, huge, FORBIDDEN_NAME)
        ),
        "integers_64_digits_forbidden_model": FloodBody(
            lambda: filled(wide + b",", max_values - 16, wide, FORBIDDEN_NAME)
        ),
        # Issue 49: vLLM validates and renders each message (or content part): the probe's chat,
        # beyond the context, and the largest the middleware passes on (one message per token).
        "chat_37k_messages": FloodBody(lambda: chat(CHAT_MESSAGES_PROBED), CHAT),
        "chat_messages_at_context_bound": FloodBody(lambda: chat(max_model_len), CHAT),
        # A part counts three values (its object, its second member, the comma before the next).
        "chat_content_parts_under_value_limit": FloodBody(lambda: content_parts(max_values // 3 - 64), CHAT),
    }
    # Issue 49: one tenant's bodies on parallel connections, scanned and parsed side by side.
    for name in (
        "integers_64_digits_forbidden_model",
        "chat_messages_at_context_bound",
        "prompt_string_16mib",
    ):
        single = every[name]
        every[f"{name}_{PARALLEL_CONNECTIONS}_connections"] = FloodBody(
            single.make, single.path, PARALLEL_CONNECTIONS
        )
    return every
