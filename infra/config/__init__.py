"""The typed config: schema (pydantic v2, unknown keys rejected), loader and error messages."""

from infra.config.cluster import ClusterConfig, GpuNodeGroupConfig, NodeGroupsConfig, TaintConfig
from infra.config.errors import ConfigError, ConfigProblem, Problem
from infra.config.loader import load_pulumi_config, load_stack_config, stack_file_for
from infra.config.models import ModelConfig, VllmEngineConfig
from infra.config.platform import PlatformConfig

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "ConfigProblem",
    "GpuNodeGroupConfig",
    "ModelConfig",
    "NodeGroupsConfig",
    "PlatformConfig",
    "Problem",
    "TaintConfig",
    "VllmEngineConfig",
    "load_pulumi_config",
    "load_stack_config",
    "stack_file_for",
]
