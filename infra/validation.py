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
    from infra.capacity.plan import capacity_problems

    return [capacity_problems, autoscaling_metric_problems, autoscaling_pipeline_problems,
            gpu_toleration_problems, gpu_registration_problems, addon_mode_problems]


def platform_problems(config: PlatformConfig) -> list[Problem]:
    problems: list[Problem] = []
    for check in platform_checks():
        problems.extend(check(config))
    return problems
