"""The Rollout and AnalysisTemplate schemas of the pinned Argo Rollouts chart, as a validator.

The CRDs come from the pinned chart's data (tests/support/charts.py: the chart's CRDs as plain
YAML, `$VLLM_PLATFORM_CHART_DATA`; tests/test_custom_resources.py checks they are the ones the
cached chart installs), and give each kind's `openAPIV3Schema`. Objects are checked against it
with `jsonschema`, strictly as the API server's field validation is: an unknown field is an error
wherever the schema lists the fields and does not keep unknown ones
(`x-kubernetes-preserve-unknown-fields`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jsonschema

from tests.support.charts import data_crds


def argo_rollouts_crds() -> Mapping[str, dict[str, Any]]:
    """Kind → CustomResourceDefinition of the argoproj.io group, from the pinned charts' data."""
    return {kind: crd for (group, kind), crd in data_crds().items() if group == "argoproj.io"}


def strict(schema: Any) -> Any:
    """The schema with `additionalProperties: false` wherever the API server would reject unknown fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


@functools.cache
def _validator(kind: str, api_version: str) -> jsonschema.Draft7Validator:
    crd = argo_rollouts_crds()[kind]
    group, _, version = api_version.partition("/")
    assert group == crd["spec"]["group"], f"{api_version} is not the CRD's group {crd['spec']['group']}"
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    return jsonschema.Draft7Validator(strict(served["schema"]["openAPIV3Schema"]))


def crd_schema_problems(obj: Mapping[str, Any]) -> list[str]:
    """What the pinned chart's CRD schema rejects in a Rollout or AnalysisTemplate ([] when valid)."""
    validator = _validator(str(obj["kind"]), str(obj["apiVersion"]))
    # metadata is the API server's ObjectMeta, not part of the CRD's own schema.
    body = {key: value for key, value in obj.items() if key != "metadata"}
    return [
        f"{'.'.join(str(part) for part in error.absolute_path) or '(root)'}: {error.message}"
        for error in sorted(validator.iter_errors(body), key=lambda error: list(map(str, error.path)))
    ]
