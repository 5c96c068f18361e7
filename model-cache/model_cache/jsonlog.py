"""Structured logs: one JSON object per line on stderr, so stdout carries only the result path."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

_write_lock = threading.Lock()


def log(event: str, level: str = "info", **fields: Any) -> None:
    record = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z",
        "level": level,
        "event": event,
        **fields,
    }
    line = json.dumps(record, separators=(",", ":"), default=str)
    with _write_lock:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
