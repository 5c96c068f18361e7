"""Hugging Face Hub as a source: hf://org/repo + revision, over plain HTTPS (no huggingface_hub).

Only two endpoints are used: the tree listing (sizes, git blob ids, LFS sha256) and `resolve` with
a Range header. The token is read from a file mounted from the secret store and is never sent to
the CDN a `resolve` redirects to. HF_ENDPOINT overrides the hub URL, as in huggingface_hub.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlparse

from model_cache.errors import (
    AccessDenied,
    IntegrityError,
    PreloadError,
    SourceNotFound,
    SourceTimeout,
    TransientSourceError,
    UsageError,
)
from model_cache.layout import safe_relative_path
from model_cache.remote import READ_PIECE_BYTES, RemoteFile

DEFAULT_ENDPOINT = "https://huggingface.co"
_NEXT_LINK = re.compile(r'<([^>]+)>;\s*rel="next"')


def parse_hf_uri(uri: str) -> str:
    parsed = urlparse(uri)
    repo = f"{parsed.netloc}{parsed.path}".strip("/")
    if parsed.scheme != "hf" or repo.count("/") != 1:
        raise UsageError(f"--source {uri!r} is not an hf://org/repo URI")
    return repo


def read_token(token_file: Path | None) -> str | None:
    if token_file is None:
        return None
    try:
        token = token_file.read_text().strip()
    except OSError as error:
        raise UsageError(f"--hf-token-file {token_file} cannot be read: {error.strerror}") from error
    return token or None


class HuggingFaceSource:
    def __init__(
        self, uri: str, revision: str, *, token: str | None, read_timeout_seconds: float, endpoint: str | None
    ) -> None:
        self.repo = parse_hf_uri(uri)
        self.revision = revision
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.uri = f"hf://{self.repo}@{revision}"
        self._token = token
        self._timeout = read_timeout_seconds

    def _request(self, url: str, headers: dict[str, str] | None = None) -> urllib.request.Request:
        request = urllib.request.Request(url, headers=headers or {})
        if self._token:
            # Unredirected: resolve answers with a redirect to a CDN that must not see the token.
            request.add_unredirected_header("Authorization", f"Bearer {self._token}")
        return request

    def _open(self, request: urllib.request.Request, what: str):  # type: ignore[no-untyped-def]
        try:
            return urllib.request.urlopen(request, timeout=self._timeout)
        except urllib.error.HTTPError as error:
            if error.code in (401, 403):
                raise AccessDenied(f"access denied: {what}: HTTP {error.code}") from error
            if error.code == 404:
                raise SourceNotFound(f"not found: {what}: HTTP 404") from error
            if error.code == 429 or error.code >= 500:
                failure = SourceTimeout(f"source kept failing: {what}: HTTP {error.code}")
                raise TransientSourceError(failure) from error
            raise PreloadError(f"{what}: HTTP {error.code}") from error
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            failure = SourceTimeout(f"timeout or connection failure on {what}: {error}")
            raise TransientSourceError(failure) from error

    def list_files(self) -> list[RemoteFile]:
        url: str | None = (
            f"{self.endpoint}/api/models/{self.repo}/tree/{quote(self.revision, safe='')}?recursive=true"
        )
        files: list[RemoteFile] = []
        while url:
            try:
                with self._open(self._request(url), f"listing {self.uri}") as response:
                    entries = json.load(response)
                    next_link = _NEXT_LINK.search(response.headers.get("Link", ""))
            except TransientSourceError as error:
                raise error.final from error
            for entry in entries:
                if entry.get("type") != "file":
                    continue
                safe_relative_path(entry["path"], self.uri)
                lfs = entry.get("lfs")
                files.append(
                    RemoteFile(
                        path=entry["path"],
                        size=int(entry["size"]),
                        version_id=lfs["oid"] if lfs else entry["oid"],
                        sha256=lfs["oid"] if lfs else None,
                        git_blob_sha1=None if lfs else entry["oid"],
                    )
                )
            url = next_link.group(1) if next_link else None
        if not files:
            raise SourceNotFound(f"not found: no files in {self.uri}")
        return files

    def read_range(self, remote: RemoteFile, start: int, end: int) -> Iterator[bytes]:
        url = f"{self.endpoint}/{self.repo}/resolve/{quote(self.revision, safe='')}/{quote(remote.path)}"
        what = f"{self.uri}/{remote.path} bytes {start}-{end}"
        with self._open(self._request(url, {"Range": f"bytes={start}-{end}"}), what) as response:
            if response.status != 206 and not (start == 0 and end == remote.size - 1):
                raise IntegrityError(f"{what}: server ignored the Range header (HTTP {response.status})")
            try:
                while piece := response.read(READ_PIECE_BYTES):
                    yield piece
            except (TimeoutError, ConnectionError) as error:
                raise TransientSourceError(SourceTimeout(f"timeout reading {what}: {error}")) from error

    def md5_etag(self, remote: RemoteFile) -> str | None:
        # The hub publishes stronger digests (sha256 / git blob sha1) on RemoteFile instead.
        return None
