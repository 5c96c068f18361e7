"""What the pinned DCGM exporter exports by default, for autoscaling, alert and dashboard checks.

DEFAULT_COUNTERS lists the uncommented lines of `etc/default-counters.csv` in NVIDIA/dcgm-exporter
at the tag of the pinned chart's appVersion (DCGM_EXPORTER_SOURCE): the file the chart passes with
`-f` (its default `arguments`) and the image ships. Name and Prometheus type, nothing else: the
file itself is not copied here. To re-check after a bump, compare with the file at the new tag:

    git show <tag>:etc/default-counters.csv | grep -v '^#' | cut -d, -f1,2

and update DCGM_EXPORTER_SOURCE (tag, sha256). tests/test_operations_metric_names.py fails when a
rule, signal or dashboard names a DCGM series missing here.

The profiling counters DCGM_FI_PROF_SM_ACTIVE and DCGM_FI_PROF_SM_OCCUPANCY are commented out in
that file (a custom counters ConfigMap would be needed); DCGM_FI_PROF_PIPE_TENSOR_ACTIVE is in it.
"""

from __future__ import annotations

from collections.abc import Mapping

DCGM_EXPORTER_SOURCE = {
    "repository": "https://github.com/NVIDIA/dcgm-exporter",
    "tag": "4.5.3-4.8.2",
    "path": "etc/default-counters.csv",
    "sha256": "13d8c92cffa649f17c4c0938bb16707daf27260e845c77eacf89dbb68a46eaf9",
    "read_on": "2026-12-01",
}

GPU_UTILIZATION = "DCGM_FI_DEV_GPU_UTIL"
GRAPHICS_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
TENSOR_PIPE_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
GPU_TEMPERATURE = "DCGM_FI_DEV_GPU_TEMP"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
UNCORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"

# Name -> Prometheus type ("label" counters become labels of the other series, not series).
DEFAULT_COUNTERS: Mapping[str, str] = {
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_ENC_UTIL": "gauge",
    "DCGM_FI_DEV_DEC_UTIL": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_RESERVED": "gauge",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "gauge",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DRIVER_VERSION": "label",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gauge",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "gauge",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "gauge",
}
EXPORTED_SERIES: frozenset[str] = frozenset(
    name for name, kind in DEFAULT_COUNTERS.items() if kind != "label"
)

# The labels of a GPU series (internal/pkg/rendermetrics/render_metrics.go at the tag), plus the
# pod attribution the exporter adds with the kubelet's pod-resources socket (namespace, pod,
# container) and the `DCGM_FI_DRIVER_VERSION` label counter.
GPU_SERIES_LABELS: tuple[str, ...] = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "namespace",
    "pod",
    "container",
)

# Counters that read "busy" whenever any kernel runs: a decoding engine always runs one, so they
# read ~100 % with a single stream (measured on an H200, 2026-12-01, issue 19: 100 % at 1, 4 and
# 64 streams). Scaling on them asks for a replica per concurrent stream.
LOAD_INDEPENDENT_UTILIZATION: Mapping[str, str] = {
    GPU_UTILIZATION: "the fraction of time any kernel runs",
    GRAPHICS_ENGINE_ACTIVE: "the fraction of time the graphics/compute engine is active",
}
