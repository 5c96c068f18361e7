"""The EFA serving image (serving-image/, issue 50): the Dockerfile and its release workflow carry exactly
what domain/versions.py says the image carries, and fetch AWS's installer only to verify it first.

The build itself runs in .github/workflows/release-vllm-efa.yaml (no registry access here); these tests
keep the files it builds from honest.
"""

from __future__ import annotations

import re

import pytest
import yaml

from domain.versions import (
    EFA_INSTALLER_SHA256,
    EFA_INSTALLER_VERSION,
    VLLM_EFA_IMAGE,
    VLLM_EFA_IMAGE_REVISION,
    VLLM_IMAGE,
    VLLM_VERSION,
    known_efa_image,
)
from tests.conftest import REPO_ROOT

DOCKERFILE = REPO_ROOT / "serving-image" / "Dockerfile"
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "release-vllm-efa.yaml"


def _arg_default(name: str) -> str:
    (value,) = re.findall(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.M)
    return value


def _run_script() -> str:
    """The Dockerfile's installer RUN instruction, its continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    (run,) = [line for line in text.splitlines() if line.startswith("RUN ") and "efa_installer.sh" in line]
    return run


def test_the_dockerfile_defaults_are_the_pins() -> None:
    assert _arg_default("VLLM_IMAGE") == VLLM_IMAGE.reference
    assert _arg_default("EFA_INSTALLER_VERSION") == EFA_INSTALLER_VERSION
    assert _arg_default("EFA_INSTALLER_SHA256") == EFA_INSTALLER_SHA256
    assert re.fullmatch(r"[0-9a-f]{64}", EFA_INSTALLER_SHA256)
    efa = VLLM_EFA_IMAGE.efa
    assert efa is not None
    assert (efa.installer_version, efa.installer_sha256) == (EFA_INSTALLER_VERSION, EFA_INSTALLER_SHA256)
    assert VLLM_EFA_IMAGE.tag == f"{VLLM_VERSION}-{VLLM_EFA_IMAGE_REVISION}"


def test_the_installer_is_verified_by_sha256_before_it_is_unpacked_or_run() -> None:
    run = _run_script()
    fetch = run.index("https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz")
    check = run.index('echo "${EFA_INSTALLER_SHA256}  efa-installer.tar.gz" | sha256sum --check --strict -')
    unpack = run.index("tar -xzf efa-installer.tar.gz")
    install = run.index("./efa_installer.sh")
    assert fetch < check < unpack < install
    # `set -e` and bash's pipefail (the SHELL line): a failed check stops the build.
    assert run.startswith("RUN set -eux;")
    assert 'SHELL ["/bin/bash", "-o", "pipefail", "-c"]' in DOCKERFILE.read_text()


def test_the_installer_runs_in_its_container_form() -> None:
    (flags,) = re.findall(r"\./efa_installer\.sh ([^;]+);", _run_script())
    # No kernel module (the node's), no limits.conf (the node's runtime sets locked memory), no device check.
    assert flags.split() == ["-y", "--skip-kmod", "--skip-limit-conf", "--no-verify"]


def test_the_image_environment_is_what_the_pin_records() -> None:
    efa = VLLM_EFA_IMAGE.efa
    assert efa is not None
    text = DOCKERFILE.read_text()
    (library_path,) = re.findall(r"^ENV LD_LIBRARY_PATH=(\S+)", text, re.M)
    # The pinned directories first; the base's own path after them, with no empty entry where it has none.
    assert library_path == ":".join(efa.library_path) + "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    assert re.search(rf"^\s+NCCL_NET_PLUGIN={efa.nccl_net_plugin}$", text, re.M)
    # The build checks the plugin of that name exists where the library path points.
    assert f"test -e {efa.library_path[0]}/libnccl-net-{efa.nccl_net_plugin}.so" in _run_script()


@pytest.mark.parametrize(
    ("reference", "known"),
    [
        (VLLM_EFA_IMAGE.reference, True),
        (f"{VLLM_EFA_IMAGE.reference}@sha256:{'0' * 64}", True),
        (VLLM_IMAGE.reference, False),
        (f"{VLLM_EFA_IMAGE.repository}:{VLLM_VERSION}-{VLLM_EFA_IMAGE_REVISION + 1}", False),
    ],
)
def test_only_the_pinned_efa_image_is_known_to_carry_efa(reference: str, known: bool) -> None:
    assert (known_efa_image(reference) is not None) is known


def test_the_release_workflow_builds_from_the_base_digest_with_the_pins_and_checks_the_image() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = workflow["jobs"]["image"]["steps"]
    by_name = {step.get("name"): step for step in steps}
    # The pins come from domain/versions.py itself, not copies in the workflow.
    meta = by_name["Pins, image name, and whether to publish"]["run"]
    assert 'spec_from_file_location("versions", "domain/versions.py")' in meta
    assert '"efa-image-v$tag"' in meta
    builds = [step for step in steps if str(step.get("uses", "")).startswith("docker/build-push-action@")]
    assert len(builds) == 2
    for build in builds:
        args = build["with"]["build-args"]
        assert "VLLM_IMAGE=${{ steps.base.outputs.reference }}" in args
        assert "EFA_INSTALLER_SHA256=${{ steps.meta.outputs.installer_sha256 }}" in args
        assert build["with"]["context"] == "serving-image"
    assert builds[0]["with"]["push"] is False
    assert builds[1]["if"] == "steps.meta.outputs.publish == 'true'"
    check = by_name["Check what the built image carries"]["run"]
    for fragment in (
        "libfabric: $LIBFABRIC_VERSION",
        "aws-ofi-nccl $AWS_OFI_NCCL_VERSION",
        "nvidia-nccl-cu13",
    ):
        assert fragment in check
    # Tags `v*` release the preloader (release-model-cache.yaml); ours must not match them.
    (tag_pattern,) = workflow[True]["push"]["tags"]
    assert not tag_pattern.startswith("v")
