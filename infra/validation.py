"""Checks beyond the schema, run by `validate`, `render` and `pulumi preview` alike.

Each check is a pure function from the typed config to problems (stack-file key path, value,
message with the fix), so one run reports everything that is wrong at once.
"""

from __future__ import annotations

from collections.abc import Callable

from infra.config.errors import Problem
from infra.config.platform import PlatformConfig

PlatformCheck = Callable[[PlatformConfig], list[Problem]]


def platform_checks() -> list[PlatformCheck]:
    # Imported here: components/ import infra.config, which imports this module lazily.
    from components.adapter_rules import autoscaling_metric_problems
    from components.autoscaling import autoscaling_pipeline_problems
    from components.cluster_addons import addon_mode_problems
    from components.gpu_addons import gpu_registration_problems, gpu_toleration_problems
    from components.model_service import preload_source_problems
    from components.rollouts import rollout_problems
    from components.secrets import secret_reference_problems
    from components.vllm_arguments import server_argument_problems
    from infra.capacity.plan import capacity_problems
    from infra.catalogue.tuning_profiles import tuning_profile_problems

    return [capacity_problems, autoscaling_metric_problems, autoscaling_pipeline_problems,
            gpu_toleration_problems, gpu_registration_problems, addon_mode_problems,
            server_argument_problems, secret_reference_problems, ingress_host_problems,
            preload_source_problems, tuning_profile_problems, rollout_problems]


def ingress_host_problems(config: PlatformConfig) -> list[Problem]:
    """With ingress on, every model needs a hostname: models share one load balancer by host."""
    if not config.ingress.enabled:
        return []
    return [
        Problem(("models", index, "ingress_host"), None,
                "ingress is on but this model has no hostname: set ingress.domain (models get "
                "<name>.<domain>) or models[].ingress_host, or set ingress.enabled: false")
        for index, model in enumerate(config.models)
        if model.ingress_host is None
    ]


def platform_problems(config: PlatformConfig) -> list[Problem]:
    problems: list[Problem] = []
    for check in platform_checks():
        problems.extend(check(config))
    return problems
