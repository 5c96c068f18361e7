"""Shared fixtures: a real S3 API (moto's server in its own process on 127.0.0.1) and a way to run
the `model-cache` CLI as a real subprocess, parsing its JSON logs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from boto3.s3.transfer import TransferConfig

MIB = 1024 * 1024
MODEL_CACHE_DIR = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class MotoServer:
    endpoint: str
    process: subprocess.Popen

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_moto_server(log_path: Path, extra_env: dict[str, str] | None = None) -> MotoServer:
    port = free_port()
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(extra_env or {})},
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with {process.returncode}; see {log_path}")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            return MotoServer(endpoint, process)
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto server did not answer on {endpoint} within 30 s; see {log_path}")


def aws_environment(
    endpoint: str, access_key: str = "testing", secret_key: str = "testing"
) -> dict[str, str]:
    """Credentials through boto3's default chain (env), endpoint through AWS_ENDPOINT_URL_S3:
    exactly how the preloader meets IRSA in the cluster, minus the web identity."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AWS_", "HF_")) and key != "POD_NAME"
    }
    environment.update(
        AWS_ACCESS_KEY_ID=access_key,
        AWS_SECRET_ACCESS_KEY=secret_key,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL_S3=endpoint,
        AWS_CONFIG_FILE="/nonexistent/aws-config",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent/aws-credentials",
        AWS_EC2_METADATA_DISABLED="true",
    )
    return environment


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto_server(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_client(moto_server: MotoServer):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=moto_server.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def bucket(s3_client) -> str:  # type: ignore[no-untyped-def]
    name = f"models-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


def upload_revision(s3_client, bucket: str, prefix: str, files: dict[str, bytes]) -> None:  # type: ignore[no-untyped-def]
    """Files above 5 MiB go up as multipart (5 MiB parts) so their ETags are 'md5-N' like real
    checkpoints uploaded by awscli; smaller ones are single PUTs with plain MD5 ETags."""
    config = TransferConfig(multipart_threshold=5 * MIB + 1, multipart_chunksize=5 * MIB)
    for name, data in files.items():
        key = f"{prefix}/{name}"
        if len(data) > 5 * MIB:
            import io

            s3_client.upload_fileobj(io.BytesIO(data), bucket, key, Config=config)
        else:
            s3_client.put_object(Bucket=bucket, Key=key, Body=data)


def checkpoint_files(seed: int = 0, shard_mib: tuple[float, ...] = (3, 2.5)) -> dict[str, bytes]:
    """A small checkpoint shaped like a real one: json files plus safetensors shards."""
    rng = __import__("random").Random(seed)
    files = {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "seed": seed}).encode(),
        "tokenizer/tokenizer.json": json.dumps({"vocab": list(range(50))}).encode(),
        "empty.txt": b"",
    }
    for index, mib in enumerate(shard_mib, start=1):
        files[f"model-{index:05d}-of-{len(shard_mib):05d}.safetensors"] = rng.randbytes(int(mib * MIB))
    return files


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict]:
        parsed = []
        for line in self.stderr.splitlines():
            try:
                parsed.append(json.loads(line))
            except ValueError:
                parsed.append({"event": "unparsed", "line": line})
        return parsed

    def named(self, event: str) -> list[dict]:
        return [record for record in self.events if record.get("event") == event]

    @property
    def error_message(self) -> str:
        errors = self.named("error")
        return errors[-1]["message"] if errors else ""

    @property
    def served_path(self) -> str:
        return self.stdout.strip().splitlines()[-1]


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "model_cache", *args]


def run_cli(args: list[str], env: dict[str, str], timeout: float = 60) -> Run:
    completed = subprocess.run(cli_command(*args), env=env, capture_output=True, text=True, timeout=timeout)
    return Run(completed.returncode, completed.stdout, completed.stderr)


def preload_args(
    source: str, shared_root: Path, *extra: str, model: str = "llama", revision: str = "rev1"
) -> list[str]:
    return [
        "preload",
        "--model-name",
        model,
        "--source",
        source,
        "--revision",
        revision,
        "--shared-root",
        str(shared_root),
        "--part-size-mib",
        "1",
        "--concurrency",
        "4",
        "--progress-interval-seconds",
        "0.5",
        *extra,
    ]


def tree_digest(directory: Path, with_marker: bool = True) -> dict[str, str]:
    """Relative path -> sha256 of every file, to compare trees byte for byte."""
    import hashlib

    return {
        path.relative_to(directory).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and (with_marker or path.name != ".model-cache-complete.json")
    }


def assert_not_complete(directory: Path) -> None:
    """The invariant of the whole design: after a failure nothing looks servable."""
    assert not (directory / ".model-cache-complete.json").exists(), (
        f"{directory} has a marker after a failure"
    )


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    shared, local = tmp_path / "efs", tmp_path / "nvme"
    shared.mkdir()
    local.mkdir()
    return shared, local


@pytest.fixture
def aws_env(moto_server: MotoServer, tmp_path: Path) -> dict[str, str]:
    environment = aws_environment(moto_server.endpoint)
    termination_log = tmp_path / "termination-log"
    termination_log.write_text("")
    environment["MODEL_CACHE_TERMINATION_LOG"] = str(termination_log)
    return environment
