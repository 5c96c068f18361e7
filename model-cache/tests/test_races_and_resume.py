"""Concurrency, crashes and corruption: the cases that decide whether a pod ever loads bad weights."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    MIB,
    Run,
    assert_not_complete,
    cli_command,
    preload_args,
    run_cli,
    tree_digest,
    upload_revision,
)

# moto answers a ranged GET by reading the whole object, so with 1 MiB parts and one connection a
# 32-64 MiB object takes a second or more: long enough to race or to kill mid-download.
SLOW = ("--concurrency", "1")


def big_checkpoint(mib: int, seed: int) -> dict[str, bytes]:
    return {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors": random.Random(seed).randbytes(mib * MIB),
    }


def test_two_racing_preloaders_download_once_and_both_end_with_identical_valid_trees(
    s3_client, bucket, roots, aws_env
):
    shared, local = roots
    upload_revision(s3_client, bucket, "m/rev1", big_checkpoint(24, seed=1))
    node_roots = [local / "node-a", local / "node-b"]
    processes = []
    for index, node_root in enumerate(node_roots):
        node_root.mkdir()
        args = preload_args(f"s3://{bucket}/m", shared, "--local-root", str(node_root), *SLOW)
        env = {**aws_env, "POD_NAME": f"vllm-{index}"}
        processes.append(
            subprocess.Popen(
                cli_command(*args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    runs = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=120)
        runs.append(Run(process.returncode, stdout, stderr))

    assert [run.returncode for run in runs] == [0, 0], [run.stderr[-2000:] for run in runs]
    downloaders = [run for run in runs if run.named("download_done")]
    waiters = [run for run in runs if run.named("lock_wait")]
    assert len(downloaders) == 1, "exactly one pod downloads a revision"
    assert len(waiters) == 1 and waiters[0] is not downloaders[0], "the other one waited on the lock"
    assert downloaders[0].named("download_done")[0]["bytes_downloaded"] == 24 * MIB + 23
    # The waiter reported the holder's progress while waiting.
    assert any(
        event["owner"] and event["owner"].startswith("vllm-") for event in waiters[0].named("lock_wait")
    )
    copies = [node_root / "llama" / "rev1" for node_root in node_roots] + [shared / "llama" / "rev1"]
    trees = [tree_digest(copy, with_marker=False) for copy in copies]
    assert trees[0] == trees[1] == trees[2]
    manifests = [json.loads((copy / ".model-cache-complete.json").read_text())["files"] for copy in copies]
    assert manifests[0] == manifests[1] == manifests[2], "same manifest; only completed_at differs"
    assert not (shared / "llama" / "rev1.lock").exists(), "lock released"


def test_preloader_killed_mid_download_resumes_from_completed_chunks(s3_client, bucket, roots, aws_env):
    shared, _local = roots
    # 48 MiB uploaded in 5 MiB parts: our chunks align to those 10 parts (see download.py).
    files = big_checkpoint(48, seed=2)
    upload_revision(s3_client, bucket, "m/rev1", files)
    args = preload_args(f"s3://{bucket}/m", shared, *SLOW)
    journal = shared / "llama" / "rev1" / "model.safetensors.model-cache.chunks"

    process = subprocess.Popen(
        cli_command(*args), env=aws_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if journal.exists() and len(journal.read_text().splitlines()) > 4:  # header + 4 chunks
            break
        assert process.poll() is None, "finished before it could be killed; the test needs a slower download"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()

    directory = shared / "llama" / "rev1"
    assert_not_complete(directory)
    assert (directory / "model.safetensors.model-cache.part").exists()
    assert not (directory / "model.safetensors").exists(), "an unfinished file never gets its real name"

    resumed = run_cli(args, aws_env)

    assert resumed.returncode == 0, resumed.stderr
    # The dead run's lock is reclaimed at once (same host, pid gone), not after the 60 s ttl.
    assert resumed.named("lock_taken_over")[0]["reason"] == "owner process gone"
    summary = resumed.named("download_done")[0]
    assert summary["bytes_resumed"] >= 4 * 5 * MIB
    assert summary["bytes_downloaded"] <= len(files["model.safetensors"]) + 100 - 4 * 5 * MIB, (
        "resumed, not restarted"
    )
    assert (directory / "model.safetensors").read_bytes() == files["model.safetensors"]
    # Chunks from before the kill were read back from disk and checked against the ETag too.
    assert [
        e["source_digest_checked"] for e in resumed.named("file_done") if e["path"] == "model.safetensors"
    ] == [True]
    assert run_cli(["verify", "--dir", str(directory)], aws_env).returncode == 0


@pytest.mark.parametrize(
    ("mib", "chunk_mib"),
    [
        (12, 1),  # 3 parts of 5 MiB, but 4 MiB parts also make 3: MD5s computed in one sequential pass
        (30, 5),  # 6 parts: only 5 MiB fits, chunks align to it and part MD5s are computed per chunk
    ],
)
def test_a_corrupted_chunk_in_a_resumed_part_file_is_caught_by_the_etag_and_fetched_again(
    s3_client, bucket, roots, aws_env, mib, chunk_mib
):
    shared, _local = roots
    files = big_checkpoint(mib, seed=3)
    upload_revision(s3_client, bucket, "m/rev1", files)
    directory = shared / "llama" / "rev1"
    directory.mkdir(parents=True)
    etag = s3_client.head_object(Bucket=bucket, Key="m/rev1/model.safetensors")["ETag"].strip('"')
    # A journal claiming every chunk is done, over a .part file whose bytes are wrong (as after a
    # node crash losing page cache, or a bad disk).
    part = directory / "model.safetensors.model-cache.part"
    part.write_bytes(b"\0" * len(files["model.safetensors"]))
    chunks = "\n".join(str(index) for index in range(mib // chunk_mib))
    (directory / "model.safetensors.model-cache.chunks").write_text(
        f"v1 version={etag} size={mib * MIB} part_size={chunk_mib * MIB}\n{chunks}\n"
    )

    run = run_cli(preload_args(f"s3://{bucket}/m", shared), aws_env)

    assert run.returncode == 0, run.stderr
    assert [event["path"] for event in run.named("file_refetch")] == ["model.safetensors"]
    assert "ETag" in run.named("file_refetch")[0]["problems"][0]
    assert run.named("download_done")[0]["bytes_resumed"] == mib * MIB, "the journal was trusted at first"
    assert (directory / "model.safetensors").read_bytes() == files["model.safetensors"]


def test_single_chunk_part_file_resumes_from_its_size(s3_client, bucket, roots, aws_env):
    shared, _local = roots
    data = random.Random(4).randbytes(3 * MIB)
    upload_revision(s3_client, bucket, "m/rev1", {"weights.bin": data})
    etag = s3_client.head_object(Bucket=bucket, Key="m/rev1/weights.bin")["ETag"].strip('"')
    directory = shared / "llama" / "rev1"
    directory.mkdir(parents=True)
    (directory / "weights.bin.model-cache.part").write_bytes(data[: MIB + 12345])
    (directory / "weights.bin.model-cache.chunks").write_text(
        f"v1 version={etag} size={len(data)} part_size={4 * MIB}\n"
    )

    run = run_cli(preload_args(f"s3://{bucket}/m", shared, "--part-size-mib", "4"), aws_env)

    assert run.returncode == 0, run.stderr
    assert run.named("download_done")[0]["bytes_downloaded"] == len(data) - (MIB + 12345)
    assert (directory / "weights.bin").read_bytes() == data


def test_a_part_file_of_another_object_version_is_discarded_not_resumed(s3_client, bucket, roots, aws_env):
    shared, _local = roots
    data = random.Random(5).randbytes(2 * MIB)
    upload_revision(s3_client, bucket, "m/rev1", {"weights.bin": data})
    directory = shared / "llama" / "rev1"
    directory.mkdir(parents=True)
    (directory / "weights.bin.model-cache.part").write_bytes(b"old version bytes")
    (directory / "weights.bin.model-cache.chunks").write_text(
        f"v1 version=0123456789abcdef0123456789abcdef size={len(data)} part_size={4 * MIB}\n"
    )

    run = run_cli(preload_args(f"s3://{bucket}/m", shared, "--part-size-mib", "4"), aws_env)

    assert run.returncode == 0, run.stderr
    assert run.named("download_done")[0]["bytes_downloaded"] == len(data)
    assert (directory / "weights.bin").read_bytes() == data


def test_file_corrupted_after_the_marker_is_detected_by_sha256_verify_and_fetched_again(
    s3_client, bucket, roots, aws_env
):
    shared, _local = roots
    files = {
        "config.json": b"{}",
        **{f"shard-{i}.safetensors": random.Random(i).randbytes(2 * MIB) for i in range(3)},
    }
    upload_revision(s3_client, bucket, "m/rev1", files)
    args = preload_args(f"s3://{bucket}/m", shared)
    assert run_cli(args, aws_env).returncode == 0
    directory = shared / "llama" / "rev1"
    victim = directory / "shard-1.safetensors"
    corrupted = bytearray(victim.read_bytes())
    corrupted[MIB] ^= 0x01  # one bit, same size
    victim.write_bytes(bytes(corrupted))

    cheap = run_cli(args, aws_env)  # default --verify sizes trusts sizes: documented trade-off
    assert cheap.returncode == 0 and not cheap.named("download_done")

    thorough = run_cli([*args, "--verify", "sha256"], aws_env)

    assert thorough.returncode == 0, thorough.stderr
    invalid = thorough.named("revision_invalid")[0]["problems"]
    assert any("shard-1.safetensors" in problem and "sha256" in problem for problem in invalid)
    summary = thorough.named("download_done")[0]
    assert summary["bytes_downloaded"] == 2 * MIB, "only the corrupted file is fetched again"
    assert summary["files_reused"] == 3
    assert victim.read_bytes() == files["shard-1.safetensors"]
    assert run_cli(["verify", "--dir", str(directory)], aws_env).returncode == 0


def test_truncated_file_is_caught_by_the_default_size_check_and_fetched_again(
    s3_client, bucket, roots, aws_env
):
    shared, local = roots
    files = {"config.json": b"{}", "shard.safetensors": random.Random(9).randbytes(3 * MIB)}
    upload_revision(s3_client, bucket, "m/rev1", files)
    args = preload_args(f"s3://{bucket}/m", shared, "--local-root", str(local))
    assert run_cli(args, aws_env).returncode == 0
    for copy in (shared, local):
        with open(copy / "llama" / "rev1" / "shard.safetensors", "r+b") as handle:
            handle.truncate(MIB)

    run = run_cli(args, aws_env)

    assert run.returncode == 0, run.stderr
    assert run.named("download_done")[0]["bytes_downloaded"] == 3 * MIB
    for copy in (shared, local):
        assert (copy / "llama" / "rev1" / "shard.safetensors").read_bytes() == files["shard.safetensors"]
    marker = json.loads((local / "llama" / "rev1" / ".model-cache-complete.json").read_text())
    assert {entry["path"]: entry["size"] for entry in marker["files"]}["shard.safetensors"] == 3 * MIB


def test_waiting_preloader_takes_over_a_lock_whose_heartbeat_stopped(s3_client, bucket, roots, aws_env):
    shared, _local = roots
    upload_revision(s3_client, bucket, "m/rev1", {"config.json": b"{}"})
    lock = shared / "llama" / "rev1.lock"
    lock.parent.mkdir(parents=True)
    # What a SIGKILLed or evicted pod leaves behind: a lock nobody refreshes.
    lock.write_text(
        json.dumps(
            {
                "owner": "vllm-dead:1",
                "token": "x",
                "sequence": 7,
                "heartbeat_at": 0.0,
                "bytes_done": 0,
                "bytes_total": 2,
            }
        )
    )

    started = time.monotonic()
    run = run_cli(preload_args(f"s3://{bucket}/m", shared, "--lock-ttl-seconds", "1"), aws_env)

    assert run.returncode == 0, run.stderr
    assert run.named("lock_taken_over")[0]["stale_owner"] == "vllm-dead:1"
    assert time.monotonic() - started >= 1.0, "a lock is only taken over after ttl without heartbeat"
    assert (shared / "llama" / "rev1" / "config.json").read_bytes() == b"{}"


def test_lock_held_by_a_live_preloader_ends_in_lock_wait_timeout_without_a_marker(
    s3_client, bucket, roots, aws_env
):
    from model_cache.lock import RevisionLock

    shared, _local = roots
    upload_revision(s3_client, bucket, "m/rev1", {"config.json": b"{}"})
    holder = RevisionLock(shared / "llama" / "rev1.lock", ttl_seconds=1.0, owner="vllm-busy:42")
    assert holder.try_acquire()
    try:
        run = run_cli(
            preload_args(
                f"s3://{bucket}/m", shared, "--lock-ttl-seconds", "1", "--lock-wait-timeout-seconds", "2.5"
            ),
            aws_env,
        )
    finally:
        holder.release()

    assert run.returncode == 7, run.stderr
    assert "lock wait timeout" in run.error_message and "vllm-busy:42" in run.error_message
    assert run.named("lock_wait"), "waiting is reported while it lasts"
    assert not holder.lost.is_set(), "a live heartbeat is never taken over"
    assert_not_complete(shared / "llama" / "rev1")
    assert (
        Path(aws_env["MODEL_CACHE_TERMINATION_LOG"]).read_text().startswith("model-cache: lock wait timeout")
    )
    assert os.path.exists(shared / "llama") and not (shared / "llama" / "rev1.lock").exists()
