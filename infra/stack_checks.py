"""Loading a stack and checking it: the one way from a stack file (or the running stack) to a config
the program may build from.

    stack file ──► infra.config (parse, type, stack defaults) ──► infra.validation (checks across
    components, over the config and its capacity plan) ──► the program

The config layer never imports components/; the checks here may, since they are about how the
components will use the config.
"""

from __future__ import annotations

from pathlib import Path

from components.helm.lock import LOCK_PATH, lock_problems
from infra.config import ConfigError, PlatformConfig, load_pulumi_config, load_stack_config
from infra.config.loader import display_path, stack_file_for


class ChartLockError(ConfigError):
    """The chart lock cannot pin what infra/versions.py pins: no stack may render or deploy."""

    def __init__(self, problems: list[tuple[str, str, str]]) -> None:
        self.lock_problems = problems
        super().__init__(str(display_path(LOCK_PATH)), [])

    def render(self) -> str:
        count = len(self.lock_problems)
        lines = [f"{self.stack_file}: invalid chart lock ({count} problem{'s' if count != 1 else ''})"]
        for key, value, fix in self.lock_problems:
            lines += [f"  {key} = {value}", f"    {fix}"]
        return "\n".join(lines)


def check_chart_lock() -> None:
    """Every chart pin has a lock entry at its version and repository, and every entry a digest."""
    from infra import versions

    pins = {
        pin.chart: (pin.version, pin.repository)
        for name, pin in vars(versions).items()
        if name.endswith("_CHART") and isinstance(pin, versions.ChartPin)
    }
    problems = lock_problems(pins)
    if problems:
        raise ChartLockError(problems)


def check_platform(config: PlatformConfig, *, stack_file: str) -> PlatformConfig:
    """Every cross-component check; raises one ConfigError listing every problem found."""
    from infra.validation import platform_problems

    check_chart_lock()
    problems = platform_problems(config)
    if problems:
        raise ConfigError(stack_file, problems)
    return config


def config_warnings(config: PlatformConfig, *, stack_file: str) -> list[str]:
    """Valid but probably unintended settings, one line each (`validate` and `render` print them to
    stderr, `pulumi preview` as warnings); never a reason to stop."""
    from infra.capacity.plan import scale_to_zero_warnings
    from infra.config.tenants import tenant_warnings

    return [
        f"{stack_file}: warning: {w.key_path()} = {w.value!r}: {w.message}"
        for w in [*tenant_warnings(config), *scale_to_zero_warnings(config)]
    ]


def load_stack(stack: str, *, stack_file: Path | None = None) -> PlatformConfig:
    """Parse and fully check a stack file (what `vllm-platform validate` runs)."""
    path = stack_file or stack_file_for(stack)
    return check_platform(load_stack_config(stack, stack_file=path), stack_file=display_path(path))


def load_from_pulumi(*, stack_file_display: str | None = None) -> PlatformConfig:
    """Parse and fully check the running stack's config (what `pulumi preview/up` runs)."""
    config, shown = load_pulumi_config(stack_file_display=stack_file_display)
    return check_platform(config, stack_file=shown)
