#!/usr/bin/env python3
"""Write infra/data/kubernetes-api-versions.json: the built-in API versions each supported Kubernetes
version serves, read from kubernetes-validate's schemas (the OpenAPI documents of those releases).

The offline chart render gives them to Helm as `.Capabilities.APIVersions` (a chart asks, e.g.,
`.Capabilities.APIVersions.Has "apiregistration.k8s.io/v1"`), as a real cluster would.
tests/test_helm_engine.py regenerates the snapshot and compares.

    .venv/bin/python scripts/snapshot-kubernetes-api-versions.py [--check]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from domain.versions import SUPPORTED_KUBERNETES_VERSIONS  # noqa: E402

SNAPSHOT = REPO_ROOT / "infra" / "data" / "kubernetes-api-versions.json"


def api_versions(kubernetes_version: str) -> list[str]:
    """`group/version` and `group/version/Kind` of every top-level kind (core group: `v1`, `v1/Pod`)."""
    import kubernetes_validate

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    (schema_dir,) = sorted(root.glob(f"v{kubernetes_version}.*-local-strict"))[-1:]
    found: set[str] = set()
    for path in schema_dir.glob("*.json"):
        for gvk in json.loads(path.read_text()).get("x-kubernetes-group-version-kind") or []:
            group_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            if gvk["kind"].endswith(("List", "Options", "Event")) and gvk["kind"] != "Event":
                continue
            found.update({group_version, f"{group_version}/{gvk['kind']}"})
    return sorted(found)


def snapshot() -> dict[str, list[str]]:
    return {version: api_versions(version) for version in SUPPORTED_KUBERNETES_VERSIONS}


def main() -> int:
    current = snapshot()
    if "--check" in sys.argv:
        return 0 if json.loads(SNAPSHOT.read_text()) == current else 1
    SNAPSHOT.write_text(json.dumps(current, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
