"""Reading the typed config: from the running Pulumi program, or straight from a stack file.

Both paths end in `parse_platform_config`, so `pulumi up` and `vllm-platform render` see the same
config and the same errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infra.config.errors import PROJECT_NAMESPACE, ConfigError, Problem
from infra.config.models import SecretRefConfig
from infra.config.platform import PlatformConfig

STACKS_DIR = Path(__file__).resolve().parents[2] / "stacks"


def stack_file_for(stack: str) -> Path:
    return STACKS_DIR / f"Pulumi.{stack}.yaml"


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def read_stack_file(path: Path) -> dict[str, Any]:
    """The `vllm-platform:*` values of a Pulumi stack file, keyed without the namespace."""
    shown = display_path(path)
    if not path.is_file():
        raise ConfigError(
            shown, [Problem((), str(path), "stack file not found; stacks live in stacks/Pulumi.<stack>.yaml")]
        )
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(shown, [Problem((), None, f"not valid YAML: {error}")]) from None
    if not isinstance(document, dict) or not isinstance(document.get("config", {}), dict):
        raise ConfigError(
            shown, [Problem((), None, "a Pulumi stack file is a mapping with a 'config:' mapping")]
        )
    return _project_values(document.get("config") or {})


def _project_values(flat: dict[str, Any]) -> dict[str, Any]:
    prefix = f"{PROJECT_NAMESPACE}:"
    return {key.removeprefix(prefix): value for key, value in flat.items() if key.startswith(prefix)}


def read_pulumi_config() -> dict[str, Any]:
    """The `vllm-platform:*` values of the running stack, read through pulumi.Config.

    Every key the engine passed is read (not only the known ones) so a typo at the top level is
    reported like any other unknown key instead of being silently ignored.
    """
    import pulumi
    from pulumi.runtime import config as runtime_config

    names = set(_project_values(dict(runtime_config.CONFIG.get())))
    names |= set(_project_values(runtime_config.get_config_env()))
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


def parse_platform_config(values: dict[str, Any], *, stack: str, stack_file: str) -> PlatformConfig:
    try:
        config = PlatformConfig.model_validate(values)
    except ValidationError as error:
        from infra.config.errors import problems_from_validation_error

        raise ConfigError(stack_file, problems_from_validation_error(error, PlatformConfig)) from None
    return resolve_stack_defaults(config, stack)


def resolve_stack_defaults(config: PlatformConfig, stack: str) -> PlatformConfig:
    """Fill the defaults that depend on the stack name, so nothing downstream derives them again."""
    cluster_name = config.cluster.name or f"vllm-{stack}"
    cluster = config.cluster.model_copy(update={"name": cluster_name})
    storage = config.storage.model_copy(
        update={"model_bucket_name": config.storage.model_bucket_name or f"{cluster_name}-model-weights"}
    )
    models = []
    for model in config.models:
        update: dict[str, Any] = {}
        if model.api_key_secret is None:
            update["api_key_secret"] = SecretRefConfig(name=f"vllm-platform/{stack}/{model.name}/api-key")
        if model.source.requires_hf_token and model.hf_token_secret is None:
            update["hf_token_secret"] = SecretRefConfig(name=f"vllm-platform/{stack}/{model.name}/hf-token")
        if model.ingress_host is None and config.ingress.enabled and config.ingress.domain:
            update["ingress_host"] = f"{model.name}.{config.ingress.domain}"
        models.append(model.model_copy(update=update))
    router = config.router
    if router.enabled and router.host is None and config.ingress.enabled and config.ingress.domain:
        router = router.model_copy(update={"host": f"api.{config.ingress.domain}"})
    return config.model_copy(
        update={"cluster": cluster, "storage": storage, "models": models, "router": router}
    )


def load_stack(stack: str, *, stack_file: Path | None = None) -> PlatformConfig:
    """Parse and fully validate a stack file (what `vllm-platform validate` runs)."""
    path = stack_file or stack_file_for(stack)
    shown = display_path(path)
    config = parse_platform_config(read_stack_file(path), stack=stack, stack_file=shown)
    return validate_deeply(config, stack_file=shown)


def load_from_pulumi(*, stack_file_display: str | None = None) -> PlatformConfig:
    """Parse and fully validate the running stack's config (what `pulumi preview/up` runs)."""
    import pulumi

    stack = pulumi.get_stack()
    shown = stack_file_display or f"stacks/Pulumi.{stack}.yaml"
    config = parse_platform_config(read_pulumi_config(), stack=stack, stack_file=shown)
    return validate_deeply(config, stack_file=shown)


def validate_deeply(config: PlatformConfig, *, stack_file: str) -> PlatformConfig:
    """Checks that need more than the schema: the pinned vLLM's flags and metrics, capacity."""
    from infra.validation import platform_problems

    problems = platform_problems(config)
    if problems:
        raise ConfigError(stack_file, problems)
    return config
