"""The route and content-part-type snapshots (scripts/snapshot-vllm-routes.py) against the real vLLM
0.32.0 app they describe. The committed route table may hold more than one server's app (it was read
from the release's source, every launcher included): what matters is that no route of the real app
is missing from it, since the middleware's policy is checked against it (tests/test_route_policy.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from domain.engine_checks import CONTENT_PART_TYPES_FILE
from tests.support.vllm_server import REPO_ROOT, vllm_subprocess_env
from tests.test_route_policy import ROUTES_FILE

pytestmark = pytest.mark.e2e


def test_every_route_of_the_real_app_is_in_the_snapshot(vllm_python: Path, tmp_path: Path) -> None:
    subprocess.run(
        [str(vllm_python), "scripts/snapshot-vllm-routes.py", "--output-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    real = json.loads((tmp_path / ROUTES_FILE.name).read_text())
    committed = json.loads(ROUTES_FILE.read_text())
    committed_paths = {route["path"] for route in committed["routes"]}
    missing = sorted(route["path"] for route in real["routes"] if route["path"] not in committed_paths)
    assert missing == [], f"{ROUTES_FILE.name} misses routes of the real app: {missing}; regenerate it"
    assert len(real["routes"]) > 40
    fresh_types = json.loads((tmp_path / CONTENT_PART_TYPES_FILE.name).read_text())["content_part_types"]
    assert fresh_types == json.loads(CONTENT_PART_TYPES_FILE.read_text())["content_part_types"]
