"""Our values for every chart release, against the pinned chart's own data (no templates needed):

- every key we set exists in the chart's default values.yaml (a subchart's under its name or alias),
  so a misspelt or renamed key fails here instead of being silently ignored by Helm, except under the
  reviewed pass-through keys below, whose contents the chart hands on unread (a Kubernetes object
  field, a CLI flag map);
- where the chart ships a values.schema.json, the values Helm would see (defaults merged with ours)
  validate against it, as `helm install` would check them.

The data comes from `$VLLM_PLATFORM_CHART_DATA` (tests/support/charts.py), so this runs in CI.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
import yaml

from components.helm.cache import lock_entry_for_path
from components.helm.lock import LockedChart
from infra.render import RenderResult
from tests.conftest import EXAMPLE_STACKS, STACKS, TEST_STACKS_DIR, rendered
from tests.support.charts import chart_data, data_values, data_values_schema

ALL_STACKS = [*STACKS, *EXAMPLE_STACKS, "existing"]
# `existing` is of tests/stacks/; the shipped `multinode` adds the LWS controller and the EFA device plugin.
TEST_STACK_FILES = {"existing": "Pulumi.existing.yaml"}

# Keys whose value the chart passes through to an object or a command line without reading its
# keys, so the defaults cannot list them all. (dotted path; `*` matches one key)
PASS_THROUGH = {
    "extraArgs": "cluster-autoscaler: every entry becomes a `--key=value` flag",
    "containerSecurityContext": "a Kubernetes SecurityContext, copied into the pod spec",
    "podSecurityContext": "a Kubernetes PodSecurityContext, copied into the pod spec",
    "alertmanager.alertmanagerSpec": "the Alertmanager custom resource's spec, copied as it is",
    "*.tolerations": "a list of Kubernetes tolerations (the default is an empty list)",
    "*.resources": "Kubernetes resource requirements",
    "*.sidecar.resources": "Kubernetes resource requirements",
    "*.serviceAccount.annotations": "object annotations",
}


def _passes_through(path: str) -> bool:
    parts = path.split(".")
    for pattern in PASS_THROUGH:
        wanted = pattern.split(".")
        for start in range(len(parts) - len(wanted) + 1):
            window = parts[start : start + len(wanted)]
            if all(w in ("*", p) for w, p in zip(wanted, window, strict=True)) and (
                wanted[0] == "*" or start == 0
            ):
                return True
    return False


def _schema_keys(schema: Any) -> dict[str, Any]:
    """The keys a values schema declares, nested like values (a key with no sub-keys maps to {})."""
    properties = (schema or {}).get("properties") if isinstance(schema, dict) else None
    return {key: _schema_keys(sub) for key, sub in (properties or {}).items()}


def _with_known_keys(values: dict[str, Any], known: dict[str, Any]) -> dict[str, Any]:
    merged = dict(values)
    for key, sub in known.items():
        if key not in merged:
            merged[key] = sub
        elif isinstance(merged[key], dict) and merged[key]:
            merged[key] = _with_known_keys(merged[key], sub)
    return merged


def chart_defaults(entry: LockedChart) -> dict[str, Any]:
    """The keys the chart knows: its default values and values schema, each subchart's under its
    name (and alias) as Helm merges them, and the keys its dependencies' conditions read."""
    defaults = _with_known_keys(copy.deepcopy(data_values(entry)), _schema_keys(data_values_schema(entry)))
    meta = yaml.safe_load((chart_data(entry) / "Chart.yaml").read_text())
    for dependency in meta.get("dependencies") or ():
        key = dependency.get("alias") or dependency["name"]
        folder = chart_data(entry) / "charts" / dependency["name"]
        if (folder / "values.yaml").is_file():
            sub = data_values(entry, dependency["name"])
            sub = _with_known_keys(sub, _schema_keys(data_values_schema(entry, dependency["name"])))
            defaults[key] = _merged(sub, defaults.get(key) or {})
        for condition in str(dependency.get("condition") or "").split(","):
            *parents, leaf = condition.strip().split(".") if condition.strip() else [""]
            node = defaults
            for part in parents:
                node = node.setdefault(part, {}) if isinstance(node, dict) else {}
            if leaf and isinstance(node, dict):
                node.setdefault(leaf, None)
    return defaults


def unknown_keys(ours: Any, defaults: Any, path: str = "") -> list[str]:
    if not isinstance(ours, dict) or not isinstance(defaults, dict) or not defaults:
        return []
    found = []
    for key, value in ours.items():
        where = f"{path}.{key}" if path else key
        if _passes_through(where):
            continue
        if key not in defaults:
            found.append(where)
        else:
            found.extend(unknown_keys(value, defaults[key], where))
    return found


def _merged(defaults: Any, ours: Any) -> Any:
    if isinstance(defaults, dict) and isinstance(ours, dict):
        return {**defaults, **{k: _merged(defaults.get(k), v) for k, v in ours.items()}}
    return ours


def _render(stack: str) -> RenderResult:
    return rendered(stack, TEST_STACKS_DIR / TEST_STACK_FILES[stack] if stack in TEST_STACK_FILES else None)


@pytest.mark.parametrize("stack", ALL_STACKS)
def test_every_value_we_set_is_a_key_the_pinned_chart_has(stack: str) -> None:
    problems = []
    for release in _render(stack).helm_releases:
        entry = lock_entry_for_path(release["chart"])
        defaults = chart_defaults(entry)
        problems += [
            f"{release['name']} ({entry.label}): {key}" for key in unknown_keys(release["values"], defaults)
        ]
    assert not problems, "keys the pinned chart does not have (Helm would ignore them):\n" + "\n".join(
        problems
    )


@pytest.mark.parametrize("stack", ALL_STACKS)
def test_our_values_pass_the_charts_values_schema(stack: str) -> None:
    checked = 0
    for release in _render(stack).helm_releases:
        entry = lock_entry_for_path(release["chart"])
        schema = data_values_schema(entry)
        if schema is None:
            continue
        merged = _merged(data_values(entry), release["values"])
        errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(merged)]
        assert not errors, f"{release['name']} ({entry.label}): {errors}"
        checked += 1
    assert (
        checked
        or stack == "existing"
        or all(
            data_values_schema(lock_entry_for_path(r["chart"])) is None for r in _render(stack).helm_releases
        )
    )


def test_the_key_check_catches_a_misspelt_key() -> None:
    (release,) = [r for r in _render("prod").helm_releases if r["name"] == "dcgm-exporter"]
    entry = lock_entry_for_path(release["chart"])
    broken = {**release["values"], "servicMonitor": {"enabled": True}}
    assert unknown_keys(broken, chart_defaults(entry)) == ["servicMonitor"]
