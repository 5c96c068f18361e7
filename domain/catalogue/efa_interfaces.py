"""How many EFA interfaces each GPU instance type takes, whether its EFA devices support RDMA read, and
their bandwidth (efa_interfaces.yaml beside this file, with its sources); 0 and no for an instance type
without EFA."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

from domain.catalogue.gpu_instances import gpu_instance_types

EFA_RESOURCE = "vpc.amazonaws.com/efa"
"""The EFA device plugin's extended resource (aws-efa-k8s-device-plugin): one per EFA interface."""


@cache
def _raw() -> dict[str, Any]:
    """efa_interfaces.yaml, read once."""
    return yaml.safe_load(Path(__file__).with_name("efa_interfaces.yaml").read_text())


def _types_with_efa() -> set[str]:
    return {name for name, count in _table().items() if count > 0}


def _only_types_with_efa(section: str, names: set[str]) -> None:
    """A row of `section` for a type without EFA is a mistake in the catalogue."""
    without_efa = sorted(names - _types_with_efa())
    if without_efa:
        raise ValueError(f"efa_interfaces.yaml: {section} lists types without EFA: {', '.join(without_efa)}")


@cache
def _table() -> dict[str, int]:
    table = {str(name): int(count) for name, count in _raw()["efa_interfaces"].items()}
    unknown = sorted(set(table) - set(gpu_instance_types()))
    if unknown:  # a row for an instance type the GPU catalogue does not know is a typo
        raise ValueError(f"efa_interfaces.yaml: not in gpu_instances.yaml: {', '.join(unknown)}")
    return table


@cache
def _device_rdma() -> frozenset[str]:
    rdma = frozenset(str(name) for name in _raw()["efa_device_rdma"])
    _only_types_with_efa("efa_device_rdma", set(rdma))
    return rdma


@cache
def _bandwidth() -> dict[str, int]:
    bandwidth = {str(name): int(gbps) for name, gbps in _raw()["efa_bandwidth_gbps"].items()}
    _only_types_with_efa("efa_bandwidth_gbps", set(bandwidth))
    return bandwidth


def efa_bandwidth_gbps(instance_type: str) -> int | None:
    """The EFA bandwidth AWS publishes for `instance_type`, Gbit/s per node; None where not recorded."""
    return _bandwidth().get(instance_type)


def supports_device_rdma(instance_type: str) -> bool:
    """Whether `instance_type`'s EFA devices support RDMA read (GPUDirect RDMA through libfabric)."""
    return instance_type in _device_rdma()


def max_efa_interfaces(instance_type: str) -> int:
    """The most EFA interfaces (one per network card) `instance_type` takes; 0 without EFA."""
    return _table().get(instance_type, 0)


def efa_instance_types() -> list[str]:
    """Every GPU instance type with EFA, sorted."""
    return sorted(_types_with_efa())
