"""Expand a pinned chart (from the verified chart cache) offline with a real Helm engine, as
`kubernetes.helm.v4.Chart` would.

The engine is Helm's own Go SDK (v4) through helm-python-sdk (pinned in pyproject.toml): no helm
binary, no cluster, no chart repository. What `helm.v4.Chart` does with the rendered manifests, and
so what this module does too:

- templates rendered with the release's values, name and namespace, as an install;
- the charts' `crds/` files included (v4's `skipCrds` is off);
- Helm hooks (`helm.sh/hook`) dropped: v4.Chart does not run them, so nothing may depend on one;
- namespaced objects without a namespace put in the release's namespace.

`.Capabilities` come from the stack: its Kubernetes version, and the API versions of the custom
resource definitions the stack installs (a template that asks `.Capabilities.APIVersions.Has
"monitoring.coreos.com/v1"` sees what a cluster running this stack has).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HOOK_ANNOTATION = "helm.sh/hook"

# Built-in kinds that are not namespaced (kubectl api-resources --namespaced=false, Kubernetes 1.35);
# custom kinds are looked up in the CustomResourceDefinitions of the render.
CLUSTER_SCOPED_KINDS = frozenset(
    {
        "APIService",
        "CertificateSigningRequest",
        "ClusterRole",
        "ClusterRoleBinding",
        "ComponentStatus",
        "CSIDriver",
        "CSINode",
        "CustomResourceDefinition",
        "DeviceClass",
        "FlowSchema",
        "IngressClass",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "MutatingWebhookConfiguration",
        "Namespace",
        "Node",
        "PersistentVolume",
        "PriorityClass",
        "PriorityLevelConfiguration",
        "RuntimeClass",
        "StorageClass",
        "StorageVersionMigration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
        "VolumeAttachment",
        "VolumeAttributesClass",
        "IPAddress",
        "ServiceCIDR",
    }
)


class ChartRenderError(RuntimeError):
    """The chart failed to render with the values the program built (names release and chart)."""


@dataclass(frozen=True)
class ChartObject:
    """One object a chart release creates, with where it came from."""

    release: str
    chart: str
    template: str
    """The template (or crds/ file) it came from, e.g. `dcgm-exporter/templates/daemonset.yaml`."""
    object: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.object.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.object.get("metadata", {}).get("name", ""))

    @property
    def namespace(self) -> str | None:
        return self.object.get("metadata", {}).get("namespace")

    @property
    def is_hook(self) -> bool:
        return HOOK_ANNOTATION in (self.object.get("metadata", {}).get("annotations") or {})


class _ManifestLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML 1.1's `=` (the "value" type) is plain text in Kubernetes manifests (Go's YAML library
    reads it so; kube-prometheus-stack's CRDs contain `- =`), but PyYAML's safe loader refuses it.
    libyaml's loader where PyYAML has it: the charts' CRDs are megabytes of YAML."""


_ManifestLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def _documents(text: str) -> list[dict[str, Any]]:
    """The objects of a manifest; a `kind: *List` is its items, as Pulumi's YAML decoding does."""
    found: list[dict[str, Any]] = []
    for document in yaml.load_all(text, Loader=_ManifestLoader):
        if not isinstance(document, dict) or not document.get("kind"):
            continue
        if str(document["kind"]).endswith("List") and isinstance(document.get("items"), list):
            found.extend(item for item in document["items"] if isinstance(item, dict) and item.get("kind"))
        else:
            found.append(document)
    return found


def _render_native(chart: Any, values: Mapping[str, Any], options: dict[str, Any]) -> dict[str, str]:
    # helm-python-sdk 0.2.2's Chart.render() does not pass `kube_version`/`api_versions`, which its
    # native helm_render accepts (tests/test_helm_engine.py pins that they take effect).
    from helm_python import _native

    rendered = _native.call_string("helm_render", chart._raw(), json.dumps(dict(values)), json.dumps(options))
    manifests: dict[str, str] = json.loads(rendered)
    return manifests


def render_chart(
    chart_dir: Path,
    *,
    release: str,
    namespace: str,
    values: Mapping[str, Any],
    kubernetes_version: str,
    api_versions: Iterable[str] = (),
    cluster_scoped_kinds: Iterable[str] = (),
) -> list[ChartObject]:
    """Every object the release creates, hooks included (callers drop or report them).

    `kubernetes_version` is `1.34` or `v1.34.0`; `cluster_scoped_kinds` adds custom kinds that are
    not namespaced (from the CRDs of the whole render), so they get no namespace. Renders are cached
    per process by their inputs (the suite renders many stack variants that share most releases).
    """
    key = (
        str(chart_dir.resolve()),
        release,
        namespace,
        json.dumps(values, sort_keys=True, default=str),
        kubernetes_version,
        tuple(sorted(set(api_versions))),
        tuple(sorted(set(cluster_scoped_kinds))),
    )
    return [
        ChartObject(item.release, item.chart, item.template, copy.deepcopy(item.object))
        for item in _render_cached(*key)
    ]


@functools.lru_cache(maxsize=256)
def _render_cached(
    chart_dir: str,
    release: str,
    namespace: str,
    values_json: str,
    kubernetes_version: str,
    api_versions: tuple[str, ...],
    cluster_scoped_kinds: tuple[str, ...],
) -> tuple[ChartObject, ...]:
    return tuple(
        _render_uncached(
            Path(chart_dir),
            release=release,
            namespace=namespace,
            values=json.loads(values_json),
            kubernetes_version=kubernetes_version,
            api_versions=api_versions,
            cluster_scoped_kinds=cluster_scoped_kinds,
        )
    )


def _render_uncached(
    chart_dir: Path,
    *,
    release: str,
    namespace: str,
    values: Mapping[str, Any],
    kubernetes_version: str,
    api_versions: Iterable[str] = (),
    cluster_scoped_kinds: Iterable[str] = (),
) -> list[ChartObject]:
    import helm_python
    from helm_python.errors import HelmError

    version = kubernetes_version.lstrip("v")
    if version.count(".") == 1:
        version += ".0"
    options = {
        "name": release,
        "namespace": namespace,
        "is_install": True,
        "kube_version": f"v{version}",
        "api_versions": sorted(set(api_versions)),
    }
    cluster_scoped = CLUSTER_SCOPED_KINDS | set(cluster_scoped_kinds)
    objects: list[ChartObject] = []
    try:
        with helm_python.Chart.load(str(chart_dir)) as chart:
            chart_name = chart.name
            manifests = _render_native(chart, values, options)
            crd_files = [(crd["filename"], crd["data"]) for crd in chart.crds]
    except HelmError as error:
        raise ChartRenderError(
            f"release {release} (chart {chart_dir.name}): Helm could not render it: {error}"
        ) from error
    for template, text in [*crd_files, *sorted(manifests.items())]:
        if template.endswith("NOTES.txt"):
            continue
        for document in _documents(text):
            metadata = document.setdefault("metadata", {})
            if document["kind"] not in cluster_scoped and not metadata.get("namespace"):
                metadata["namespace"] = namespace
            objects.append(ChartObject(release=release, chart=chart_name, template=template, object=document))
    return objects


def chart_crds(chart_dir: Path) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions in the chart's and its subcharts' crds/ directories."""
    import helm_python

    with helm_python.Chart.load(str(chart_dir)) as chart:
        return [doc for crd in chart.crds for doc in _documents(crd["data"])]


@functools.lru_cache(maxsize=64)
def asks_api_versions(chart_dir: Path) -> bool:
    """Whether any template of the chart (or of its subcharts) reads `.Capabilities.APIVersions`."""
    return any(
        "APIVersions" in path.read_text(errors="replace")
        for path in chart_dir.rglob("*")
        if path.is_file() and "templates" in path.parts
    )


def crd_api_versions(objects: Iterable[ChartObject]) -> tuple[set[str], set[str]]:
    """(`group/version` and `group/version/Kind` of every served CRD version, cluster-scoped kinds)."""
    versions: set[str] = set()
    cluster_scoped: set[str] = set()
    for item in objects:
        if item.kind != "CustomResourceDefinition":
            continue
        spec = item.object.get("spec") or {}
        group, kind = spec.get("group"), (spec.get("names") or {}).get("kind")
        if spec.get("scope") == "Cluster" and kind:
            cluster_scoped.add(kind)
        for entry in spec.get("versions") or []:
            if entry.get("served", True):
                versions.update({f"{group}/{entry['name']}", f"{group}/{entry['name']}/{kind}"})
    return versions, cluster_scoped
