"""End to end against a real S3 API (moto server): the CLI as the init container runs it."""

from __future__ import annotations

import json

from conftest import (
    MIB,
    checkpoint_files,
    preload_args,
    run_cli,
    tree_digest,
    upload_revision,
)


def test_fresh_download_fills_shared_and_local_copies_and_prints_the_local_path(
    s3_client, bucket, roots, aws_env
):
    shared, local = roots
    files = checkpoint_files()
    upload_revision(s3_client, bucket, "models/llama/rev1", files)

    run = run_cli(
        preload_args(f"s3://{bucket}/models/llama", shared, "--local-root", str(local)),
        aws_env,
    )

    assert run.returncode == 0, run.stderr
    assert run.served_path == str(local / "llama" / "rev1")
    for copy in (shared / "llama" / "rev1", local / "llama" / "rev1"):
        for name, data in files.items():
            assert (copy / name).read_bytes() == data, f"{copy}/{name}"
        marker = json.loads((copy / ".model-cache-complete.json").read_text())
        assert {entry["path"] for entry in marker["files"]} == set(files)
        assert not list(copy.rglob("*.model-cache.*")), "no .part or journal left behind"
    summary = run.named("download_done")[0]
    assert summary["bytes_downloaded"] == sum(len(data) for data in files.values())
    # The multipart shard's 'md5-N' ETag and the single-PUT MD5 ETags were really recomputed.
    assert run.named("download_progress"), "progress is reported as JSON"


def test_second_run_on_the_same_node_is_a_no_op_that_needs_neither_s3_nor_the_shared_copy(
    s3_client, bucket, roots, aws_env
):
    shared, local = roots
    upload_revision(s3_client, bucket, "models/llama/rev1", checkpoint_files())
    args = preload_args(f"s3://{bucket}/models/llama", shared, "--local-root", str(local))
    assert run_cli(args, aws_env).returncode == 0
    before = tree_digest(local / "llama" / "rev1")

    # S3 unreachable: the second run must not need it at all.
    offline_env = {**aws_env, "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}
    second = run_cli(args, offline_env)

    assert second.returncode == 0, second.stderr
    assert second.served_path == str(local / "llama" / "rev1")
    assert not second.named("download_done")
    assert tree_digest(local / "llama" / "rev1") == before


def test_a_new_node_copies_from_the_shared_volume_without_downloading_again(
    s3_client, bucket, roots, aws_env
):
    shared, local = roots
    upload_revision(s3_client, bucket, "models/llama/rev1", checkpoint_files())
    source = f"s3://{bucket}/models/llama"
    assert run_cli(preload_args(source, shared, "--local-root", str(local)), aws_env).returncode == 0

    other_node = local.parent / "nvme-node-2"
    other_node.mkdir()
    offline_env = {**aws_env, "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}
    run = run_cli(preload_args(source, shared, "--local-root", str(other_node)), offline_env)

    assert run.returncode == 0, run.stderr
    assert not run.named("download_done")
    assert run.named("local_copy_done")[0]["files_copied"] == len(checkpoint_files())
    # Same bytes everywhere; the markers differ only in their completed_at stamp.
    assert tree_digest(other_node / "llama" / "rev1", with_marker=False) == tree_digest(
        local / "llama" / "rev1", with_marker=False
    )


def test_without_local_root_the_shared_copy_is_served(s3_client, bucket, roots, aws_env):
    shared, _local = roots
    upload_revision(s3_client, bucket, "m/rev1", {"config.json": b"{}"})

    run = run_cli(preload_args(f"s3://{bucket}/m", shared), aws_env)

    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == str(shared / "llama" / "rev1")


def test_compile_cache_dir_is_created_per_model_gpu_and_vllm_version(s3_client, bucket, roots, aws_env):
    shared, _local = roots
    upload_revision(s3_client, bucket, "m/rev1", {"config.json": b"{}"})

    run = run_cli(
        preload_args(
            f"s3://{bucket}/m",
            shared,
            "--compile-cache-gpu-type",
            "H200",
            "--compile-cache-vllm-version",
            "0.32.0",
        ),
        aws_env,
    )

    assert run.returncode == 0, run.stderr
    expected = shared / ".vllm-cache" / "llama" / "H200" / "0.32.0"
    assert expected.is_dir()
    assert run.named("compile_cache_dir")[0]["dir"] == str(expected)


def test_files_removed_from_the_revision_do_not_linger_in_a_repaired_copy(s3_client, bucket, roots, aws_env):
    shared, _local = roots
    upload_revision(s3_client, bucket, "m/rev1", {"config.json": b"{}", "model.safetensors": b"x" * MIB})
    stray = shared / "llama" / "rev1" / "stray-00002.safetensors"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"left over from something else")

    run = run_cli(preload_args(f"s3://{bucket}/m", shared), aws_env)

    assert run.returncode == 0, run.stderr
    assert not stray.exists(), "vLLM would load a stray shard, so it must go"
    assert run_cli(["verify", "--dir", str(shared / "llama" / "rev1")], aws_env).returncode == 0


def test_verify_command_accepts_a_complete_copy_and_rejects_a_tampered_one(s3_client, bucket, roots, aws_env):
    shared, _local = roots
    upload_revision(s3_client, bucket, "m/rev1", checkpoint_files())
    assert run_cli(preload_args(f"s3://{bucket}/m", shared), aws_env).returncode == 0
    directory = shared / "llama" / "rev1"
    assert run_cli(["verify", "--dir", str(directory)], aws_env).returncode == 0

    shard = directory / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[12345] ^= 0xFF  # same size: only sha256 can tell
    shard.write_bytes(bytes(data))

    assert run_cli(["verify", "--dir", str(directory), "--verify", "sizes"], aws_env).returncode == 0
    tampered = run_cli(["verify", "--dir", str(directory)], aws_env)
    assert tampered.returncode == 8
    assert "model-00001-of-00002.safetensors" in tampered.error_message
    no_marker = run_cli(["verify", "--dir", str(directory.parent)], aws_env)
    assert no_marker.returncode == 8


def test_a_canary_revision_beside_the_stable_one_leaves_it_whole_so_a_rollback_needs_no_download(
    s3_client, bucket, roots, aws_env
):
    """During a canary (docs/rollouts.md) old and new pods share nodes and the volume: preloading the
    new revision deletes nothing of the old one, and an abort's stable pods start from their copy
    with S3 unreachable."""
    shared, local = roots
    upload_revision(s3_client, bucket, "models/llama/rev1", checkpoint_files(seed=1))
    upload_revision(s3_client, bucket, "models/llama/rev2", checkpoint_files(seed=2))
    source = f"s3://{bucket}/models/llama"
    stable = preload_args(source, shared, "--local-root", str(local), revision="rev1")
    assert run_cli(stable, aws_env).returncode == 0
    before = {root: tree_digest(root / "llama" / "rev1") for root in (shared, local)}

    canary = run_cli(preload_args(source, shared, "--local-root", str(local), revision="rev2"), aws_env)

    assert canary.returncode == 0, canary.stderr
    assert canary.served_path == str(local / "llama" / "rev2")
    for root in (shared, local):
        assert tree_digest(root / "llama" / "rev1") == before[root], f"{root}: the stable revision changed"
        assert (root / "llama" / "rev2" / ".model-cache-complete.json").is_file()
    rollback = run_cli(stable, {**aws_env, "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"})
    assert rollback.returncode == 0, rollback.stderr
    assert rollback.served_path == str(local / "llama" / "rev1")
    assert not rollback.named("download_done")
