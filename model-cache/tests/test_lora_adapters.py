"""LoRA adapters preloaded beside the model (issue 25) against a real S3 API (moto server): the same
lock, marker, checksums and resume as the model's own revision, and the declared rank checked."""

from __future__ import annotations

import json

from conftest import (
    assert_not_complete,
    checkpoint_files,
    preload_args,
    run_cli,
    tree_digest,
    upload_revision,
)

from model_cache.manifest import verify_directory


def adapter_files(rank: int, seed: int = 1) -> dict[str, bytes]:
    """What PEFT's save_pretrained writes: adapter_config.json and adapter_model.safetensors."""
    rng = __import__("random").Random(seed)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "v_proj"]}
    return {
        "adapter_config.json": json.dumps(config).encode(),
        "adapter_model.safetensors": rng.randbytes(300_000),
    }


def support_bot(bucket: str) -> list[str]:
    """The preloader's `--adapter` for the support-bot adapter (S3, revision v3, declared rank 16)."""
    return ["--adapter", "support-bot", f"s3://{bucket}/adapters/support", "v3", "16"]


def test_adapters_land_beside_the_model_on_both_volumes_with_markers(s3_client, bucket, roots, aws_env):
    shared, local = roots
    upload_revision(s3_client, bucket, "models/llama/rev1", checkpoint_files())
    upload_revision(s3_client, bucket, "adapters/support/v3", adapter_files(16))
    upload_revision(s3_client, bucket, "adapters/sql/v1", adapter_files(8, seed=2))

    run = run_cli(
        preload_args(
            f"s3://{bucket}/models/llama",
            shared,
            "--local-root",
            str(local),
            *support_bot(bucket),
            "--adapter",
            "sql",
            f"s3://{bucket}/adapters/sql",
            "v1",
            "8",
        ),
        aws_env,
    )

    assert run.returncode == 0, run.stderr
    assert run.served_path == str(local / "llama" / "rev1"), "stdout still names only the model"
    for root in (shared, local):
        for name, revision, files in (
            ("support-bot", "v3", adapter_files(16)),
            ("sql", "v1", adapter_files(8, 2)),
        ):
            directory = root / ".lora-adapters" / "llama" / name / revision
            assert {path: (directory / path).read_bytes() for path in files} == files
            assert verify_directory(directory, "sha256").ok, directory
    ready = {event["adapter"]: event["dir"] for event in run.named("adapter_ready")}
    assert ready == {
        "support-bot": str(local / ".lora-adapters" / "llama" / "support-bot" / "v3"),
        "sql": str(local / ".lora-adapters" / "llama" / "sql" / "v1"),
    }


def test_a_second_pod_reuses_the_adapters_without_the_source(s3_client, bucket, roots, aws_env):
    shared, local = roots
    upload_revision(s3_client, bucket, "models/llama/rev1", checkpoint_files())
    upload_revision(s3_client, bucket, "adapters/support/v3", adapter_files(16))
    args = preload_args(
        f"s3://{bucket}/models/llama",
        shared,
        "--local-root",
        str(local),
        *support_bot(bucket),
    )
    assert run_cli(args, aws_env).returncode == 0
    adapter = local / ".lora-adapters" / "llama" / "support-bot" / "v3"
    before = tree_digest(adapter)

    second = run_cli(args, {**aws_env, "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"})

    assert second.returncode == 0, second.stderr
    assert not second.named("download_done")
    assert tree_digest(adapter) == before


def test_an_adapter_whose_rank_differs_from_the_declared_one_fails_the_pod(s3_client, bucket, roots, aws_env):
    shared, _ = roots
    upload_revision(s3_client, bucket, "models/llama/rev1", checkpoint_files())
    upload_revision(s3_client, bucket, "adapters/support/v3", adapter_files(32))

    run = run_cli(
        preload_args(
            f"s3://{bucket}/models/llama",
            shared,
            *support_bot(bucket),
        ),
        aws_env,
    )

    assert run.returncode == 8, run.stderr
    assert "has rank r=32 in adapter_config.json, but the stack declares rank 16" in run.error_message


def test_a_missing_adapter_fails_with_not_found_and_leaves_no_marker(s3_client, bucket, roots, aws_env):
    shared, _ = roots
    upload_revision(s3_client, bucket, "models/llama/rev1", checkpoint_files())

    run = run_cli(
        preload_args(
            f"s3://{bucket}/models/llama",
            shared,
            *support_bot(bucket),
        ),
        aws_env,
    )

    assert run.returncode == 3, run.stderr
    assert_not_complete(shared / ".lora-adapters" / "llama" / "support-bot" / "v3")


def test_an_adapter_name_that_is_not_one_path_component_is_a_usage_error(bucket, roots, aws_env):
    shared, _ = roots
    run = run_cli(
        preload_args(
            f"s3://{bucket}/models/llama", shared, "--adapter", "../x", f"s3://{bucket}/a", "v1", "8"
        ),
        aws_env,
    )
    assert run.returncode == 2
    assert "adapter name '../x'" in run.error_message
