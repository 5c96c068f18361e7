"""How a pinned chart becomes a release: the one place every add-on goes through.

A release is a `kubernetes.helm.v4.Chart` over the chart's directory in the verified chart cache
(components/helm/cache.py; filled by `vllm-platform charts pull`, checked against
components/helm/charts.lock.yaml), never a chart repository at deploy time: what `pulumi up`
installs is exactly what `vllm-platform render` expanded and the suite checked, and `pulumi up`
refuses to start while a chart is missing or differs from the lock (infra/program.py).
Why `helm.v4.Chart` and not `helm.v3.Release` (docs/charts.md): v4 renders the chart
into individual Kubernetes resources, so `pulumi preview` shows a per-object diff, the policy pack
sees every object, and server-side apply owns them; Helm hooks are not run, so no chart we install
may depend on one (tests/test_chart_objects.py checks every render for hook objects).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components.helm.cache import cached_chart_path
from components.helm.lock import load_lock
from domain.labels import PART_OF
from domain.versions import ChartPin

CHART_RESOURCE_TYPE = "kubernetes:helm.sh/v4:Chart"


def chart_reference(pin: ChartPin) -> str:
    """The `chart` input Pulumi gets: the pinned chart's directory in the chart cache.

    The path itself is not checked here: `pulumi preview`/`up` check every cached chart against the
    lock before any resource is registered, and `render` checks each release before expanding it.
    """
    return str(cached_chart_path(load_lock()[pin.chart]))


@dataclass(frozen=True)
class ChartRelease:
    """A pinned chart installed under a release name with the values the program built."""

    name: str
    """Helm release name, also the Pulumi resource name (chart objects are named from it)."""
    pin: ChartPin
    namespace: str
    values: Mapping[str, Any] = field(default_factory=dict)


def install_chart(release: ChartRelease, opts: pulumi.ResourceOptions) -> kubernetes.helm.v4.Chart:
    """The release as a Pulumi component whose children are the chart's objects."""
    return kubernetes.helm.v4.Chart(
        release.name,
        chart=chart_reference(release.pin),
        name=release.name,
        namespace=release.namespace,
        values=dict(release.values),
        opts=opts,
    )


def release_namespace(
    resource_name: str, namespace: str, opts: pulumi.ResourceOptions
) -> kubernetes.core.v1.Namespace:
    """A namespace for releases outside kube-system (helm.v4.Chart, like `helm template`, creates none)."""
    return kubernetes.core.v1.Namespace(
        resource_name,
        metadata={
            "name": namespace,
            "labels": {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/managed-by": "pulumi"},
        },
        opts=opts,
    )
