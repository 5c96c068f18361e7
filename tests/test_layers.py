"""Issue 51: the layers (docs/architecture.md) are import-linter contracts (pyproject.toml
[tool.importlinter]) that `make test` runs (scripts/run-suite.sh). Here each contract is shown to
catch what it forbids: one wrong import, written into a scratch copy of our packages, makes the real
`lint-imports` fail and name the contract and the import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("domain", "components", "infra")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(root / "pyproject.toml")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our packages and the contracts, copied: a scratch tree to write wrong imports into."""
    root = tmp_path_factory.mktemp("layers")
    for package in PACKAGES:
        shutil.copytree(
            REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.yaml")
        )
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_repository_keeps_every_contract() -> None:
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 5 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    ("edits", "contract", "named"),
    [
        # The domain reaching up into the Kubernetes layer.
        (
            [("domain/labels.py", "import components.probes")],
            "One way down",
            "domain.labels -> components.probes",
        ),
        # The Kubernetes layer reaching into the AWS layer beside it.
        (
            [("components/labels_of_nodes.py", "import infra.aws.node_groups")],
            "The Kubernetes layer (components) and the AWS layer",
            "components.labels_of_nodes -> infra.aws.node_groups",
        ),
        # The AWS layer reaching up into the program that drives it.
        (
            [("infra/aws/helper.py", "import infra.program")],
            "imports nothing of the program",
            "infra.aws.helper",
        ),
        # Pulumi in the domain.
        ([("domain/deploy.py", "import pulumi")], "no Pulumi", "domain.deploy -> pulumi"),
        # A circle: a new domain module imports the multi-node rules, which import it back.
        (
            [
                ("domain/architecture_rules.py", "import domain.multi_node"),
                ("domain/multi_node.py", "import domain.architecture_rules"),
            ],
            "No circles",
            ".architecture_rules",
        ),
    ],
    ids=["domain-up", "kubernetes-to-aws", "aws-to-program", "pulumi-in-domain", "circle"],
)
def test_a_wrong_import_fails_its_contract(
    scratch: Path, edits: list[tuple[str, str]], contract: str, named: str
) -> None:
    originals = {
        module: (scratch / module).read_text() if (scratch / module).exists() else None for module, _ in edits
    }
    try:
        for module, wrong_import in edits:
            before = originals[module] or '"""A scratch module."""\n'
            (scratch / module).write_text(before + f"\n{wrong_import}\n")
        result = _lint_imports(scratch)
    finally:
        for module, original in originals.items():
            if original is None:
                (scratch / module).unlink()
            else:
                (scratch / module).write_text(original)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout[result.stdout.index("Broken contracts") :]
    # The contract it breaks is named with the import; the same import may break another contract
    # too (an import upwards also closes a circle with the imports that already run down).
    assert contract in broken and named in broken, broken
