"""The API-key middleware module (components/pod_files/vllm_platform_auth.py) loaded for a test."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from components import server_auth


def load_auth_module(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    """A fresh copy of the middleware under `name`, imported as vLLM imports it: the import reads the
    environment (set it first) and raises without a key. Registered in sys.modules for the test only
    (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, server_auth.MODULE_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


WORST_BODY_BYTES = 16 * 1024 * 1024
"""Issue 40's body: as large as `security.max_request_body_mib`'s default allows."""


def empty_objects_body(size: int, model: str) -> bytes:
    """The probe's worst body (issue 40): a completion whose prompt is ~size/3 empty objects."""
    head, tail = f'{{"model": "{model}", "prompt": ['.encode(), b"{}]}"
    return head + b"{}," * ((size - len(head) - len(tail)) // 3) + tail


def asgi_scope_for_target(
    method: str, target: str, headers: list[tuple[bytes, bytes]] | None = None
) -> dict[str, object]:
    """The ASGI scope uvicorn builds from a request line's target: `raw_path` the bytes sent up to the
    query, `path` those percent-decoded (as uvicorn decodes it), the query apart."""
    import urllib.parse

    raw, _, query = target.encode("latin-1").partition(b"?")
    return {
        "type": "http",
        "method": method,
        "path": urllib.parse.unquote(raw.decode("latin-1")),
        "raw_path": raw,
        "query_string": query,
        "root_path": "",
        "headers": headers or [],
    }
