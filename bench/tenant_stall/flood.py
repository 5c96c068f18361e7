"""One tenant sending one body back to back on one connection, for bench/tenant_stall/measure.py and
tests/e2e/test_tenants.py (its own process, so that its sending can run at a lower priority; httpx
only, so that it starts at once):

    python -m bench.tenant_stall.flood BASE_URL KEY BODY_FILE

Prints a line once the first answer is in (the flood is on), then, on SIGTERM or after
MAX_REQUESTS, each answer's status and seconds as one JSON line.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

import httpx

MAX_REQUESTS = 10_000
TIMEOUT_SECONDS = 120


def flood(base_url: str, key: str, body_file: Path) -> None:
    body = body_file.read_bytes()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    statuses: list[str] = []
    seconds: list[float] = []
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_SECONDS) as client:
        for _ in range(MAX_REQUESTS):
            started = time.perf_counter()
            try:
                statuses.append(
                    str(client.post("/v1/completions", content=body, headers=headers).status_code)
                )
            except httpx.HTTPError as error:
                statuses.append(type(error).__name__)
            seconds.append(time.perf_counter() - started)
            if len(statuses) == 1:
                print(json.dumps({"first": statuses[0]}), flush=True)
            if stopped.is_set():
                break
    print(json.dumps({"statuses": statuses, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    flood(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
