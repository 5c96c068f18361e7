"""The Hugging Face path, offline: a small local HTTP server speaking the two hub endpoints we use
(tree listing with pagination, `resolve` with Range and a redirect to a 'CDN')."""

from __future__ import annotations

import hashlib
import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import MIB, preload_args, run_cli

TOKEN = "hf_test_token"
REPO = "acme/tiny-llm"
REVISION = "0123abcd"


class FakeHub:
    def __init__(self) -> None:
        weights = random.Random(7).randbytes(3 * MIB + 17)
        self.files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": weights}
        self.lfs = {"model.safetensors"}
        self.corrupt: set[str] = set()
        self.cdn_saw_authorization = False

    def tree(self) -> list[dict]:
        entries = [{"type": "directory", "path": "sub", "oid": "0" * 40, "size": 0}]
        for path, data in self.files.items():
            blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
            entry = {"type": "file", "path": path, "size": len(data), "oid": blob}
            if path in self.lfs:
                entry["lfs"] = {
                    "oid": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 130,
                }
            entries.append(entry)
        return entries


@pytest.fixture
def hub() -> Iterator[tuple[FakeHub, str]]:
    state = FakeHub()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.startswith("/cdn/"):
                self._serve_file(self.path.removeprefix("/cdn/"))
                return
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._send(401)
                return
            tree_prefix = f"/api/models/{REPO}/tree/{REVISION}?recursive=true"
            if self.path == tree_prefix:  # first page, points to the second (pagination)
                entries = state.tree()
                self._send(
                    200,
                    json.dumps(entries[:2]).encode(),
                    {"Link": f'<http://{self.headers["Host"]}{tree_prefix}&cursor=2>; rel="next"'},
                )
            elif self.path == f"{tree_prefix}&cursor=2":
                self._send(200, json.dumps(state.tree()[2:]).encode())
            elif self.path.startswith(f"/{REPO}/resolve/{REVISION}/"):
                path = self.path.removeprefix(f"/{REPO}/resolve/{REVISION}/")
                if path in state.lfs:  # LFS files live on the CDN, like the real hub
                    self._send(302, headers={"Location": f"/cdn/{path}"})
                else:
                    self._serve_file(path)
            else:
                self._send(404)

        def _serve_file(self, path: str) -> None:
            if self.path.startswith("/cdn/") and self.headers.get("Authorization"):
                state.cdn_saw_authorization = True
            data = state.files[path]
            if path in state.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 1])
            first, last = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
            self._send(206, data[first : last + 1], {"Content-Range": f"bytes {first}-{last}/{len(data)}"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _hf_args(shared: Path, endpoint: str, token_file: Path) -> list[str]:
    return [
        *preload_args(f"hf://{REPO}", shared, revision=REVISION),
        "--hf-token-file",
        str(token_file),
        "--endpoint-url",
        endpoint,
    ]


def test_hf_repo_downloads_with_token_and_checks_lfs_sha256_and_git_blob_ids(hub, roots, aws_env, tmp_path):
    state, endpoint = hub
    shared, _local = roots
    token_file = tmp_path / "hf-token"
    token_file.write_text(TOKEN + "\n")

    run = run_cli(_hf_args(shared, endpoint, token_file), aws_env)

    assert run.returncode == 0, run.stderr
    directory = shared / "llama" / REVISION
    for path, data in state.files.items():
        assert (directory / path).read_bytes() == data
    assert all(event["source_digest_checked"] for event in run.named("file_done"))
    assert not state.cdn_saw_authorization, "the token must not follow the redirect to the CDN"


def test_hf_wrong_token_exits_4(hub, roots, aws_env, tmp_path):
    _state, endpoint = hub
    shared, _local = roots
    token_file = tmp_path / "hf-token"
    token_file.write_text("hf_wrong")

    run = run_cli(_hf_args(shared, endpoint, token_file), aws_env)

    assert run.returncode == 4, run.stderr
    assert "HTTP 401" in run.error_message


def test_hf_content_not_matching_its_lfs_sha256_exits_8_with_nothing_complete(hub, roots, aws_env, tmp_path):
    state, endpoint = hub
    state.corrupt.add("model.safetensors")
    shared, _local = roots
    token_file = tmp_path / "hf-token"
    token_file.write_text(TOKEN)

    run = run_cli(_hf_args(shared, endpoint, token_file), aws_env)

    assert run.returncode == 8, run.stderr
    assert "model.safetensors failed verification twice" in run.error_message
    assert len(run.named("file_refetch")) == 1, "fetched once more before giving up"
    assert not (shared / "llama" / REVISION / ".model-cache-complete.json").exists()
    assert not (shared / "llama" / REVISION / "model.safetensors").exists()
