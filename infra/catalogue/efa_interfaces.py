"""How many EFA interfaces each GPU instance type takes (efa_interfaces.yaml beside this file, with its
sources); 0 for an instance type without EFA."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from infra.catalogue.gpu_instances import gpu_instance_types


@cache
def _table() -> dict[str, int]:
    raw = yaml.safe_load(Path(__file__).with_name("efa_interfaces.yaml").read_text())
    table = {str(name): int(count) for name, count in raw["efa_interfaces"].items()}
    unknown = sorted(set(table) - set(gpu_instance_types()))
    if unknown:  # a row for an instance type the GPU catalogue does not know is a typo
        raise ValueError(f"efa_interfaces.yaml: not in gpu_instances.yaml: {', '.join(unknown)}")
    return table


def max_efa_interfaces(instance_type: str) -> int:
    """The most EFA interfaces (one per network card) `instance_type` takes; 0 without EFA."""
    return _table().get(instance_type, 0)


def efa_instance_types() -> list[str]:
    """Every GPU instance type with EFA, sorted."""
    return sorted(name for name, count in _table().items() if count > 0)
