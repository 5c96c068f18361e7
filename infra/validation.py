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
    from infra.capacity.plan import capacity_problems

    return [capacity_problems]


def platform_problems(config: PlatformConfig) -> list[Problem]:
    problems: list[Problem] = []
    for check in platform_checks():
        problems.extend(check(config))
    return problems
