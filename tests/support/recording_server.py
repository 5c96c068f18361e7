"""A loopback HTTP server that answers 200 `{}` to every request and records (method, target) as the
request line wrote it: what a proxy under test forwarded, and how. Stdlib only; stop it with `stop`."""

from __future__ import annotations

import http.server
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RecordingServer:
    server: http.server.ThreadingHTTPServer
    seen: list[tuple[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_recording_server() -> RecordingServer:
    recording: RecordingServer

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            recording.seen.append((self.command, self.requestline.split(" ")[1]))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    recording = RecordingServer(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler))
    threading.Thread(target=recording.server.serve_forever, daemon=True).start()
    return recording
