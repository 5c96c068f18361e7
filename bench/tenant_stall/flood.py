"""One tenant sending one body back to back, on one connection or several at once, for
bench/tenant_stall/measure.py and tests/e2e/test_tenants.py (its own process, so that its sending can
run at a lower priority; httpx only, so that it starts at once):

    python -m bench.tenant_stall.flood BASE_URL KEY BODY_FILE [--path ROUTE] [--connections N] [--out FILE]

Prints a line once the first answer is in (the flood is on), then, on SIGTERM or after MAX_REQUESTS
in all, each answer's status and seconds as one JSON line (to FILE with --out: 10,000 answers are
about 250 KB, more than a pipe holds while the reader is still waiting out its phase).
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path

import httpx

MAX_REQUESTS = 10_000
TIMEOUT_SECONDS = 120


def flood(
    base_url: str,
    key: str,
    body_file: Path,
    path: str = "/v1/completions",
    connections: int = 1,
    out: Path | None = None,
) -> None:
    body = body_file.read_bytes()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    lock = threading.Lock()
    statuses: list[str] = []
    seconds: list[float] = []
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def connection() -> None:
        # One client per thread: its own keep-alive connection, as a tenant's parallel clients have.
        with httpx.Client(base_url=base_url, timeout=TIMEOUT_SECONDS) as client:
            while not stopped.is_set():
                started = time.perf_counter()
                try:
                    status = str(client.post(path, content=body, headers=headers).status_code)
                except httpx.HTTPError as error:
                    status = type(error).__name__
                with lock:
                    statuses.append(status)
                    seconds.append(time.perf_counter() - started)
                    if len(statuses) == 1:
                        print(json.dumps({"first": status}), flush=True)
                    if len(statuses) >= MAX_REQUESTS:
                        stopped.set()

    threads = [threading.Thread(target=connection, daemon=True) for _ in range(connections)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):  # the main thread takes the SIGTERM
        for thread in threads:
            thread.join(timeout=0.2)
    result = json.dumps({"statuses": statuses, "seconds": seconds})
    if out is None:
        print(result, flush=True)
    else:
        out.write_text(result + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("key")
    parser.add_argument("body_file", type=Path)
    parser.add_argument("--path", default="/v1/completions")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    flood(args.base_url, args.key, args.body_file, args.path, args.connections, args.out)


if __name__ == "__main__":
    main()
