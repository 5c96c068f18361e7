"""Reading the typed config: from the running Pulumi program, or straight from a stack file.

Both paths end in `parse_platform_config`, so `pulumi up` and `vllm-platform render` see the same
config and the same errors. Loading parses and types only: the checks that cross components (the
pinned vLLM's flags, capacity, add-ons, secrets) are their own step, infra/stack_checks.py, so this
layer imports nothing from components/ (issue 15, "One way through").
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from domain.config.errors import PROJECT_NAMESPACE, ConfigError, Problem
from domain.config.models import SecretRefConfig
from domain.config.platform import PlatformConfig

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
    text = path.read_text()
    try:
        document = yaml.safe_load(text) or {}
        duplicates = duplicate_key_problems(yaml.compose(text))
    except yaml.YAMLError as error:
        raise ConfigError(shown, [Problem((), None, f"not valid YAML: {error}")]) from None
    if not isinstance(document, dict) or not isinstance(document.get("config", {}), dict):
        raise ConfigError(
            shown, [Problem((), None, "a Pulumi stack file is a mapping with a 'config:' mapping")]
        )
    flat = document.get("config") or {}
    problems = duplicates + namespace_problems(flat)
    if problems:
        raise ConfigError(shown, problems)
    return project_values(flat)


KNOWN_NAMESPACES = (PROJECT_NAMESPACE, "aws", "kubernetes", "pulumi")
"""Config namespaces a stack of this project may use: its own and its providers'."""


def namespace_problems(flat: dict[str, Any]) -> list[Problem]:
    """A key outside the known namespaces (a typo such as `vllm-platfrom:ingress`) would be dropped
    without a word, leaving its section at the defaults: an error instead, with the likely fix."""
    problems = []
    for key in flat:
        namespace, separator, name = str(key).partition(":")
        if separator and namespace in KNOWN_NAMESPACES:
            continue
        if not separator:
            message = (
                f"config key '{key}' has no namespace, so this program never reads it: "
                f"write it as '{PROJECT_NAMESPACE}:{key}'"
            )
        else:
            close = difflib.get_close_matches(namespace, KNOWN_NAMESPACES, n=1)
            hint = f"did you mean '{close[0]}:{name}'? " if close else ""
            message = (
                f"unknown config namespace '{namespace}': {hint}this program reads only "
                f"{', '.join(repr(n + ':') for n in KNOWN_NAMESPACES)} keys"
            )
        problems.append(Problem((), str(key), message))
    return problems


def _key_path(path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """A path below `config:` as the project's key path (`vllm-platform:ingress.scheme` → ingress, scheme)."""
    if len(path) >= 2 and path[0] == "config" and str(path[1]).startswith(f"{PROJECT_NAMESPACE}:"):
        return (str(path[1]).removeprefix(f"{PROJECT_NAMESPACE}:"), *path[2:])
    return ()


def duplicate_key_problems(node: yaml.Node | None, path: tuple[str | int, ...] = ()) -> list[Problem]:
    """Every mapping key given twice at the same level. YAML loaders keep the last one silently: a
    second `vllm-platform:ingress` once made dev's load balancer internet-facing (issue 15)."""
    problems: list[Problem] = []
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in first_line:
                at = _key_path((*path, key))
                shown = key if at else ".".join(str(p) for p in (*path, key))
                problems.append(
                    Problem(
                        at,
                        shown,
                        (
                            f"key given twice (lines {first_line[key]} and {line}); YAML would keep only the "
                            "last one "
                            "silently: merge the two into one entry"
                        ),
                    )
                )
            else:
                first_line[key] = line
            problems += duplicate_key_problems(value_node, (*path, key))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            problems += duplicate_key_problems(item, (*path, index))
    return problems


def project_values(flat: dict[str, Any]) -> dict[str, Any]:
    prefix = f"{PROJECT_NAMESPACE}:"
    return {key.removeprefix(prefix): value for key, value in flat.items() if key.startswith(prefix)}


def parse_platform_config(values: dict[str, Any], *, stack: str, stack_file: str) -> PlatformConfig:
    try:
        config = PlatformConfig.model_validate(values)
    except ValidationError as error:
        from domain.config.errors import problems_from_validation_error

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
        if model.api_key_secret is None and not config.tenants:  # with tenants, their keys instead
            update["api_key_secret"] = SecretRefConfig(name=f"vllm-platform/{stack}/{model.name}/api-key")
        if model.needs_hf_token and model.hf_token_secret is None:
            update["hf_token_secret"] = SecretRefConfig(name=f"vllm-platform/{stack}/{model.name}/hf-token")
        # A model at zero has no hostname of its own (to_zero_hostname_problems): only the router's.
        own_host = config.ingress.enabled and config.ingress.domain and not model.scales_to_zero
        if model.ingress_host is None and own_host:
            update["ingress_host"] = f"{model.name}.{config.ingress.domain}"
        models.append(model.model_copy(update=update))
    router = config.router
    if router.enabled and router.host is None and config.ingress.enabled and config.ingress.domain:
        router = router.model_copy(update={"host": f"api.{config.ingress.domain}"})
    return config.model_copy(
        update={"cluster": cluster, "storage": storage, "models": models, "router": router}
    )


def load_stack_config(stack: str, *, stack_file: Path | None = None) -> PlatformConfig:
    """Parse and type a stack file; no cross-component checks (infra.stack_checks.load_stack runs them)."""
    path = stack_file or stack_file_for(stack)
    return parse_platform_config(read_stack_file(path), stack=stack, stack_file=display_path(path))
