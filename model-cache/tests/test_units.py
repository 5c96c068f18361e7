"""Pure pieces, tested directly: layout, ETag arithmetic, marker, lock protocol."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time

import pytest

from model_cache.checksums import ExpectedDigests, check_file, multipart_part_sizes
from model_cache.errors import LockLost, UsageError
from model_cache.layout import compile_cache_dir, ensure_compile_cache_dir, revision_dir
from model_cache.lock import LockState, RevisionLock, wait_for_lock_change
from model_cache.manifest import (
    MARKER_NAME,
    Manifest,
    ManifestEntry,
    read_marker,
    verify_directory,
    write_marker,
)

MIB = 1024 * 1024


def test_compile_cache_dir_is_keyed_by_model_gpu_and_vllm_version(tmp_path):
    path = compile_cache_dir(tmp_path, "llama-3-8b", "H200", "0.32.0")

    assert path == tmp_path / ".vllm-cache" / "llama-3-8b" / "H200" / "0.32.0"
    assert compile_cache_dir(tmp_path, "llama-3-8b", "H100", "0.32.0") != path
    assert ensure_compile_cache_dir(tmp_path, "llama-3-8b", "H200", "0.32.0").is_dir()


@pytest.mark.parametrize("bad", ["../x", "a/b", ".vllm-cache", "", ".."])
def test_names_that_would_escape_or_shadow_the_layout_are_rejected(tmp_path, bad):
    with pytest.raises(UsageError):
        revision_dir(tmp_path, bad, "rev")
    with pytest.raises(UsageError):
        compile_cache_dir(tmp_path, "m", bad, "0.1")


def test_multipart_part_size_is_unique_for_big_files_and_enumerated_for_small_ones():
    # 1 GiB uploaded by awscli/boto3 in 8 MiB parts: 128 parts, only 8 MiB fits.
    assert multipart_part_sizes("0" * 32 + "-128", 1024 * MIB) == ([8 * MIB], True)
    # 12 MiB in 5 MiB parts = 3 parts, but 4 MiB parts also make 3: both are tried.
    assert multipart_part_sizes("0" * 32 + "-3", 12 * MIB) == ([4 * MIB, 5 * MIB], True)
    # 2 parts of a 1 GiB file: 512..1023 MiB all fit; only common sizes are tried, not conclusive.
    sizes, exhaustive = multipart_part_sizes("0" * 32 + "-2", 1024 * MIB)
    assert sizes == [512 * MIB] and exhaustive is False
    assert multipart_part_sizes("not-an-etag", 10) == ([], True)


def test_multipart_etag_is_recomputed_and_a_flipped_bit_is_reported(tmp_path):
    data = os.urandom(11 * MIB)
    parts = [data[i : i + 5 * MIB] for i in range(0, len(data), 5 * MIB)]
    etag = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-3"
    path = tmp_path / "shard"
    path.write_bytes(data)

    good = check_file(path, len(data), ExpectedDigests(md5_etag=etag))
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    bad = check_file(path, len(data), ExpectedDigests(md5_etag=etag))

    assert good.ok and good.source_checked and good.sha256 == hashlib.sha256(data).hexdigest()
    assert not bad.ok and "ETag" in bad.problems[0]


def test_marker_round_trips_and_verification_flags_missing_extra_and_resized_files(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"aaaa")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_bytes(b"{}")
    entries = tuple(
        ManifestEntry(p, len(d), hashlib.sha256(d).hexdigest(), "v1")
        for p, d in [("a.bin", b"aaaa"), ("sub/b.json", b"{}")]
    )
    write_marker(tmp_path, Manifest("m", "r", "s3://b/m/r/", entries))

    assert read_marker(tmp_path).files == entries
    assert verify_directory(tmp_path, "sha256").ok
    assert not list(tmp_path.glob(f"{MARKER_NAME}.tmp-*")), "no temp marker left"
    (tmp_path / "extra.safetensors").write_bytes(b"x")
    (tmp_path / "a.bin").write_bytes(b"aa")
    problems = verify_directory(tmp_path, "sizes").problems
    assert any("unexpected file extra.safetensors" in p for p in problems)
    assert any("a.bin: size 2 != manifest 4" in p for p in problems)


def test_an_unparseable_marker_is_never_trusted(tmp_path):
    (tmp_path / MARKER_NAME).write_text('{"format_version": 1, "files": [')

    result = verify_directory(tmp_path, "sizes")

    assert not result.ok and "unreadable completion marker" in result.problems[0]


def test_only_one_lock_holder_at_a_time_and_release_frees_it(tmp_path):
    path = tmp_path / "rev.lock"
    first, second = RevisionLock(path, 5.0, owner="a"), RevisionLock(path, 5.0, owner="b")

    assert first.try_acquire()
    try:
        assert not second.try_acquire()
        assert json.loads(path.read_text())["owner"] == "a"
    finally:
        first.release()
    assert not path.exists()
    assert second.try_acquire()
    second.release()


def test_heartbeat_advances_so_waiters_never_see_a_live_lock_as_stale(tmp_path):
    path = tmp_path / "rev.lock"
    holder = RevisionLock(path, 0.4, owner="live")
    assert holder.try_acquire()
    try:
        first = json.loads(path.read_text())["sequence"]
        time.sleep(0.35)
        assert json.loads(path.read_text())["sequence"] > first
        with pytest.raises(Exception, match="lock wait timeout"):
            wait_for_lock_change(path, 0.4, time.monotonic() + 1.5, lambda state, age: None, 10)
    finally:
        holder.release()


def test_holder_whose_lock_was_taken_over_notices_and_refuses_to_write_the_marker(tmp_path):
    path = tmp_path / "rev.lock"
    holder = RevisionLock(path, 0.2, owner="slow")
    assert holder.try_acquire()
    try:
        # What a waiter does after our heartbeat went unseen for ttl: move the lock and take it.
        os.rename(path, tmp_path / "aside")
        usurper = RevisionLock(path, 0.2, owner="usurper")
        assert usurper.try_acquire()
        deadline = time.monotonic() + 3
        while not holder.lost.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert holder.lost.is_set()
        with pytest.raises(LockLost):
            holder.ensure_held()
        usurper.release()
    finally:
        holder.release()


def test_a_waiter_names_the_owner_even_when_it_first_reads_the_lock_before_its_owner_wrote_it(tmp_path):
    """The holder creates the file (O_EXCL) and writes its state after: a waiter reading in between
    got an empty file, reported owner None and stayed silent for the whole progress interval, so a
    download shorter than it never named its owner (CI, 2026-12-05)."""
    path = tmp_path / "rev.lock"
    path.write_bytes(b"")  # created, not yet written
    state = LockState("vllm-0:7", "token", 1, time.time(), host="another-node", pid=7)

    def holder() -> None:
        time.sleep(0.3)
        path.write_bytes(state.encode())
        time.sleep(2.2)
        path.unlink()

    thread = threading.Thread(target=holder)
    thread.start()
    reports = []
    try:
        outcome = wait_for_lock_change(path, 30, time.monotonic() + 10, lambda s, age: reports.append(s), 60)
    finally:
        thread.join()
    assert outcome == "released"
    # The wait is reported at once (no owner yet), and the owner at the first readable poll.
    assert [report.owner if report else None for report in reports] == [None, "vllm-0:7"]


def test_a_hold_shorter_than_one_poll_still_names_its_owner(tmp_path):
    """CI, 2026-12-05 again: the waiter's first read was empty, the next poll came a second later
    (ttl 60 s) and the download had ended by then, so no report named the owner."""
    path = tmp_path / "rev.lock"
    path.write_bytes(b"")
    state = LockState("vllm-1:9", "token", 1, time.time(), host="another-node", pid=9)

    def holder() -> None:
        time.sleep(0.05)
        path.write_bytes(state.encode())
        time.sleep(0.3)
        path.unlink()

    thread = threading.Thread(target=holder)
    thread.start()
    reports = []
    try:
        outcome = wait_for_lock_change(path, 60, time.monotonic() + 10, lambda s, age: reports.append(s), 60)
    finally:
        thread.join()
    assert outcome == "released"
    assert [report.owner if report else None for report in reports] == [None, "vllm-1:9"]


def test_a_lock_that_stays_unreadable_is_reported_once_per_interval(tmp_path):
    path = tmp_path / "rev.lock"
    path.write_bytes(b"{torn")
    reports = []
    with pytest.raises(Exception, match="lock wait timeout"):
        wait_for_lock_change(path, 0.8, time.monotonic() + 0.5, lambda s, age: reports.append(s), 60)
    assert reports == [None]
