"""The typed config: schema (pydantic v2, unknown keys rejected), loader and error messages."""

from domain.config.cluster import ClusterConfig, GpuNodeGroupConfig, NodeGroupsConfig, TaintConfig
from domain.config.engine import VllmEngineConfig
from domain.config.errors import ConfigError, ConfigProblem, Problem
from domain.config.loader import load_stack_config, stack_file_for
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig

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
    "load_stack_config",
    "stack_file_for",
]
