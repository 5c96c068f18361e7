"""Named vLLM engine tunings (tuning_profiles.yaml beside this file) and how one applies to a model.

A model opts in with `vllm.tuning_profile: <name>`. The profile is applied when the config is
loaded (`VllmEngineConfig`'s before-validator calls `apply_tuning_profile`), so the typed config
already holds the effective settings and every consumer — the `vllm serve` argument builder, the
capacity planner, the flag check — sees the same values without knowing about profiles.

Like the rest of domain/catalogue, this module imports nothing from the config layer: the config
reads the catalogue, never the other way round (issue 27). The platform check that a profile runs
on the GPU it was measured on is `tuning_profile_problems` in domain/engine_checks.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

CATALOGUE_FILE = Path(__file__).with_name("tuning_profiles.yaml")


class UnknownTuningProfileError(LookupError):
    """A `tuning_profile` the catalogue does not hold; the message lists the known ones."""


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
        raise UnknownTuningProfileError(
            f"unknown tuning profile {name!r}; known profiles: {', '.join(sorted(profiles))} "
            f"(domain/catalogue/tuning_profiles.yaml), or remove the key to use the plain defaults"
        )
    for key, value in profile.setting_values().items():
        result.setdefault(key, value)
    own_args = result.get("extra_args") or []
    if profile.extra_args and isinstance(own_args, list):
        own_flags = {flag_spelling(str(token)) for token in own_args if str(token).startswith("--")}
        added = [token for entry in profile.extra_args if entry.flag not in own_flags for token in entry.args]
        result["extra_args"] = [*own_args, *added]
    return result
