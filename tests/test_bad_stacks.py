"""Deliberately broken stack files (tests/bad-stacks/): each fails `validate` with exit code 2 and a
message naming the key path and the fix.

Each file states what it expects in `# expect:` header lines; a line starting with `vllm-platform:`
is a key path (every reported problem must be at one of those, so a file breaks only in the way it
says), the others are fragments of the message.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from domain.config import ConfigError
from domain.config.loader import display_path
from infra.stack_checks import load_stack
from tests.conftest import REPO_ROOT

BAD_STACKS_DIR = Path(__file__).resolve().parent / "bad-stacks"
CLI = Path(sys.executable).parent / "vllm-platform"
EXIT_INVALID_CONFIG = 2
# A key path, or the whole namespace (`vllm-platform = ...`) for problems with the stack file's keys.
KEY_PATH_PREFIXES = ("vllm-platform:", "vllm-platform =")


@dataclass(frozen=True)
class BadStack:
    path: Path
    key_paths: tuple[str, ...]
    fragments: tuple[str, ...]

    @property
    def expected(self) -> tuple[str, ...]:
        return self.key_paths + self.fragments


def _read_bad_stack(path: Path) -> BadStack:
    expects = [
        line.removeprefix("# expect:").strip()
        for line in path.read_text().splitlines()
        if line.startswith("# expect:")
    ]
    return BadStack(
        path,
        key_paths=tuple(e for e in expects if e.startswith(KEY_PATH_PREFIXES)),
        fragments=tuple(e for e in expects if not e.startswith(KEY_PATH_PREFIXES)),
    )


BAD_STACKS = [_read_bad_stack(path) for path in sorted(BAD_STACKS_DIR.glob("*.yaml"))]
# A few through the real console script (argument parsing, stderr, exit code); all through the API.
CLI_CASES = (
    "typo-nested-key",
    "unknown-gpu-group",
    "dropped-vllm-flag",
    "renamed-metric",
    "duplicate-yaml-key",
    "typo-config-namespace",
    "unpinned-preloader-image",
    "canary-no-surge-room",
)


def test_every_bad_stack_file_says_what_it_expects() -> None:
    assert len(BAD_STACKS) >= 15
    for bad in BAD_STACKS:
        assert bad.key_paths, f"{bad.path.name}: no '# expect: vllm-platform:...' key path line"
        assert bad.fragments, f"{bad.path.name}: no '# expect:' message fragment line"


@pytest.mark.parametrize("bad", BAD_STACKS, ids=lambda bad: bad.path.stem)
def test_bad_stack_is_rejected_at_its_key_path_with_the_fix(bad: BadStack) -> None:
    with pytest.raises(ConfigError) as caught:
        load_stack("bad", stack_file=bad.path)
    message = str(caught.value)
    assert message.startswith(f"{display_path(bad.path)}: invalid config")
    for expected in bad.expected:
        assert expected in message, f"{bad.path.name}: {expected!r} missing from:\n{message}"
    keys = [line.split(" =")[0].strip() for line in bad.key_paths]
    unexpected = [
        problem.key_path()
        for problem in caught.value.problems
        if not any(
            problem.key_path() == key or problem.key_path().startswith((f"{key}.", f"{key}[")) for key in keys
        )
    ]
    assert unexpected == [], f"{bad.path.name} breaks more than it says:\n{message}"


@pytest.mark.parametrize("name", CLI_CASES)
def test_validate_command_exits_2_with_the_message_on_stderr(name: str) -> None:
    bad = _read_bad_stack(BAD_STACKS_DIR / f"{name}.yaml")
    completed = subprocess.run(
        [str(CLI), "validate", "bad", "--file", str(bad.path.relative_to(REPO_ROOT))],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == EXIT_INVALID_CONFIG, completed.stdout + completed.stderr
    assert completed.stdout == ""
    assert completed.stderr.startswith(f"tests/bad-stacks/{name}.yaml: invalid config")
    for expected in bad.expected:
        assert expected in completed.stderr
    assert "Traceback" not in completed.stderr


RENDER_CRASHERS = ("bottlerocket-gpu-group-with-local-nvme", "system-group-mixed-architectures")


@pytest.mark.parametrize("name", RENDER_CRASHERS)
def test_render_refuses_what_crashed_it_with_the_message_not_a_traceback(name: str, tmp_path: Path) -> None:
    """Both went through `validate` and then crashed `render` in the AWS layer (issue 34)."""
    bad = _read_bad_stack(BAD_STACKS_DIR / f"{name}.yaml")
    completed = subprocess.run(
        [str(CLI), "render", "bad", "--file", str(bad.path), "--out", str(tmp_path / "out")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == EXIT_INVALID_CONFIG, completed.stdout + completed.stderr
    assert "Traceback" not in completed.stderr
    for expected in bad.expected:
        assert expected in completed.stderr
