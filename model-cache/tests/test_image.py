"""The built image runs the preloader as the pod does: in a container, as uid 10001, with the shared
and node-local volumes mounted and S3 through boto3's default chain, against the same real S3 API
(moto's server) as the other tests.

The image is localhost/model-cache:<version>, built from ../Dockerfile by
scripts/build-model-cache-image.sh on a base assembled from Debian packages (scripts/setup-test-tools.sh
runs it; no registry is reachable here). The container runs with buildah (Debian's package), as root
or through `sudo -n`. A missing or stale image (built from other sources than these) fails the test
with the command that fixes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MODEL_CACHE_DIR, Run, checkpoint_files, upload_revision

from model_cache.manifest import Manifest, ManifestEntry, write_marker

VERSION = tomllib.loads((MODEL_CACHE_DIR / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/model-cache:{VERSION}"
CONTEXT_LABEL = "org.vllm-platform.model-cache.context-sha256"
BUILD = "sudo bash scripts/build-model-cache-image.sh (scripts/setup-test-tools.sh runs it)"
SHARED, LOCAL = "/mnt/models", "/mnt/local-models"  # the mount paths components/model_service.py uses


def buildah(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    if shutil.which("buildah") is None:
        pytest.fail(f"buildah is missing: apt-get install buildah, then {BUILD}")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    return subprocess.run(
        [*sudo, "buildah", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def build_context_digest() -> str:
    """What the build script labels the image with: sha256 of `sha256sum`'s listing of every file
    the Dockerfile copies, sorted by path."""
    paths = [
        MODEL_CACHE_DIR / name
        for name in (
            "Dockerfile",
            "requirements.lock",
            "requirements-build.lock",
            "pyproject.toml",
            "README.md",
        )
    ]
    paths += [
        p
        for p in (MODEL_CACHE_DIR / "model_cache").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    listing = "".join(
        f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.relative_to(MODEL_CACHE_DIR).as_posix()}\n"
        for path in sorted(paths, key=lambda p: p.relative_to(MODEL_CACHE_DIR).as_posix().encode())
    )
    return hashlib.sha256(listing.encode()).hexdigest()


@pytest.fixture(scope="module")
def image() -> str:
    inspected = buildah("inspect", "--type", "image", IMAGE)
    if inspected.returncode != 0:
        pytest.fail(f"{IMAGE} is not built: {BUILD}\n{inspected.stderr}")
    config = json.loads(inspected.stdout)["OCIv1"]["config"]
    assert config.get("Labels", {}).get(CONTEXT_LABEL) == build_context_digest(), (
        f"{IMAGE} was built from other model-cache/ sources than these: {BUILD}"
    )
    return IMAGE


@pytest.fixture
def container(image: str) -> Iterator[str]:
    created = buildah("from", "--pull=never", image)
    assert created.returncode == 0, created.stderr
    name = created.stdout.strip().splitlines()[-1]
    yield name
    buildah("rm", name)


def run_in(container: str, args: list[str], env: dict[str, str], mounts: dict[Path, str]) -> Run:
    command = ["run", "--isolation", "chroot", "--network", "host", "--user", "10001:10001"]
    for key, value in env.items():
        command += ["--env", f"{key}={value}"]
    for host, path in mounts.items():
        command += ["--volume", f"{host}:{path}"]
    # `buildah run` does not apply the entry point; name it as the pod's `command` does.
    completed = buildah(*command, container, "--", "model-cache", *args)
    return Run(completed.returncode, completed.stdout, completed.stderr)


def pod_environment(aws_env: dict[str, str]) -> dict[str, str]:
    """Only what the pod gives the init container (credentials and endpoint in place of IRSA)."""
    environment = {key: value for key, value in aws_env.items() if key.startswith("AWS_")}
    return {**environment, "HOME": "/tmp", "TMPDIR": "/tmp", "POD_NAME": "vllm-0"}


def test_the_image_preloads_a_revision_from_s3_as_uid_10001_onto_mounted_volumes(
    s3_client, bucket, roots, aws_env, container
):
    shared, local = roots
    for root in roots:
        root.chmod(0o777)  # the pod's fsGroup makes them writable for uid 10001
    files = checkpoint_files(seed=7)
    upload_revision(s3_client, bucket, "models/llama/rev1", files)

    run = run_in(
        container,
        [
            "preload",
            "--model-name",
            "llama",
            "--source",
            f"s3://{bucket}/models/llama",
            "--revision",
            "rev1",
            "--shared-root",
            SHARED,
            "--local-root",
            LOCAL,
            "--part-size-mib",
            "1",
            "--concurrency",
            "4",
        ],
        pod_environment(aws_env),
        {shared: SHARED, local: LOCAL},
    )

    assert run.returncode == 0, run.stderr
    assert run.served_path == f"{LOCAL}/llama/rev1"
    for copy in (shared / "llama" / "rev1", local / "llama" / "rev1"):
        for name, data in files.items():
            assert (copy / name).read_bytes() == data, f"{copy}/{name}"
        marker = json.loads((copy / ".model-cache-complete.json").read_text())
        assert {entry["path"] for entry in marker["files"]} == set(files)
        assert (copy / ".model-cache-complete.json").stat().st_uid == 10001, "written by the image's user"


def test_the_image_verifies_a_cache_and_refuses_one_with_a_changed_byte(container, roots):
    shared, _ = roots
    revision = shared / "llama" / "rev1"
    revision.mkdir(parents=True)
    (revision / "weights.safetensors").write_bytes(b"\x00" * 4096)
    digest = hashlib.sha256((revision / "weights.safetensors").read_bytes()).hexdigest()
    entry = ManifestEntry(path="weights.safetensors", size=4096, sha256=digest, source_version="etag-1")
    write_marker(revision, Manifest(model_name="llama", revision="rev1", source="s3://b/p", files=(entry,)))
    mounts = {shared: SHARED}
    verify = ["verify", "--dir", f"{SHARED}/llama/rev1", "--verify", "sha256"]

    good = run_in(container, verify, {}, mounts)
    with (revision / "weights.safetensors").open("r+b") as weights:
        weights.write(b"\x01")
    changed = run_in(container, verify, {}, mounts)

    assert good.returncode == 0, good.stderr
    assert changed.returncode == 8, changed.stderr
    assert changed.error_message.startswith("integrity:"), changed.stderr
