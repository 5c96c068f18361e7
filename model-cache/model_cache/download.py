"""Fill a revision directory from a source: parallel ranged GETs, resume, verify, bounded memory.

Every file is written as `<name>.model-cache.part` with os.pwrite at its offsets and renamed to
its real name only after its size and digests check out. Large files are split into chunks of
about `part_size` fetched concurrently (across files too). Memory is O(concurrency x 1 MiB): bytes
go from the socket to the file, never a whole file or chunk in memory.

Pipeline, so that hashing overlaps the download instead of following it, and neither the network
threads nor the hashing threads wait for the disk:
    chunk pool (network): ranged GET -> pwrite
    sync pool (disk):     fdatasync -> record in `<name>.model-cache.chunks`
    hash pool (CPU):      MD5 of the chunk's upload parts (parallel across chunks) -> advance the
                          file's sequential sha256 over every contiguous finished chunk
    when every chunk of a file is synced and digested: compare digests, rename
A killed download resumes from its recorded chunks (a one-chunk file from its `.part` size).
Digests are computed from the bytes read back from disk, so resumed chunks are checked the same way.
When the S3 ETag is multipart with a unique whole-MiB part size, chunks are aligned to that part
size so each chunk's part MD5s can be computed independently.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from model_cache.checksums import (
    ContentDigest,
    ExpectedDigests,
    check_file,
    looks_like_md5_etag,
    multipart_part_sizes,
    part_md5s_of_range,
)
from model_cache.errors import (
    DiskFull,
    IntegrityError,
    LockLost,
    PreloadError,
    TransientSourceError,
)
from model_cache.jsonlog import log
from model_cache.layout import free_bytes
from model_cache.manifest import MARKER_NAME, ManifestEntry, fsync_directory
from model_cache.remote import RemoteFile, Source

PART_SUFFIX = ".model-cache.part"
JOURNAL_SUFFIX = ".model-cache.chunks"
MIB = 1024 * 1024
# A file that fails its digest check is fetched again once; twice is not bad luck.
MAX_FILE_ATTEMPTS = 2


@dataclass(frozen=True)
class DownloadSettings:
    part_size_bytes: int = 64 * MIB
    concurrency: int = 16
    max_attempts: int = 5
    etag_check: bool = True
    progress_interval_seconds: float = 5.0
    # Part MD5s of different chunks hash in parallel: on a GPU node's many cores MD5 (~0.5 GB/s per
    # core) keeps up with S3; on a 2-core box it cannot (bench/preloader/README.md).
    hash_workers: int = max(1, min(8, os.cpu_count() or 1))


@dataclass
class DownloadReport:
    entries: list[ManifestEntry] = field(default_factory=list)
    bytes_downloaded: int = 0
    bytes_resumed: int = 0
    bytes_reused: int = 0
    files_downloaded: int = 0
    files_reused: int = 0
    files_refetched_after_check: int = 0
    seconds: float = 0.0


class _Aborted(Exception):
    """Internal: another task failed or the lock was lost; stop quietly."""


class _Progress:
    def __init__(self, total: int, interval: float, on_progress: Callable[[int, int], None]) -> None:
        self.total = total
        self.done = 0
        self.downloaded = 0
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._interval = interval
        self._on_progress = on_progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._report_loop, name="progress", daemon=True)

    def add_downloaded(self, count: int) -> None:
        with self._lock:
            self.done += count
            self.downloaded += count

    def add_present(self, count: int) -> None:
        with self._lock:
            self.done += count

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._emit()

    def _emit(self) -> None:
        elapsed = max(time.monotonic() - self._started, 1e-6)
        self._on_progress(self.done, self.total)
        log(
            "download_progress",
            bytes_done=self.done,
            bytes_total=self.total,
            percent=round(100.0 * self.done / self.total, 1) if self.total else 100.0,
            bytes_downloaded=self.downloaded,
            mib_per_s=round(self.downloaded / MIB / elapsed, 1),
            elapsed_s=round(elapsed, 1),
        )

    def _report_loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._emit()


class _ChunkJournal:
    """Append-only record of finished chunks, headed by the identity of what is being fetched."""

    def __init__(self, path: Path, header: str) -> None:
        self.path = path
        self._header = header
        self._lock = threading.Lock()

    def load(self) -> set[int] | None:
        """Finished chunk indexes, or None if there is no journal for this exact content."""
        try:
            lines = self.path.read_text().split("\n")
        except FileNotFoundError:
            return None
        if lines[0] != self._header:
            return None
        # The last line may be torn by a kill mid-write: only whole numbers count.
        return {int(line) for line in lines[1:] if line.isdigit()}

    def reset(self) -> None:
        with self.path.open("w") as handle:
            handle.write(self._header + "\n")

    def record(self, index: int) -> None:
        with self._lock, self.path.open("a") as handle:
            handle.write(f"{index}\n")

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass
class _Transfer:
    remote: RemoteFile
    final_path: Path
    part_path: Path
    journal: _ChunkJournal
    chunk_size: int
    chunk_count: int
    pending_chunks: list[int]
    """Chunks to fetch; the others were recorded as finished by an earlier run."""
    content: ContentDigest
    upload_part_size: int | None
    """S3 multipart part size the chunk grid is aligned to; part MD5s are then per chunk."""
    resume_offset: int = 0
    """For single-chunk files: bytes of the .part already fetched."""
    descriptor: int = -1
    attempt: int = 1
    syncs_left: int = 0
    digests_left: int = 0
    part_md5s: dict[int, list[bytes]] = field(default_factory=dict)
    state_lock: threading.Lock = field(default_factory=threading.Lock)
    stream_lock: threading.Lock = field(default_factory=threading.Lock)
    landed: set[int] = field(default_factory=set)
    cursor: int = 0
    """Next chunk index the sequential digest needs."""

    def chunk_range(self, index: int) -> tuple[int, int]:
        """start, end (exclusive)."""
        start = index * self.chunk_size
        return start, min(start + self.chunk_size, self.remote.size)


def _write_all(descriptor: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(descriptor, view, offset)
        view = view[written:]
        offset += written


class RevisionDownloader:
    def __init__(self, source: Source, destination: Path, settings: DownloadSettings) -> None:
        self.source = source
        self.destination = destination
        self.settings = settings
        self._abort = threading.Event()
        self._lock_lost: threading.Event | None = None

    # ---- planning -------------------------------------------------------------------------------

    def _etag_to_check(self, remote: RemoteFile) -> str | None:
        """The ETag whose MD5 shape we compute; whether it is compared is decided at the end (SSE)."""
        if not self.settings.etag_check or not looks_like_md5_etag(remote.version_id):
            return None
        return remote.version_id

    def _plan_transfer(self, remote: RemoteFile, attempt: int = 1) -> _Transfer:
        final_path = self.destination / remote.path
        final_path.parent.mkdir(parents=True, exist_ok=True)
        part_path = final_path.with_name(final_path.name + PART_SUFFIX)
        etag = self._etag_to_check(remote)
        upload_part_size = None
        chunk_size = self.settings.part_size_bytes
        if etag and "-" in etag:
            candidates, exhaustive = multipart_part_sizes(etag, remote.size)
            if exhaustive and len(candidates) == 1:
                upload_part_size = candidates[0]
                chunk_size = upload_part_size * max(1, chunk_size // upload_part_size)
        chunk_count = -(-remote.size // chunk_size)
        journal = _ChunkJournal(
            final_path.with_name(final_path.name + JOURNAL_SUFFIX),
            f"v1 version={remote.version_id} size={remote.size} part_size={chunk_size}",
        )
        finished = journal.load() if attempt == 1 and part_path.exists() else None
        resume_offset = 0
        if finished is None:
            part_path.unlink(missing_ok=True)
            journal.reset()
            finished = set()
        finished &= set(range(chunk_count))
        if chunk_count == 1 and 0 not in finished:
            resume_offset = min(part_path.stat().st_size, remote.size) if part_path.exists() else 0
        transfer = _Transfer(
            remote=remote,
            final_path=final_path,
            part_path=part_path,
            journal=journal,
            chunk_size=chunk_size,
            chunk_count=chunk_count,
            pending_chunks=[index for index in range(chunk_count) if index not in finished],
            content=ContentDigest(
                remote.size,
                etag,
                git_blob=remote.git_blob_sha1 is not None,
                parts_elsewhere=upload_part_size is not None,
            ),
            upload_part_size=upload_part_size,
            resume_offset=resume_offset,
            attempt=attempt,
        )
        transfer.descriptor = os.open(part_path, os.O_RDWR | os.O_CREAT, 0o644)
        transfer.syncs_left = len(transfer.pending_chunks)
        transfer.digests_left = chunk_count
        return transfer

    def _already_present_bytes(self, transfer: _Transfer) -> int:
        finished = set(range(transfer.chunk_count)) - set(transfer.pending_chunks)
        present = sum(end - start for start, end in map(transfer.chunk_range, finished))
        return present + transfer.resume_offset

    # ---- work run in the pools -----------------------------------------------------------------

    def _check_abort(self) -> None:
        if self._abort.is_set():
            raise _Aborted()
        if self._lock_lost is not None and self._lock_lost.is_set():
            raise LockLost("lock lost: another preloader took over this revision (heartbeat stalled)")

    def _fetch_chunk(self, transfer: _Transfer, index: int, progress: _Progress) -> None:
        start, end = transfer.chunk_range(index)
        offset = start + (transfer.resume_offset if transfer.chunk_count == 1 else 0)
        failures = 0
        while offset < end:
            self._check_abort()
            try:
                for piece in self.source.read_range(transfer.remote, offset, end - 1):
                    self._check_abort()
                    _write_all(transfer.descriptor, piece, offset)
                    offset += len(piece)
                    progress.add_downloaded(len(piece))
                if offset < end:
                    raise TransientSourceError(
                        PreloadError(f"{transfer.remote.path}: connection closed at byte {offset} of {end}")
                    )
            except TransientSourceError as error:
                failures += 1
                if failures >= self.settings.max_attempts:
                    raise error.final from error
                delay = min(10.0, 0.25 * 2**failures) * (0.5 + random.random())
                log(
                    "chunk_retry",
                    level="warning",
                    path=transfer.remote.path,
                    offset=offset,
                    attempt=failures,
                    error=error.final.message,
                )
                time.sleep(delay)

    def _sync_chunk(self, transfer: _Transfer, index: int) -> None:
        """Durable before it is recorded: a journal entry must never point at bytes still in RAM."""
        self._check_abort()
        os.fdatasync(transfer.descriptor)
        transfer.journal.record(index)

    def _digest_chunk(self, transfer: _Transfer, index: int) -> None:
        """Runs in the hash pool once chunk `index` is written (now or by an earlier run); reads it
        back from the page cache, so it needs no fdatasync first."""
        self._check_abort()
        start, end = transfer.chunk_range(index)
        if transfer.upload_part_size is not None:
            digests = part_md5s_of_range(transfer.descriptor, start, end, transfer.upload_part_size)
            with transfer.state_lock:
                transfer.part_md5s[index] = digests
        with transfer.state_lock:
            transfer.landed.add(index)
        self._advance_sequential_digest(transfer)

    def _advance_sequential_digest(self, transfer: _Transfer) -> None:
        """Feed sha256 with every contiguous landed chunk. One thread at a time per file; a thread
        that finds the stream busy leaves its chunk to the streaming one (re-checked after release)."""
        while True:
            if not transfer.stream_lock.acquire(blocking=False):
                return
            try:
                while True:
                    with transfer.state_lock:
                        if transfer.cursor not in transfer.landed:
                            break
                        index = transfer.cursor
                    self._check_abort()
                    transfer.content.feed_file(transfer.descriptor, *transfer.chunk_range(index))
                    with transfer.state_lock:
                        transfer.cursor += 1
            finally:
                transfer.stream_lock.release()
            with transfer.state_lock:
                if transfer.cursor not in transfer.landed:
                    return

    def _expected(self, remote: RemoteFile) -> ExpectedDigests:
        md5_etag = self.source.md5_etag(remote) if self.settings.etag_check else None
        return ExpectedDigests(md5_etag=md5_etag, sha256=remote.sha256, git_blob_sha1=remote.git_blob_sha1)

    def _finalize(self, transfer: _Transfer) -> tuple[ManifestEntry | None, list[str]]:
        """All chunks fetched and digested: compare, then give the file its real name."""
        self._check_abort()
        if transfer.cursor != transfer.chunk_count:
            raise PreloadError(
                f"internal: {transfer.remote.path} digested {transfer.cursor}/{transfer.chunk_count}"
            )
        os.fsync(transfer.descriptor)
        os.close(transfer.descriptor)
        transfer.descriptor = -1
        size = transfer.part_path.stat().st_size
        if size != transfer.remote.size:
            return None, [f"size {size} != expected {transfer.remote.size}"]
        part_md5s = None
        if transfer.upload_part_size is not None:
            part_md5s = [
                digest for index in range(transfer.chunk_count) for digest in transfer.part_md5s[index]
            ]
        outcome = transfer.content.finish(self._expected(transfer.remote), part_md5s)
        if not outcome.ok:
            return None, outcome.problems
        os.rename(transfer.part_path, transfer.final_path)
        transfer.journal.remove()
        log(
            "file_done",
            path=transfer.remote.path,
            size=transfer.remote.size,
            source_digest_checked=outcome.source_checked,
        )
        return self._entry(transfer.remote, outcome.sha256), []

    def _check_existing(self, remote: RemoteFile) -> tuple[ManifestEntry | None, list[str]]:
        self._check_abort()
        outcome = check_file(self.destination / remote.path, remote.size, self._expected(remote))
        return (self._entry(remote, outcome.sha256) if outcome.ok else None), outcome.problems

    @staticmethod
    def _entry(remote: RemoteFile, sha256: str) -> ManifestEntry:
        return ManifestEntry(
            path=remote.path, size=remote.size, sha256=sha256, source_version=remote.version_id
        )

    # ---- orchestration -------------------------------------------------------------------------

    def run(
        self,
        files: list[RemoteFile],
        trusted: dict[str, ManifestEntry],
        lock_lost: threading.Event | None = None,
        on_progress: Callable[[int, int], None] = lambda done, total: None,
    ) -> DownloadReport:
        """Make `destination` hold exactly `files`, verified. Does not write the marker."""
        self._lock_lost = lock_lost
        started = time.monotonic()
        self.destination.mkdir(parents=True, exist_ok=True)
        report = DownloadReport()
        progress = _Progress(sum(f.size for f in files), self.settings.progress_interval_seconds, on_progress)

        to_check: list[RemoteFile] = []
        to_fetch: list[RemoteFile] = []
        for remote in files:
            final_path = self.destination / remote.path
            size = final_path.stat().st_size if final_path.is_file() else None
            known = trusted.get(remote.path)
            if (
                size == remote.size
                and known
                and (known.size, known.source_version)
                == (
                    remote.size,
                    remote.version_id,
                )
            ):
                report.entries.append(known)
                report.files_reused += 1
                report.bytes_reused += remote.size
                progress.add_present(remote.size)
            elif size == remote.size:
                to_check.append(remote)
            else:
                final_path.unlink(missing_ok=True)
                to_fetch.append(remote)

        transfers = [self._plan_transfer(remote) for remote in to_fetch]
        try:
            present = sum(self._already_present_bytes(transfer) for transfer in transfers)
            report.bytes_resumed = present
            progress.add_present(present)
            if present:
                log("resume", bytes_already_on_disk=present, files=len(transfers))
            needed = sum(transfer.remote.size for transfer in transfers) - present
            available = free_bytes(self.destination)
            if needed > available:
                raise DiskFull(
                    f"disk full: {self.destination} needs {needed / MIB:.1f} MiB more, "
                    f"{available / MIB:.1f} MiB free"
                )
            progress.start()
            try:
                self._run_pools(transfers, to_check, progress, report)
            finally:
                progress.stop()
        finally:
            for transfer in transfers:
                if transfer.descriptor >= 0:
                    os.close(transfer.descriptor)
                    transfer.descriptor = -1

        self._remove_unexpected({remote.path for remote in files})
        for directory in {(self.destination / entry.path).parent for entry in report.entries}:
            fsync_directory(directory)
        report.bytes_downloaded = progress.downloaded
        report.seconds = time.monotonic() - started
        return report

    def _run_pools(
        self,
        transfers: list[_Transfer],
        to_check: list[RemoteFile],
        progress: _Progress,
        report: DownloadReport,
    ) -> None:
        # future -> (kind, file, chunk index or -1)
        tasks: dict[Future, tuple[str, _Transfer | RemoteFile, int]] = {}
        chunk_pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="chunk")
        hash_pool = ThreadPoolExecutor(self.settings.hash_workers, thread_name_prefix="hash")
        sync_pool = ThreadPoolExecutor(min(4, self.settings.concurrency), thread_name_prefix="sync")

        def finalize_when_ready(transfer: _Transfer) -> None:
            if transfer.digests_left == 0 and transfer.syncs_left == 0:
                tasks[hash_pool.submit(self._finalize, transfer)] = ("finalize", transfer, -1)

        def schedule(transfer: _Transfer) -> None:
            pending = set(transfer.pending_chunks)
            for index in range(transfer.chunk_count):
                if index not in pending:  # on disk from an earlier run: digest it now
                    tasks[hash_pool.submit(self._digest_chunk, transfer, index)] = ("digest", transfer, index)
            for index in transfer.pending_chunks:
                tasks[chunk_pool.submit(self._fetch_chunk, transfer, index, progress)] = (
                    "fetch",
                    transfer,
                    index,
                )
            if transfer.chunk_count == 0:
                tasks[hash_pool.submit(self._finalize, transfer)] = ("finalize", transfer, -1)

        try:
            for remote in to_check:
                tasks[hash_pool.submit(self._check_existing, remote)] = ("check", remote, -1)
            # Small files first, then shard by shard, so files complete (and are hashed) in turn.
            for transfer in sorted(transfers, key=lambda t: t.remote.size):
                schedule(transfer)
            while tasks:
                done, _ = wait(list(tasks), timeout=0.5, return_when=FIRST_COMPLETED)
                self._check_abort()
                for future in done:
                    kind, subject, index = tasks.pop(future)
                    if kind == "fetch":
                        assert isinstance(subject, _Transfer)
                        future.result()
                        tasks[sync_pool.submit(self._sync_chunk, subject, index)] = ("sync", subject, index)
                        tasks[hash_pool.submit(self._digest_chunk, subject, index)] = (
                            "digest",
                            subject,
                            index,
                        )
                    elif kind == "sync":
                        assert isinstance(subject, _Transfer)
                        future.result()
                        subject.syncs_left -= 1
                        finalize_when_ready(subject)
                    elif kind == "digest":
                        assert isinstance(subject, _Transfer)
                        future.result()
                        subject.digests_left -= 1
                        finalize_when_ready(subject)
                    elif kind == "finalize":
                        assert isinstance(subject, _Transfer)
                        entry, problems = future.result()
                        if entry is not None:
                            report.entries.append(entry)
                            report.files_downloaded += 1
                            continue
                        if subject.attempt >= MAX_FILE_ATTEMPTS:
                            subject.part_path.unlink(missing_ok=True)
                            subject.journal.remove()
                            raise IntegrityError(
                                f"integrity: {subject.remote.path} failed verification twice: "
                                + "; ".join(problems)
                            )
                        log("file_refetch", level="warning", path=subject.remote.path, problems=problems)
                        retry = self._plan_transfer(subject.remote, attempt=subject.attempt + 1)
                        transfers.append(retry)
                        schedule(retry)
                    else:
                        assert isinstance(subject, RemoteFile)
                        entry, problems = future.result()
                        if entry is not None:
                            report.entries.append(entry)
                            report.files_reused += 1
                            report.bytes_reused += subject.size
                            progress.add_present(subject.size)
                            continue
                        log("file_refetch", level="warning", path=subject.path, problems=problems)
                        report.files_refetched_after_check += 1
                        (self.destination / subject.path).unlink(missing_ok=True)
                        transfer = self._plan_transfer(subject)
                        transfers.append(transfer)
                        schedule(transfer)
        except BaseException:
            self._abort.set()
            raise
        finally:
            for pool in (chunk_pool, sync_pool, hash_pool):
                pool.shutdown(wait=True, cancel_futures=True)

    def _remove_unexpected(self, expected: set[str]) -> None:
        """Leftovers (old .part files, files the revision no longer has) would be served too."""
        for root, _dirs, names in os.walk(self.destination):
            for name in names:
                path = Path(root) / name
                relative = path.relative_to(self.destination).as_posix()
                if relative in expected or name == MARKER_NAME:
                    continue
                path.unlink()
                log("removed_unexpected_file", path=relative)
