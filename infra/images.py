"""Every container image a stack would pull, ours and the charts', for `vllm-platform images STACK`.

Read from the render (our objects and every chart object, as helm.v4.Chart applies them): pod
templates of every workload kind, the Prometheus Operator's custom resources (`spec.image`), and
images an operator is told to start on its command line (e.g. the config reloader). A team that
mirrors images into a private registry copies exactly this list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.config.base import unpinned_image_problem
from infra.render import RenderResult

POD_TEMPLATE_KINDS = frozenset({"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "Rollout"})
# Custom resources whose controller starts pods from `spec.image`.
IMAGE_SPEC_KINDS = frozenset({"Prometheus", "Alertmanager", "ThanosRuler", "PrometheusAgent"})
# `--prometheus-config-reloader=quay.io/...:v0.93.1`, `--thanos-default-base-image=...`: images an
# operator starts for the pods it manages.
_IMAGE_ARGUMENT = re.compile(r"^--[a-z0-9-]*(?:image|reloader)[a-z0-9-]*=([a-z0-9.-]+(?::\d+)?/\S+)$")


@dataclass
class ImageUse:
    reference: str
    users: set[str] = field(default_factory=set)
    """Who pulls it: `Kind namespace/name` (and the chart release, for chart objects)."""


def _pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        return ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template", {}).get("spec")
    if kind in POD_TEMPLATE_KINDS:
        return (spec.get("template") or {}).get("spec")
    return None


def _pod_specs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod specs of an object: its one template, or a LeaderWorkerSet's leader and worker
    templates (multi-node models, whose members run the EFA serving image)."""
    if obj.get("kind") == "LeaderWorkerSet":
        template = (obj.get("spec") or {}).get("leaderWorkerTemplate") or {}
        return [
            template[key]["spec"]
            for key in ("leaderTemplate", "workerTemplate")
            if (template.get(key) or {}).get("spec")
        ]
    pod = _pod_spec(obj)
    return [pod] if pod is not None else []


def images_of(obj: Mapping[str, Any]) -> list[str]:
    """The image references one object makes the cluster pull."""
    found: list[str] = []
    for pod in _pod_specs(obj):
        for key in ("initContainers", "containers", "ephemeralContainers"):
            for container in pod.get(key) or []:
                if container.get("image"):
                    found.append(str(container["image"]))
                for argument in container.get("args") or []:
                    if match := _IMAGE_ARGUMENT.match(str(argument)):
                        found.append(match.group(1))
    if obj.get("kind") in IMAGE_SPEC_KINDS and (obj.get("spec") or {}).get("image"):
        found.append(str(obj["spec"]["image"]))
    return found


def inventory(result: RenderResult) -> list[ImageUse]:
    """Every image of the stack, sorted, with the objects that pull it."""
    uses: dict[str, ImageUse] = {}

    def add(objects: Iterable[Mapping[str, Any]], release: str | None) -> None:
        for obj in objects:
            metadata = obj.get("metadata") or {}
            where = f"{obj.get('kind')} {metadata.get('namespace') or '-'}/{metadata.get('name')}"
            if release:
                where += f" (chart {release})"
            for reference in images_of(obj):
                uses.setdefault(reference, ImageUse(reference)).users.add(where)

    add(result.kubernetes_objects, None)
    for item in result.chart_objects:
        if not item.is_hook:
            add([item.object], item.release)
    return [uses[reference] for reference in sorted(uses)]


def unpinned(reference: str) -> str | None:
    """Why a reference is not pinned (no tag, a moving tag, a malformed digest), or None: the same
    rule `validate` applies to the images a stack file names (domain/config/base.py)."""
    return unpinned_image_problem(reference)


def format_inventory(images: list[ImageUse]) -> str:
    lines = [f"{len(images)} images"]
    for use in images:
        lines.append(use.reference)
        lines.extend(f"    {user}" for user in sorted(use.users))
    return "\n".join(lines)
