"""The request bodies one tenant floods with in bench/tenant_stall/ (no imports of the repository's
packages: check_cost.py runs in the vLLM venv)."""

from __future__ import annotations

import json
from collections.abc import Callable

SERVED_NAME = "tiny"


def bodies(max_bytes: int, max_values: int) -> dict[str, Callable[[], bytes]]:
    head = f'{{"model": "{SERVED_NAME}", "max_tokens": 1, "prompt": '.encode()

    def filled(unit: bytes, count: int, end: bytes) -> bytes:
        return head + b"[" + unit * count + end + b"]}"

    room = max_bytes - len(head) - 16
    deep = b"[" * 62 + b"0" + b"]" * 62  # with the body and `prompt`'s list: 64 levels
    return {
        "small_body_control": lambda: filled(b"{},", 1, b"{}"),
        "issue_empty_objects_16mib": lambda: filled(b"{},", room // 3, b"{}"),
        # An empty object counts twice (a value, and a container opened): max_values / 2 of them.
        "empty_objects_under_value_limit": lambda: filled(b"{},", max_values // 2 - 16, b"{}"),
        "token_ids_under_value_limit": lambda: filled(b"1234,", max_values - 16, b"1"),
        "prompt_string_16mib": lambda: head + json.dumps("word, " * (room // 6)).encode() + b"}",
        "nesting_64_deep_repeated": lambda: filled(deep + b",", room // (len(deep) + 1), deep),
    }
