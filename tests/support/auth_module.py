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
