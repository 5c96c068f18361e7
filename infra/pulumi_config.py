"""The running stack's config, read through Pulumi's own config (the program's step before the
domain types it): the one place the config layer meets Pulumi, so the domain imports none of it."""

from __future__ import annotations

import json
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config

from domain.config import ConfigError, PlatformConfig
from domain.config.errors import PROJECT_NAMESPACE
from domain.config.loader import namespace_problems, parse_platform_config, project_values


def read_pulumi_config(stack_file_display: str = "the stack's config") -> dict[str, Any]:
    """The `vllm-platform:*` values of the running stack, read through pulumi.Config.

    Every key the engine passed is read (not only the known ones) so a typo at the top level is
    reported like any other unknown key instead of being silently ignored.
    """
    flat = {**dict(runtime_config.CONFIG.get()), **runtime_config.get_config_env()}
    problems = namespace_problems(flat)
    if problems:
        raise ConfigError(stack_file_display, problems)
    names = set(project_values(flat))
    config = pulumi.Config(PROJECT_NAMESPACE)
    values: dict[str, Any] = {}
    for name in sorted(names):
        raw = config.get(name)
        if raw is None:
            continue
        try:
            values[name] = json.loads(raw)
        except json.JSONDecodeError:
            values[name] = raw
    return values


def load_pulumi_config(*, stack_file_display: str | None = None) -> tuple[PlatformConfig, str]:
    """Parse and type the running stack's config; returns it and the stack file name errors show."""
    stack = pulumi.get_stack()
    shown = stack_file_display or f"stacks/Pulumi.{stack}.yaml"
    return parse_platform_config(read_pulumi_config(shown), stack=stack, stack_file=shown), shown
