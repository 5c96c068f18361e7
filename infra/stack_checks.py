"""Loading a stack and checking it: the one way from a stack file (or the running stack) to a config
the program may build from.

    stack file ──► domain.config (parse, type, stack defaults) ──► platform_checks: the domain's
    checks (domain/validation.py, engine_checks.py, secret_checks.py, placement_checks.py, the
    capacity plan, the multi-node rules) with the Kubernetes components' own checks beside what they
    render ──► the program

The domain never imports components/; the checks here may, since this module is the program's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from components.helm.lock import LOCK_PATH, lock_problems
from domain.config import ConfigError, PlatformConfig, Problem, load_stack_config
from domain.config.loader import display_path, stack_file_for


class ChartLockError(ConfigError):
    """The chart lock cannot pin what domain/versions.py pins: no stack may render or deploy."""

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
    from domain import versions

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
    check_chart_lock()
    problems = platform_problems(config)
    if problems:
        raise ConfigError(stack_file, problems)
    return config


def config_warnings(config: PlatformConfig, *, stack_file: str) -> list[str]:
    """Valid but probably unintended settings, one line each (`validate` and `render` print them to
    stderr, `pulumi preview` as warnings); never a reason to stop."""
    from domain.capacity.plan import scale_to_zero_warnings
    from domain.config.tenants import tenant_warnings

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
    from infra.pulumi_config import load_pulumi_config  # Pulumi is imported only by the program

    config, shown = load_pulumi_config(stack_file_display=stack_file_display)
    return check_platform(config, stack_file=shown)


PlatformCheck = Callable[[PlatformConfig], list[Problem]]


def platform_checks() -> list[PlatformCheck]:
    # Imported when the checks run: the renderers' own checks sit beside what they render
    # (components/), so the program, which may import every layer, gathers them here.
    from components.adapter_rules import autoscaling_metric_problems
    from components.autoscaling import autoscaling_pipeline_problems
    from components.cluster_addons import addon_mode_problems, addon_provider_problems
    from components.gpu_addons import gpu_registration_problems, gpu_toleration_problems
    from components.preload import preload_source_problems
    from components.rollouts import rolling_surge_problems, rollout_problems
    from components.router import router_problems
    from components.secrets import secret_reference_problems
    from components.vllm_arguments import listener_flag_problems, server_argument_problems
    from domain import engine_checks, multi_node, placement_checks, secret_checks, validation
    from domain.capacity import plan
    from infra.signal_checks import query_window_problems, signal_source_problems

    return [
        plan.capacity_problems,
        plan.scale_to_zero_problems,
        autoscaling_metric_problems,
        autoscaling_pipeline_problems,
        gpu_toleration_problems,
        gpu_registration_problems,
        addon_mode_problems,
        addon_provider_problems,
        server_argument_problems,
        listener_flag_problems,
        secret_reference_problems,
        validation.ingress_host_problems,
        preload_source_problems,
        engine_checks.tuning_profile_problems,
        validation.load_balancer_source_problems,
        validation.replica_bound_problems,
        engine_checks.quantization_problems,
        engine_checks.fp8_weight_problems,
        engine_checks.lora_architecture_problems,
        engine_checks.runtime_loading_problems,
        engine_checks.reserved_served_name_problems,
        engine_checks.checkpoint_quantization_problems,
        secret_checks.operator_key_problems,
        secret_checks.secret_name_problems,
        rollout_problems,
        rolling_surge_problems,
        router_problems,
        aws_api_limit_problems,
        secret_checks.secret_isolation_problems,
        validation.to_zero_hostname_problems,
        signal_source_problems,
        query_window_problems,
        placement_checks.karpenter_pool_problems,
        multi_node.multi_node_problems,
        placement_checks.pod_request_problems,
    ]


def aws_api_limit_problems(config: PlatformConfig) -> list[Problem]:
    """Mode `eks`: the values the AWS layer sends, against the AWS APIs' limits in botocore's model
    (infra/aws/api_limits.py; imported only here, since the AWS layer is only for mode `eks`)."""
    if config.cluster.mode != "eks":
        return []
    from infra.aws.api_limits import aws_api_limit_problems as problems

    return problems(config)


def platform_problems(config: PlatformConfig) -> list[Problem]:
    problems: list[Problem] = []
    for check in platform_checks():
        problems.extend(check(config))
    return problems
