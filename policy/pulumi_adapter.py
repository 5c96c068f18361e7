"""Turns the plain rules of vllm_policies into pulumi_policy policies (without building the pack).

Building the PolicyPack starts its gRPC server and serves forever, so that happens only in
__main__.py; this module can be imported and tested.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

try:  # imported as policy.pulumi_adapter (tests, from the repository root)
    from . import vllm_policies
except ImportError:  # run by the Pulumi CLI from the pack's directory
    import vllm_policies  # type: ignore[no-redef]

PACK_NAME = "vllm-platform"
GPU_TAINT_KEYS_CONFIG = "gpuTaintKeys"
_TAINT_KEYS_SCHEMA = PolicyConfigSchema(
    properties={
        GPU_TAINT_KEYS_CONFIG: {
            "type": "array",
            "items": {"type": "string"},
            "default": list(vllm_policies.DEFAULT_GPU_TAINT_KEYS),
            "description": "Taint keys GPU nodes carry (node_groups.gpu.*.taints[].key of the stack).",
        }
    }
)


def settings_from_config(config: Mapping[str, Any]) -> vllm_policies.PolicySettings:
    keys = config.get(GPU_TAINT_KEYS_CONFIG)
    if not keys:
        return vllm_policies.PolicySettings()
    return vllm_policies.PolicySettings(gpu_taint_keys=tuple(str(key) for key in keys))


def _ignored(opts: Any) -> tuple[str, ...]:
    """The resource's ignore_changes (PolicyResourceOptions; absent in some engine versions)."""
    return tuple(getattr(opts, "ignore_changes", None) or ())


def _resource_validation(rule: vllm_policies.Rule):
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        resource = vllm_policies.Resource(
            args.resource_type, args.name, args.props, args.urn, _ignored(args.opts)
        )
        for message in rule.check(resource, settings_from_config(args.get_config())):
            report_violation(f"{resource.label}: {message}", None)

    return validate


def _stack_validation(rule: vllm_policies.Rule):
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources: Sequence[vllm_policies.Resource] = [
            vllm_policies.Resource(r.resource_type, r.name, r.props, r.urn, _ignored(r.opts))
            for r in args.resources
        ]
        for violation in rule.check(resources, settings_from_config(args.get_config())):
            urn = violation.resource.urn if violation.resource and violation.resource.urn else None
            report_violation(str(violation), urn)

    return validate


def build_policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    """One Pulumi policy per rule, all mandatory: a violation fails the preview."""
    policies: list[ResourceValidationPolicy | StackValidationPolicy] = []
    for rule in vllm_policies.RULES:
        schema = _TAINT_KEYS_SCHEMA if rule.check is vllm_policies.check_gpu_pods_target_gpu_nodes else None
        if rule.scope == "resource":
            policies.append(
                ResourceValidationPolicy(
                    name=rule.name,
                    description=rule.description,
                    validate=_resource_validation(rule),
                    enforcement_level=EnforcementLevel.MANDATORY,
                    config_schema=schema,
                )
            )
        else:
            policies.append(
                StackValidationPolicy(
                    name=rule.name,
                    description=rule.description,
                    validate=_stack_validation(rule),
                    enforcement_level=EnforcementLevel.MANDATORY,
                    config_schema=schema,
                )
            )
    return policies
