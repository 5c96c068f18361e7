"""Values the AWS layer sends, checked against the AWS APIs' own limits before anything is created.

The reference is botocore's service model (the JSON every AWS SDK is generated from): each request
member has a shape with its length, count, pattern and enum limits. EKS refuses a `CreateNodegroup`
whose label or taint breaks them only at `pulumi up`, after the VPC and the cluster exist (issue 40),
so `validate` walks the same request the AWS layer builds (`node_group_specs`, `eks_taints`,
`autoscaler_tags`) through those shapes instead of hard-coding numbers.

Covered (every value of these requests that comes from the stack file):
- EKS `CreateNodegroup` of the system and every GPU group: `labels` (labelKey/labelValue, 1-63
  characters each: a Kubernetes label key with a prefix, or an empty value, is refused), `taints`
  (taintKey 1-63, taintValue 0-63, effect), `tags`, `scalingConfig`.
- Auto Scaling `CreateOrUpdateTags` (the Cluster Autoscaler's node-template tags, one per label and
  taint of a group): TagKey 1-128, TagValue 0-256.
- EKS `CreateCluster` `name` and `logging` (the control-plane log types).
Node group names have no limit in the model (the API documents none there), so none is checked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from botocore.model import ListShape, MapShape, OperationModel, Shape, StructureShape
from botocore.session import get_session

from domain.config.errors import Problem
from domain.config.platform import PlatformConfig
from infra.aws.node_groups import SYSTEM_GROUP, eks_taints, node_group_specs


@cache
def operation_model(service: str, operation: str) -> OperationModel:
    """botocore's model of one API call, from the service JSON installed with botocore."""
    return get_session().get_service_model(service).operation_model(operation)


@dataclass(frozen=True)
class LimitViolation:
    at: tuple[str | int, ...]
    """Where in the request (member names, map keys, list indexes; a map key itself ends in `key`)."""
    value: Any
    limit: str
    """The broken limit in words, naming the shape (e.g. `labelValue: 1 to 63 characters`)."""


def _range_text(shape: Shape, unit: str) -> str:
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    if low is not None and high is not None:
        return f"{low} to {high} {unit}"
    return f"at least {low} {unit}" if low is not None else f"at most {high} {unit}"


def _outside(shape: Shape, size: int) -> bool:
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    return (low is not None and size < low) or (high is not None and size > high)


def shape_violations(shape: Shape, value: Any, at: tuple[str | int, ...] = ()) -> list[LimitViolation]:
    """Every limit of `shape` that `value` breaks (strings, numbers, lists, maps, structures)."""
    found: list[LimitViolation] = []
    if isinstance(shape, StructureShape):
        for name, member in value.items():
            found += shape_violations(shape.members[name], member, (*at, name))
    elif isinstance(shape, MapShape):
        if _outside(shape, len(value)):
            found.append(LimitViolation(at, len(value), f"{shape.name}: {_range_text(shape, 'entries')}"))
        for key, item in value.items():
            found += shape_violations(shape.key, key, (*at, key, "key"))
            found += shape_violations(shape.value, item, (*at, key))
    elif isinstance(shape, ListShape):
        if _outside(shape, len(value)):
            found.append(LimitViolation(at, len(value), f"{shape.name}: {_range_text(shape, 'items')}"))
        for index, item in enumerate(value):
            found += shape_violations(shape.member, item, (*at, index))
    elif shape.type_name == "string":
        enum = shape.metadata.get("enum")
        pattern = shape.metadata.get("pattern")
        if _outside(shape, len(value)):
            found.append(LimitViolation(at, value, f"{shape.name}: {_range_text(shape, 'characters')}"))
        elif enum and value not in enum:
            found.append(LimitViolation(at, value, f"{shape.name}: one of {', '.join(enum)}"))
        elif pattern and _python_pattern(pattern) is not None and not _python_pattern(pattern).match(value):
            found.append(LimitViolation(at, value, f"{shape.name}: matching {pattern}"))
    elif shape.type_name in ("integer", "long") and _outside(shape, value):
        found.append(LimitViolation(at, value, f"{shape.name}: {_range_text(shape, '')}".rstrip()))
    return found


@cache
def _python_pattern(pattern: str) -> re.Pattern[str] | None:
    """AWS patterns are Java regular expressions; the ones Python cannot read (surrogate ranges such
    as the tag shapes' "any character") are skipped rather than guessed."""
    try:
        return re.compile(pattern)
    except re.error:
        return None


def request_violations(service: str, operation: str, request: Mapping[str, Any]) -> list[LimitViolation]:
    return shape_violations(operation_model(service, operation).input_shape, dict(request))


def aws_api_limit_problems(config: PlatformConfig) -> list[Problem]:
    """Mode `eks`: every value the node groups and the cluster send, against botocore's shapes."""
    assert config.cluster.name is not None  # resolve_stack_defaults fills it
    cluster_name = config.cluster.name
    problems: list[Problem] = []
    logging = config.cluster.control_plane_logging
    cluster_request = {"name": cluster_name, "logging": {"clusterLogging": [{"types": list(logging)}]}}
    for violation in request_violations("eks", "CreateCluster", cluster_request):
        limit = f"EKS CreateCluster takes {violation.limit} (botocore's eks model)"
        if violation.at[0] == "logging":
            index = violation.at[-1]
            problems.append(Problem(("cluster", "control_plane_logging", index), violation.value, limit))
        else:
            problems.append(Problem(("cluster", "name"), cluster_name, limit))
    for spec in node_group_specs(cluster_name, config.node_groups):
        if spec.name == SYSTEM_GROUP:
            group_path: tuple[str | int, ...] = ("node_groups", "system")
            own_labels = config.node_groups.system.labels
        else:
            group_path = ("node_groups", "gpu", spec.name)
            own_labels = config.node_groups.gpu[spec.name].labels
        request = {
            "clusterName": cluster_name,
            "nodegroupName": f"{cluster_name}-{spec.name}",
            "scalingConfig": {
                "minSize": spec.min_size,
                "maxSize": spec.max_size,
                "desiredSize": spec.desired_size,
            },
            "labels": spec.labels,
            "taints": eks_taints(spec.taints),
            "tags": {"Name": f"{cluster_name}-{spec.name}"},
        }
        for violation in request_violations("eks", "CreateNodegroup", request):
            problems.append(_node_group_problem(violation, group_path, own_labels, spec.name))
        tags = [{"Key": key, "Value": value} for key, value in spec.autoscaler_tags.items()]
        for violation in request_violations("autoscaling", "CreateOrUpdateTags", {"Tags": tags}):
            index = violation.at[1]
            assert isinstance(index, int)
            key = tags[index]["Key"]
            problems.append(
                Problem(
                    group_path,
                    key,
                    f"the Cluster Autoscaler's node-template tag {key!r} (one per label and taint of "
                    f"this group) breaks Auto Scaling CreateOrUpdateTags' {violation.limit} (botocore): "
                    "shorten the label or taint it is made from",
                )
            )
    return problems


def _node_group_problem(
    violation: LimitViolation, group_path: tuple[str | int, ...], own_labels: Mapping[str, str], group: str
) -> Problem:
    at = violation.at
    limit = f"EKS CreateNodegroup takes {violation.limit} (botocore's eks model)"
    if at[0] == "labels":
        key = at[1] if len(at) > 1 else None
        if key is None:
            return Problem((*group_path, "labels"), violation.value, f"{limit}; use fewer labels")
        if key not in own_labels:
            return Problem(
                group_path,
                group,
                f"the label {key!r} the platform adds from this group's name: "
                f"{limit}; shorten the group's name",
            )
        path = (*group_path, "labels", key)
        if at[-1] == "key":
            return Problem(
                path,
                key,
                f"the label key: {limit}; shorten it (the prefix counts: EKS takes "
                "63 characters in all, where Kubernetes allows a 253-character prefix)",
            )
        if violation.value == "":
            return Problem(
                path,
                "",
                f"the label value: {limit}; EKS refuses an empty value, which "
                "Kubernetes allows: give it one (e.g. 'true') or remove the label",
            )
        return Problem(path, violation.value, f"the label value: {limit}; shorten it")
    if at[0] == "taints" and len(at) < 3:
        return Problem((*group_path, "taints"), violation.value, f"{limit}; use fewer taints")
    if at[0] == "taints":
        index, field = at[1], at[2]
        fix = "shorten it; every GPU workload tolerates the same taint, so nothing else changes"
        return Problem(
            (*group_path, "taints", index, field), violation.value, f"the taint's {field}: {limit}; {fix}"
        )
    if at[0] == "scalingConfig":
        field = {"minSize": "min_size", "maxSize": "max_size", "desiredSize": "desired_size"}[str(at[1])]
        return Problem((*group_path, field), violation.value, f"{limit}")
    # The group's name reaches the request in its tags and name.
    return Problem(group_path, group, f"{'.'.join(map(str, at))}: {limit}; shorten the group's name")
