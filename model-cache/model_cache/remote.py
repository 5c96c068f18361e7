"""What a model source is: a listing of files and ranged reads of them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

READ_PIECE_BYTES = 1024 * 1024
"""Bytes taken from the socket per write: with `concurrency` readers, memory stays O(concurrency MiB)."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    """Path relative to the revision, '/'-separated; also the path under the destination."""
    size: int
    version_id: str
    """Identity of this content at the source (S3 ETag, HF blob/LFS oid). A partial download made
    for another version_id is thrown away instead of resumed."""
    sha256: str | None = None
    """Known sha256 of the content, when the source publishes one (HF LFS files)."""
    git_blob_sha1: str | None = None
    """Git blob id, for HF files stored in git rather than LFS."""


class Source(Protocol):
    uri: str

    def list_files(self) -> list[RemoteFile]:
        """Every file of the revision. Raises SourceNotFound when there is none."""
        ...

    def read_range(self, remote: RemoteFile, start: int, end: int) -> Iterator[bytes]:
        """Yield bytes start..end (inclusive) in bounded pieces.

        Raises PreloadError for permanent failures, TransientSourceError for retryable ones.
        """
        ...

    def md5_etag(self, remote: RemoteFile) -> str | None:
        """An ETag known to be MD5-derived (plain or multipart), or None when it cannot be checked."""
        ...
