"""Named vLLM engine tunings (tuning_profiles.yaml beside this file) and how one applies to a model.

A model opts in with `vllm.tuning_profile: <name>`. The profile is applied when the config is
loaded (`VllmEngineConfig`'s before-validator calls `apply_tuning_profile`), so the typed config
already holds the effective settings and every consumer — the `vllm serve` argument builder, the
capacity planner, the flag check — sees the same values without knowing about profiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from infra.catalogue.gpu_instances import lookup_instance_type
from infra.config.errors import ConfigProblem, Problem

if TYPE_CHECKING:
    from infra.config.platform import PlatformConfig

CATALOGUE_FILE = Path(__file__).with_name("tuning_profiles.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProfileSetting(_Strict):
    value: Any
    why: Annotated[str, Field(min_length=10)]


class ProfileExtraArgs(_Strict):
    args: Annotated[list[str], Field(min_length=1)]
    """One flag and its values, e.g. ["--stream-interval", "4"]."""
    why: Annotated[str, Field(min_length=10)]

    @field_validator("args")
    @classmethod
    def _starts_with_a_flag(cls, value: list[str]) -> list[str]:
        if not value[0].startswith("--"):
            raise ValueError(f"must start with a long flag such as '--stream-interval', not '{value[0]}'")
        return value

    @property
    def flag(self) -> str:
        return flag_spelling(self.args[0])


class TuningProfile(_Strict):
    name: str
    summary: str
    gpus: Annotated[list[str], Field(min_length=1)]
    """GPU models (names in gpu_instances.yaml) the profile was measured on."""
    measured_by: str
    """The committed benchmark results that compare this profile with vLLM's defaults."""
    settings: dict[str, ProfileSetting] = {}
    """`vllm.<key>` settings of the model config (VllmEngineConfig field names)."""
    extra_args: list[ProfileExtraArgs] = []

    def setting_values(self) -> dict[str, Any]:
        return {key: setting.value for key, setting in self.settings.items()}


def flag_spelling(token: str) -> str:
    """`--max_num_seqs=8` → `--max-num-seqs`: the flag vLLM's parser reads (it maps `_` to `-`)."""
    name = token.split("=", 1)[0]
    return name.replace("_", "-") if name.startswith("--") else name


@cache
def tuning_profiles() -> dict[str, TuningProfile]:
    raw = yaml.safe_load(CATALOGUE_FILE.read_text())
    return {name: TuningProfile(name=name, **spec) for name, spec in raw["profiles"].items()}


def apply_tuning_profile(engine: Mapping[str, Any]) -> dict[str, Any]:
    """The raw `vllm:` block with its profile filled in wherever the block does not decide itself.

    Keys the block sets win over the profile's settings; the profile's `extra_args` are appended
    unless the block's `extra_args` already name the same flag. Without a profile, a copy.
    """
    name = engine.get("tuning_profile")
    result = dict(engine)
    if name is None:
        return result
    profiles = tuning_profiles()
    profile = profiles.get(name) if isinstance(name, str) else None
    if profile is None:
        raise ConfigProblem(
            f"unknown tuning profile {name!r}; known profiles: {', '.join(sorted(profiles))} "
            f"(infra/catalogue/tuning_profiles.yaml), or remove the key to use the plain defaults",
            at=("tuning_profile",),
            value=name,
        )
    for key, value in profile.setting_values().items():
        result.setdefault(key, value)
    own_args = result.get("extra_args") or []
    if profile.extra_args and isinstance(own_args, list):
        own_flags = {flag_spelling(str(token)) for token in own_args if str(token).startswith("--")}
        added = [token for entry in profile.extra_args if entry.flag not in own_flags for token in entry.args]
        result["extra_args"] = [*own_args, *added]
    return result


def tuning_profile_problems(config: PlatformConfig) -> list[Problem]:
    """A platform check: a profile measured on one GPU must not silently tune a model on another."""
    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        name = model.vllm.tuning_profile
        group = config.node_groups.gpu.get(model.gpu_group)
        if name is None or group is None:
            continue  # the group reference is reported by the config's own checks
        profile = tuning_profiles()[name]
        for instance_type in group.instance_types:
            instance = lookup_instance_type(instance_type)
            if instance is not None and instance.gpu.name not in profile.gpus:
                problems.append(
                    Problem(
                        path=("models", index, "vllm", "tuning_profile"),
                        value=name,
                        message=(
                            f"profile {name!r} was measured on {', '.join(profile.gpus)}, but gpu_group "
                            f"{model.gpu_group!r} runs {instance.gpu.name} ({instance_type}); choose a "
                            f"profile measured on {instance.gpu.name} or set the vllm settings explicitly"
                        ),
                    )
                )
                break
    return problems
