"""Every expected failure ends with its exit code, a one-line message, and nothing marked complete."""

from __future__ import annotations

import json
import random
import resource
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from conftest import (
    MIB,
    MotoServer,
    Run,
    assert_not_complete,
    aws_environment,
    cli_command,
    preload_args,
    run_cli,
    start_moto_server,
    upload_revision,
)

PROTECTED_BUCKET = "protected-models"


@pytest.fixture(scope="module")
def iam_enforcing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MotoServer, dict]]:
    """A second moto server that enforces IAM: set up with auth off, then switched on through
    moto's reset-auth API. Its own process, so the shared server's tests stay unauthenticated."""
    server = start_moto_server(tmp_path_factory.mktemp("moto-iam") / "moto.log")
    admin = {
        "endpoint_url": server.endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "AKIAADMINADMINADMIN",
        "aws_secret_access_key": "admin",
    }
    s3, iam = boto3.client("s3", **admin), boto3.client("iam", **admin)
    s3.create_bucket(Bucket=PROTECTED_BUCKET)
    s3.put_object(Bucket=PROTECTED_BUCKET, Key="m/rev1/config.json", Body=b"{}")
    iam.create_user(UserName="lister")
    # Can list the revision but not read its objects: a half-done IRSA policy.
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{PROTECTED_BUCKET}"}
        ],
    }
    iam.put_user_policy(UserName="lister", PolicyName="list-only", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="lister")["AccessKey"]
    request = urllib.request.Request(
        f"{server.endpoint}/moto-api/reset-auth",
        data=b"0",
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    urllib.request.urlopen(request).close()
    yield server, {"id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    server.stop()


def _env_with_termination_log(environment: dict[str, str], tmp_path: Path) -> dict[str, str]:
    termination_log = tmp_path / "termination-log"
    termination_log.write_text("")
    return {**environment, "MODEL_CACHE_TERMINATION_LOG": str(termination_log)}


def test_object_read_denied_by_iam_exits_4_and_leaves_nothing_complete(iam_enforcing_server, roots, tmp_path):
    server, key = iam_enforcing_server
    shared, _local = roots
    env = _env_with_termination_log(aws_environment(server.endpoint, key["id"], key["secret"]), tmp_path)

    run = run_cli(preload_args(f"s3://{PROTECTED_BUCKET}/m", shared), env)

    assert run.returncode == 4, run.stderr
    assert run.error_message.startswith("access denied:") and "AccessDenied" in run.error_message
    assert "config.json" in run.error_message
    assert (tmp_path / "termination-log").read_text().startswith("model-cache: access denied:")
    assert_not_complete(shared / "llama" / "rev1")


def test_unknown_credentials_exit_4(iam_enforcing_server, roots):
    server, _key = iam_enforcing_server
    shared, _local = roots

    run = run_cli(
        preload_args(f"s3://{PROTECTED_BUCKET}/m", shared),
        aws_environment(server.endpoint, "AKIANOSUCHKEYNOSUCH", "wrong"),
    )

    assert run.returncode == 4, run.stderr
    assert "InvalidAccessKeyId" in run.error_message
    assert_not_complete(shared / "llama" / "rev1")


def test_missing_prefix_exits_3_naming_the_prefix(s3_client, bucket, roots, aws_env):
    shared, _local = roots
    upload_revision(s3_client, bucket, "m/rev1", {"config.json": b"{}"})

    run = run_cli(preload_args(f"s3://{bucket}/m", shared, revision="rev-that-was-never-uploaded"), aws_env)

    assert run.returncode == 3, run.stderr
    assert run.error_message == f"not found: no objects under s3://{bucket}/m/rev-that-was-never-uploaded/"
    assert_not_complete(shared / "llama" / "rev-that-was-never-uploaded")


def test_missing_bucket_exits_3(roots, aws_env):
    shared, _local = roots

    run = run_cli(preload_args("s3://no-such-bucket-anywhere/m", shared), aws_env)

    assert run.returncode == 3, run.stderr
    assert "NoSuchBucket" in run.error_message


def test_unanswering_endpoint_exits_6_after_retries(roots, aws_env):
    shared, _local = roots
    # A socket that completes TCP handshakes (kernel backlog) but never answers a request.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        env = {**aws_env, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        run = run_cli(
            preload_args("s3://models/m", shared, "--read-timeout-seconds", "0.5", "--max-attempts", "2"), env
        )

    assert run.returncode == 6, run.stderr
    assert run.error_message.startswith("timeout or connection failure on listing s3://models/m/rev1/")
    assert_not_complete(shared / "llama" / "rev1")


def test_destination_smaller_than_the_model_exits_5_before_downloading(s3_client, bucket, tmp_path, aws_env):
    """A real 4 MiB tmpfs, mounted in a private mount namespace (works without host root)."""
    assert shutil.which("unshare"), "util-linux unshare is needed for the tmpfs test"
    upload_revision(
        s3_client, bucket, "m/rev1", {"config.json": b"{}", "shard.safetensors": random.randbytes(6 * MIB)}
    )
    mountpoint = tmp_path / "tiny-efs"
    mountpoint.mkdir()
    listing = tmp_path / "after.txt"
    script = 'mount -t tmpfs -o size=4m tmpfs "$0" && "$@"; rc=$?; find "$0" > "$LISTING"; exit $rc'
    command = [
        "unshare",
        "--user",
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        script,
        str(mountpoint),
        *cli_command(*preload_args(f"s3://{bucket}/m", mountpoint)),
    ]
    completed = subprocess.run(
        command, env={**aws_env, "LISTING": str(listing)}, capture_output=True, text=True
    )
    run = Run(completed.returncode, completed.stdout, completed.stderr)

    assert run.returncode == 5, run.stderr
    assert run.error_message.startswith("disk full:") and "MiB free" in run.error_message
    files = listing.read_text().split()
    assert files, "the listing was taken inside the namespace"
    assert not any(name.endswith(".model-cache-complete.json") for name in files)


def test_write_failing_mid_download_with_efbig_exits_5_and_keeps_the_part_for_resume(
    s3_client, bucket, roots, aws_env
):
    """RLIMIT_FSIZE makes the kernel fail pwrite past 2 MiB (EFBIG): a real write error in the
    middle of a download, which the free-space pre-check cannot see coming."""
    shared, _local = roots
    shard = random.randbytes(3 * MIB)
    upload_revision(s3_client, bucket, "m/rev1", {"config.json": b"{}", "shard.safetensors": shard})

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 * MIB, 2 * MIB))

    # One connection: chunks 0 and 1 finish before chunk 2 hits the limit, so the resume is exact.
    completed = subprocess.run(
        cli_command(*preload_args(f"s3://{bucket}/m", shared, "--concurrency", "1")),
        env=aws_env,
        capture_output=True,
        text=True,
        preexec_fn=limit_file_size,
    )
    run = Run(completed.returncode, completed.stdout, completed.stderr)

    directory = shared / "llama" / "rev1"
    assert run.returncode == 5, run.stderr
    assert run.error_message.startswith("disk full: File too large")
    assert_not_complete(directory)
    assert not (directory / "shard.safetensors").exists()
    assert (directory / "shard.safetensors.model-cache.part").stat().st_size <= 2 * MIB

    resumed = run_cli(preload_args(f"s3://{bucket}/m", shared), aws_env)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.named("download_done")[0]["bytes_resumed"] >= 2 * MIB
    assert (directory / "shard.safetensors").read_bytes() == shard


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--model-name", "../escape"), "model name '../escape'"),
        (("--revision", ".hidden"), "revision '.hidden'"),
        (("--compile-cache-gpu-type", "H200"), "go together"),
    ],
)
def test_bad_arguments_exit_2(roots, aws_env, extra, message):
    shared, _local = roots

    run = run_cli([*preload_args("s3://models/m", shared), *extra], aws_env)

    assert run.returncode == 2, run.stderr
    assert message in run.error_message


def test_missing_shared_volume_exits_2_instead_of_filling_the_container_disk(tmp_path, aws_env):
    run = run_cli(preload_args("s3://models/m", tmp_path / "not-mounted"), aws_env)

    assert run.returncode == 2
    assert "is the volume mounted?" in run.error_message
    assert not (tmp_path / "not-mounted").exists()
