"""The Go tools' pins (domain/versions.py GO_TOOLS) agree with the wrapper modules go build obeys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from domain.versions import GO_TOOLS

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def required_version(go_mod: str, module: str) -> str | None:
    """The version a go.mod requires of `module` (single-line or block form), else None."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(\S+)", go_mod, re.MULTILINE)
    return match.group(1) if match else None


@pytest.mark.parametrize("pin", GO_TOOLS, ids=[pin.wrapper for pin in GO_TOOLS])
def test_each_pin_is_the_version_its_wrapper_module_requires(pin):
    go_mod = (TOOLS / pin.wrapper / "go.mod").read_text()
    assert required_version(go_mod, pin.module) == pin.version
    assert (TOOLS / pin.wrapper / "go.sum").is_file(), "go build needs the checksums committed"


def test_every_wrapper_module_has_a_pin():
    wrappers = {path.parent.name for path in TOOLS.glob("*/go.mod")}
    assert wrappers == {pin.wrapper for pin in GO_TOOLS}


def test_kubernetes_staging_modules_are_replaced_by_the_same_release():
    # k8s.io/kubernetes v1.X.Y needs every staging module at v0.X.Y; a mismatch builds a control
    # plane from two releases.
    go_mod = (TOOLS / "kubernetes" / "go.mod").read_text()
    release = required_version(go_mod, "k8s.io/kubernetes")
    assert release and release.startswith("v1.")
    staging = "v0." + release.removeprefix("v1.")
    replaced = re.findall(r"^\s*(k8s\.io/[\w-]+) => (k8s\.io/[\w-]+) (\S+)$", go_mod, re.MULTILINE)
    assert len(replaced) > 20
    assert all(source == target and version == staging for source, target, version in replaced)


def test_build_script_builds_every_pinned_program():
    script = (TOOLS / "build.sh").read_text()
    for pin in GO_TOOLS:
        assert f"build {pin.wrapper} " in script
