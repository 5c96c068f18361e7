"""Where the Go programs tools/build.sh built are, and why one is missing."""

from __future__ import annotations

import os
from pathlib import Path

from domain.versions import GO_TOOLS

TOOLS_CACHE_ENV = "VLLM_PLATFORM_TOOLS_CACHE"


def tools_cache() -> Path:
    """tools/build.sh's cache: $VLLM_PLATFORM_TOOLS_CACHE, else ~/.cache/vllm-platform/tools."""
    configured = os.environ.get(TOOLS_CACHE_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base).expanduser() / "vllm-platform" / "tools"


def program(name: str) -> Path | None:
    path = tools_cache() / "bin" / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def missing_reason(names: list[str]) -> str | None:
    """None when every program is built; else which are missing and the end of their build log."""
    missing = [name for name in names if program(name) is None]
    if not missing:
        return None
    reasons = []
    for name in missing:
        wrapper = next((pin.wrapper for pin in GO_TOOLS if name in pin.programs), name)
        log = tools_cache() / "logs" / f"{wrapper}.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.is_file() else []
        detail = " | ".join(tail) if tail else "never built: run `bash tools/build.sh`"
        reasons.append(f"{name} (tools/{wrapper}): {detail}")
    return "not built: " + "; ".join(reasons)
