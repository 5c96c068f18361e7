#!/usr/bin/env python3
"""Diff two offline renders (`vllm-platform render`) as Markdown for a pull-request comment.

    scripts/render-diff.py BASE HEAD [--title TEXT] [--max-chars N] > comment.md

BASE and HEAD are each either one render (a folder with kubernetes/, charts/, helm/ and
aws-resources.json) or a folder of renders, one sub-folder per stack (render/base/dev, ...).
Objects are matched by identity, not by file name: Kubernetes objects by kind, namespace and name;
chart objects by release, kind, namespace and name; Helm releases by namespace and name; AWS
resources by type and Pulumi name. Values are compared
after normalising key order (and floats the render writes for integers), so only real changes
show. Removals and changes to fields Kubernetes or AWS cannot update in place are flagged first:
those are the lines a reviewer must not miss. A change to a canary Rollout's steps (or a model
switching between `rolling` and `canary`) is summarised next, as the steps a new revision will go
through (docs/rollouts.md). Stack outputs are not diffed (they hold the
kubeconfig).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML has it (the safe constructors either way): a render's chart objects
are megabytes of YAML, which the pure-Python parser read in about 9 s per pair of dev renders."""

MARKER = "<!-- vllm-platform render-diff -->"
# GitHub rejects comments over 65,536 characters; leave room for the header and the footer.
DEFAULT_MAX_CHARS = 60_000
MAX_LINES_PER_OBJECT = 200

# Changes that replace the object (or fail) instead of updating it in place.
_REPLACING_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (("spec", "selector"),),
    "Rollout": (("spec", "selector"),),
    "StatefulSet": (("spec", "selector"), ("spec", "volumeClaimTemplates"), ("spec", "serviceName")),
    "DaemonSet": (("spec", "selector"),),
    "Job": (("spec", "template"), ("spec", "selector")),
    "PersistentVolumeClaim": (("spec", "storageClassName"), ("spec", "accessModes"), ("spec", "volumeName")),
    "Service": (("spec", "clusterIP"), ("spec", "type")),
    "aws:eks/cluster:Cluster": (("name",), ("vpcConfig", "subnetIds"), ("kubernetesNetworkConfig",)),
    "aws:eks/nodeGroup:NodeGroup": (
        ("instanceTypes",),
        ("capacityType",),
        ("amiType",),
        ("subnetIds",),
        ("diskSize",),
        ("nodeGroupName",),
    ),
    "aws:s3/bucket:Bucket": (("bucket",),),
    "aws:s3/bucketV2:BucketV2": (("bucket",),),
    "aws:efs/fileSystem:FileSystem": (("encrypted",), ("kmsKeyId",), ("performanceMode",)),
    "aws:ec2/vpc:Vpc": (("cidrBlock",),),
    "aws:ec2/subnet:Subnet": (("cidrBlock",), ("availabilityZone",), ("vpcId",)),
}


@dataclass
class Entry:
    """One object of a render: how to name it, its kind for the replace rules, its content."""

    label: str
    kind: str
    content: Any


@dataclass
class StackDiff:
    stack: str
    added: list[Entry] = field(default_factory=list)
    removed: list[Entry] = field(default_factory=list)
    changed: list[tuple[Entry, Entry]] = field(default_factory=list)
    unchanged: int = 0

    @property
    def has_changes(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def normalise(value: Any) -> Any:
    """Integral floats back to ints (the mocks carry every number as a float); containers recursively."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: normalise(item) for key, item in value.items()}
    if isinstance(value, list):
        return [normalise(item) for item in value]
    return value


GENERATED = "<generated at render>"


def mask_generated(obj: Any) -> Any:
    """Charts that make their webhook certificates at template time (Helm's genCA) give new bytes on
    every render; on `pulumi up` their `lookup` keeps the cluster's. Shown as one placeholder, so
    only real changes appear."""
    if isinstance(obj, dict):
        if obj.get("kind") == "Secret" and obj.get("type") == "kubernetes.io/tls":
            return {**obj, "data": dict.fromkeys(obj.get("data") or {}, GENERATED)}
        return {key: GENERATED if key == "caBundle" else mask_generated(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [mask_generated(item) for item in obj]
    return obj


def read_render(directory: Path) -> dict[tuple[str, ...], Entry]:
    """Every object of one render, keyed by identity."""
    entries: dict[tuple[str, ...], Entry] = {}
    for path in sorted((directory / "kubernetes").rglob("*.yaml")):
        for obj in yaml.load_all(path.read_text(), Loader=LOADER):
            if not obj:
                continue
            metadata = obj.get("metadata") or {}
            namespace = metadata.get("namespace", "")
            kind = str(obj.get("kind"))
            label = (
                f"{kind} {namespace}/{metadata.get('name')}"
                if namespace
                else f"{kind} {metadata.get('name')}"
            )
            entries[("kubernetes", kind, namespace, str(metadata.get("name")))] = Entry(
                label, kind, normalise(obj)
            )
    # Objects the vendored charts render (charts/<release>/<namespace>/...): a pin bump or a value
    # change shows as the objects that change, not only as the values passed.
    for path in sorted((directory / "charts").rglob("*.yaml")):
        release_name = path.relative_to(directory / "charts").parts[0]
        obj = yaml.load(path.read_text(), Loader=LOADER)
        if not obj:
            continue
        metadata = obj.get("metadata") or {}
        namespace, kind = metadata.get("namespace", ""), str(obj.get("kind"))
        where = f"{namespace}/{metadata.get('name')}" if namespace else str(metadata.get("name"))
        entries[("chart", release_name, kind, namespace, str(metadata.get("name")))] = Entry(
            f"{kind} {where} (chart release {release_name})", kind, normalise(mask_generated(obj))
        )
    for path in sorted((directory / "helm").glob("*.yaml")):
        release = yaml.load(path.read_text(), Loader=LOADER) or {}
        namespace, name = release.get("namespace", "default"), release.get("name", path.stem)
        version = release.get("chartVersion") or release.get("version")
        label = f"Helm release {namespace}/{name} (chart {release.get('chart')} {version})"
        entries[("helm", namespace, name)] = Entry(label, "helm", normalise(release))
    aws_file = directory / "aws-resources.json"
    if aws_file.is_file():
        for resource in json.loads(aws_file.read_text()):
            label = f"{resource['type']} {resource['name']}"
            entries[("aws", resource["type"], resource["name"])] = Entry(
                label, resource["type"], normalise(resource["inputs"])
            )
    return entries


def is_one_render(root: Path) -> bool:
    return (root / "kubernetes").is_dir() or (root / "aws-resources.json").is_file()


def stack_dirs(root: Path) -> dict[str, Path]:
    """`root` as {stack: render folder}: itself when it is one render, else its sub-folders. A
    missing folder has no stacks (a stack added or removed by the pull request)."""
    if not root.is_dir():
        return {}
    if is_one_render(root):
        return {root.name: root}
    return {child.name: child for child in sorted(root.iterdir()) if child.is_dir()}


def diff_stack(stack: str, base: Path | None, head: Path | None) -> StackDiff:
    before = read_render(base) if base else {}
    after = read_render(head) if head else {}
    result = StackDiff(stack)
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old is None and new is not None:
            result.added.append(new)
        elif new is None and old is not None:
            result.removed.append(old)
        elif old is not None and new is not None and old.content != new.content:
            result.changed.append((old, new))
        else:
            result.unchanged += 1
    return result


def _dig(value: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def replacing_changes(old: Entry, new: Entry) -> list[str]:
    """Dotted paths of changed fields that force a replacement (or an apply error) of the object."""
    return [
        ".".join(path)
        for path in _REPLACING_FIELDS.get(new.kind, ())
        if _dig(old.content, path) != _dig(new.content, path)
    ]


def rollout_steps(content: Any) -> str:
    """A Rollout's canary steps as a reviewer reads them: `10% → analysis → 50% → analysis → 100%`."""
    steps = _dig(content, ("spec", "strategy", "canary", "steps"))
    if not isinstance(steps, list):
        return "no canary steps"
    shown = []
    for step in steps:
        if "setWeight" in step:
            shown.append(f"{step['setWeight']}%")
        elif "analysis" in step:
            templates = [t.get("templateName", "?") for t in step["analysis"].get("templates", [])]
            shown.append(f"analysis ({', '.join(templates)})")
        elif "pause" in step:
            duration = (step["pause"] or {}).get("duration")
            shown.append(f"pause {duration}" if duration else "pause (until promoted)")
        else:
            shown.append(next(iter(step), "?"))
    return " → ".join([*shown, "100%"])


def rollout_step_changes(diff: StackDiff) -> list[str]:
    """One line per model whose canary steps change, appear (rolling → canary) or go (canary → rolling)."""
    lines = []
    for old, new in diff.changed:
        if new.kind == "Rollout" and rollout_steps(old.content) != rollout_steps(new.content):
            lines.append(
                f"- **{diff.stack}**: {new.label}: `{rollout_steps(old.content)}` → "
                f"`{rollout_steps(new.content)}`"
            )
    lines += [
        f"- **{diff.stack}**: {e.label} (new canary): `{rollout_steps(e.content)}`"
        for e in diff.added
        if e.kind == "Rollout"
    ]
    lines += [
        f"- **{diff.stack}**: {e.label} removed: new revisions no longer go out as canaries"
        for e in diff.removed
        if e.kind == "Rollout"
    ]
    return lines


def _dump(content: Any) -> list[str]:
    return yaml.safe_dump(content, sort_keys=True, default_flow_style=False, width=100).splitlines()


def unified(old: Entry | None, new: Entry | None) -> list[str]:
    lines = list(
        difflib.unified_diff(
            _dump(old.content) if old else [], _dump(new.content) if new else [], lineterm="", n=3
        )
    )[2:]  # drop the ---/+++ header
    if len(lines) > MAX_LINES_PER_OBJECT:
        lines = [*lines[:MAX_LINES_PER_OBJECT], f"... {len(lines) - MAX_LINES_PER_OBJECT} more lines"]
    return lines


def _diff_block(lines: list[str]) -> str:
    body = "\n".join(line.replace("```", "`\u200b``") for line in lines)
    return f"```diff\n{body}\n```"


def render_markdown(diffs: list[StackDiff], *, title: str, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    lines = [MARKER, f"## {title}", ""]
    if not any(d.has_changes for d in diffs):
        lines.append("No change to any rendered Kubernetes object, Helm release or AWS resource.")
        return "\n".join(lines) + "\n"
    lines += ["| stack | added | changed | removed | unchanged |", "|---|---:|---:|---:|---:|"]
    lines += [
        f"| {d.stack} | {len(d.added)} | {len(d.changed)} | {len(d.removed)} | {d.unchanged} |" for d in diffs
    ]
    warnings = []
    for d in diffs:
        warnings += [f"- **{d.stack}**: deletes {entry.label}" for entry in d.removed]
        for old, new in d.changed:
            fields = replacing_changes(old, new)
            if fields:
                warnings.append(
                    f"- **{d.stack}**: {new.label} changes {', '.join(f'`{f}`' for f in fields)} "
                    "(replaced, not updated in place)"
                )
    if warnings:
        lines += ["", "### ⚠️ Deletions and replacements", *warnings]
    steps = [line for d in diffs for line in rollout_step_changes(d)]
    if steps:
        lines += ["", "### Canary rollout steps", *steps]
    details: list[str] = []
    for d in diffs:
        if not d.has_changes:
            continue
        details += [
            "",
            f"<details><summary><b>{d.stack}</b>: {len(d.added)} added, {len(d.changed)} changed, "
            f"{len(d.removed)} removed</summary>",
            "",
        ]
        for entry in d.added:
            details += [f"**+ {entry.label}**", _diff_block(unified(None, entry)), ""]
        for old, new in d.changed:
            details += [f"**~ {new.label}**", _diff_block(unified(old, new)), ""]
        for entry in d.removed:
            details += [f"**- {entry.label}**", _diff_block(unified(entry, None)), ""]
        details.append("</details>")
    text = "\n".join(lines)
    footer = (
        "\n\n<sub>Rendered offline with `vllm-platform render`, base branch vs this pull request; "
        "full renders: the workflow's artifact.</sub>\n"
    )
    budget = max_chars - len(text) - len(footer) - 200
    detail_text = "\n".join(details)
    if len(detail_text) > budget:
        detail_text = detail_text[: max(budget, 0)].rsplit("\n", 1)[0]
        if detail_text.count("```") % 2:
            detail_text += "\n```"
        if detail_text.count("<details>") > detail_text.count("</details>"):
            detail_text += "\n</details>"
        detail_text += "\n\n**Diff truncated** to fit a comment; the workflow artifact has all of it."
    return text + "\n" + detail_text + footer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="render(s) of the base branch")
    parser.add_argument("head", type=Path, help="render(s) of the pull request")
    parser.add_argument("--title", default="Rendered changes", help="comment heading")
    parser.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS)
    args = parser.parse_args(argv)
    if is_one_render(args.base) and is_one_render(args.head):
        base, head = {args.head.name: args.base}, {args.head.name: args.head}
    else:
        base, head = stack_dirs(args.base), stack_dirs(args.head)
    if not base and not head:
        parser.error(f"no render under {args.base} or {args.head}")
    diffs = [diff_stack(stack, base.get(stack), head.get(stack)) for stack in sorted(set(base) | set(head))]
    sys.stdout.write(render_markdown(diffs, title=args.title, max_chars=args.max_chars))
    return 0


if __name__ == "__main__":
    sys.exit(main())
