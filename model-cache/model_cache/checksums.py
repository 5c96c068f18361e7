"""Digests of a file on disk against what the source says it should be, in one read of the file.

sha256 is always computed (it goes into the manifest). The source's own digests are checked when
it has them: an S3 ETag that is an MD5 (single PUT) or an MD5 of part MD5s (multipart upload, part
size inferred as whole MiB; see multipart_part_sizes), an HF LFS sha256, or an HF git blob sha1.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
READ_BLOCK_BYTES = 8 * MIB
_SINGLE_ETAG = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART_ETAG = re.compile(r"^[0-9a-f]{32}-([0-9]+)$")


@dataclass(frozen=True)
class ExpectedDigests:
    md5_etag: str | None = None
    sha256: str | None = None
    git_blob_sha1: str | None = None


@dataclass(frozen=True)
class FileCheck:
    sha256: str
    problems: list[str] = field(default_factory=list)
    source_checked: bool = False
    """Whether a digest published by the source (ETag MD5, sha256, git blob) was compared."""

    @property
    def ok(self) -> bool:
        return not self.problems


# Part sizes uploaders use by default (boto3/awscli 8, s5cmd 50, rclone 5/64...), tried first when
# many whole-MiB sizes would give the same part count.
_COMMON_PART_SIZES_MIB = (8, 16, 64, 5, 32, 50, 100, 128, 10, 15, 25, 256, 512)
MAX_PART_SIZE_CANDIDATES = 4


def looks_like_md5_etag(etag: str) -> bool:
    """An S3 ETag of a single PUT (MD5) or multipart upload (MD5 of part MD5s, '-N'). Whether it
    really is an MD5 also depends on encryption (SSE-KMS/SSE-C ETags are not), which only the
    source knows."""
    return bool(_SINGLE_ETAG.match(etag) or _MULTIPART_ETAG.match(etag))


def multipart_part_sizes(etag: str, size: int) -> tuple[list[int], bool]:
    """Whole-MiB part sizes a multipart upload of `size` bytes into N parts could have used.

    Returns (candidates, exhaustive). A part size p gives N parts iff (N-1)p < size <= Np. For big
    files there is one whole-MiB p; for files of few parts several fit, and all are tried (up to
    MAX_PART_SIZE_CANDIDATES). When more fit than that, the common ones are tried and a mismatch
    proves nothing (exhaustive=False). Uploaders all use whole-MiB part sizes.
    """
    match = _MULTIPART_ETAG.match(etag)
    if not match or size == 0:
        return [], True
    parts = int(match.group(1))
    smallest = math.ceil(math.ceil(size / parts) / MIB)
    fitting = []
    mib = smallest
    while math.ceil(size / (mib * MIB)) == parts:
        fitting.append(mib)
        if len(fitting) > MAX_PART_SIZE_CANDIDATES:
            break
        mib += 1
    if len(fitting) <= MAX_PART_SIZE_CANDIDATES:
        return [mib * MIB for mib in fitting], True
    common = [mib for mib in _COMMON_PART_SIZES_MIB if math.ceil(size / (mib * MIB)) == parts]
    return [mib * MIB for mib in (common or [smallest])[:MAX_PART_SIZE_CANDIDATES]], False


class _MultipartMd5:
    """MD5 of each part, then MD5 of the concatenated digests, suffixed with the part count."""

    def __init__(self, part_size: int) -> None:
        self.part_size = part_size
        self._current = hashlib.md5(usedforsecurity=False)
        self._in_part = 0
        self._digests: list[bytes] = []

    def update(self, block: memoryview) -> None:
        while block:
            take = min(len(block), self.part_size - self._in_part)
            self._current.update(block[:take])
            self._in_part += take
            block = block[take:]
            if self._in_part == self.part_size:
                self._digests.append(self._current.digest())
                self._current, self._in_part = hashlib.md5(usedforsecurity=False), 0

    def hexdigest(self) -> str:
        digests = self._digests + ([self._current.digest()] if self._in_part else [])
        return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"


class _EtagCheck:
    """Recomputes an S3 ETag: MD5 of a single-PUT object, or multipart MD5 for each candidate size."""

    def __init__(self, etag: str, size: int) -> None:
        self.etag = etag
        self.exhaustive = True
        self._hashers: list = []
        if _SINGLE_ETAG.match(etag):
            self._hashers = [hashlib.md5(usedforsecurity=False)]
        else:
            sizes, self.exhaustive = multipart_part_sizes(etag, size)
            self._hashers = [_MultipartMd5(part_size) for part_size in sizes]

    @property
    def checkable(self) -> bool:
        return bool(self._hashers)

    def update(self, block: memoryview) -> None:
        for hasher in self._hashers:
            hasher.update(block)

    def problem(self) -> str | None:
        """A mismatch message, or None when it matches or a mismatch proves nothing."""
        computed = [hasher.hexdigest() for hasher in self._hashers]
        if self.etag in computed or not self.exhaustive:
            return None
        return f"MD5/ETag {', '.join(computed)} != source ETag {self.etag}"


class ContentDigest:
    """sha256 plus whichever source digest applies, fed with the file's bytes in order.

    With `parts_elsewhere`, the caller computes multipart part MD5s itself (in parallel, one task
    per chunk) and passes them to `finish`; this object then only does the sequential digests.
    """

    def __init__(self, size: int, etag: str | None, git_blob: bool, parts_elsewhere: bool = False) -> None:
        self.size = size
        self._sha256 = hashlib.sha256()
        etag_check = _EtagCheck(etag, size) if etag and not parts_elsewhere else None
        self._etag = etag_check if etag_check is not None and etag_check.checkable else None
        self._blob = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False) if git_blob else None

    def update(self, block: memoryview | bytes) -> None:
        self._sha256.update(block)
        if self._etag is not None:
            self._etag.update(memoryview(block))
        if self._blob is not None:
            self._blob.update(block)

    def feed_file(self, descriptor: int, start: int, end: int) -> None:
        """Feed bytes start..end (exclusive) of an open file."""
        for block in read_blocks(descriptor, start, end):
            self.update(block)

    def finish(self, expected: ExpectedDigests, part_md5s: list[bytes] | None = None) -> FileCheck:
        digest = self._sha256.hexdigest()
        problems: list[str] = []
        source_checked = False
        if expected.md5_etag and part_md5s is not None:
            source_checked = True
            combined = hashlib.md5(b"".join(part_md5s), usedforsecurity=False).hexdigest()
            computed = f"{combined}-{len(part_md5s)}"
            if computed != expected.md5_etag:
                problems.append(f"MD5/ETag {computed} != source ETag {expected.md5_etag}")
        elif expected.md5_etag and self._etag is not None:
            source_checked = True
            if mismatch := self._etag.problem():
                problems.append(mismatch)
        if expected.sha256:
            source_checked = True
            if digest != expected.sha256:
                problems.append(f"sha256 {digest} != source sha256 {expected.sha256}")
        if expected.git_blob_sha1 and self._blob is not None:
            source_checked = True
            if self._blob.hexdigest() != expected.git_blob_sha1:
                problems.append(f"git blob sha1 {self._blob.hexdigest()} != source {expected.git_blob_sha1}")
        return FileCheck(sha256=digest, problems=problems, source_checked=source_checked)


def read_blocks(descriptor: int, start: int, end: int):  # type: ignore[no-untyped-def]
    """pread in READ_BLOCK_BYTES blocks: no shared file offset, so threads can read one file."""
    offset = start
    while offset < end:
        block = os.pread(descriptor, min(READ_BLOCK_BYTES, end - offset), offset)
        if not block:
            raise OSError(f"unexpected end of file at byte {offset} (wanted {end})")
        offset += len(block)
        yield block


def part_md5s_of_range(descriptor: int, start: int, end: int, part_size: int) -> list[bytes]:
    """MD5 of each upload part in start..end (exclusive); start is part-aligned."""
    digests = []
    for part_start in range(start, end, part_size):
        md5 = hashlib.md5(usedforsecurity=False)
        for block in read_blocks(descriptor, part_start, min(part_start + part_size, end)):
            md5.update(block)
        digests.append(md5.digest())
    return digests


def check_file(path: Path, expected_size: int, expected: ExpectedDigests) -> FileCheck:
    """Size first (free), then one sequential read feeding every digest that applies."""
    actual_size = os.stat(path).st_size
    if actual_size != expected_size:
        return FileCheck(sha256="", problems=[f"size {actual_size} != expected {expected_size}"])
    content = ContentDigest(actual_size, expected.md5_etag, git_blob=bool(expected.git_blob_sha1))
    descriptor = os.open(path, os.O_RDONLY)
    try:
        content.feed_file(descriptor, 0, actual_size)
    finally:
        os.close(descriptor)
    return content.finish(expected)
