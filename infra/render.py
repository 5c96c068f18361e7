"""Offline render: run the real Pulumi program under recording mocks and write what it would deploy.

No Pulumi CLI, cloud account or cluster is needed. The program is the one `pulumi up` runs (same
entry point, config read through pulumi.Config); the mocks only stand in for the engine and answer
the few cloud look-ups (availability zones, account id) with fixed placeholder values.
"""

from __future__ import annotations

import contextvars
import json
import shutil
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from components.helm.cache import (
    PULL_COMMAND,
    CacheProblem,
    ChartCacheError,
    cache_problems,
    lock_entry_for_path,
)
from components.helm.engine import ChartObject, asks_api_versions, crd_api_versions, render_chart
from components.helm.lock import LockedChart
from domain.config import PlatformConfig
from domain.config.loader import display_path, read_stack_file, stack_file_for
from domain.config.platform import MonitoringConfig

PLACEHOLDER_ACCOUNT_ID = "123456789012"
PLACEHOLDER_CLUSTER_SECURITY_GROUP_ID = "sg-0cluster0000000000"
KUBERNETES_PREFIX = "kubernetes:"
CHART_RELEASE_TYPE = "kubernetes:helm.sh/v4:Chart"
"""components/helm/release.py CHART_RESOURCE_TYPE: a release of a pinned chart (from the chart cache)."""
# Pulumi's wire format marks secret values with this signature key.
_SECRET_SIG = "4dabf18193072939515e22adb298388d"


@dataclass
class RecordedResource:
    type: str
    name: str
    inputs: dict[str, Any]
    parent_urn: str
    custom: bool
    urn: str = ""
    ignore_changes: tuple[str, ...] = ()
    """Fields `pulumi up` leaves to someone else (ResourceOptions.ignore_changes), e.g. a controller."""

    @property
    def is_kubernetes_object(self) -> bool:
        return (
            self.custom
            and self.type.startswith(KUBERNETES_PREFIX)
            and self.type != CHART_RELEASE_TYPE
            and "kind" in self.inputs
        )


@dataclass
class RenderResult:
    stack: str
    stack_file: str
    resources: list[RecordedResource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    chart_objects: list[ChartObject] = field(default_factory=list)
    """Every object the chart releases render to, hooks included (components/helm/engine.py)."""
    unexpanded_releases: list[str] = field(default_factory=list)
    """Releases whose chart is not in the chart cache, rendered as values only (allow_missing_charts)."""

    @property
    def kubernetes_objects(self) -> list[dict[str, Any]]:
        """Our own typed Kubernetes objects (not the charts')."""
        return [r.inputs for r in self.resources if r.is_kubernetes_object]

    @property
    def helm_releases(self) -> list[dict[str, Any]]:
        """Each chart release's inputs: `chart` (its chart cache path), `name`, `namespace`, `values`."""
        return [r.inputs for r in self.resources if r.type == CHART_RELEASE_TYPE]

    @property
    def deployed_chart_objects(self) -> list[dict[str, Any]]:
        """The chart objects `helm.v4.Chart` applies (it does not run Helm hooks)."""
        return [item.object for item in self.chart_objects if not item.is_hook]

    @property
    def chart_resources(self) -> list[RecordedResource]:
        """The chart objects as the resources `helm.v4.Chart` registers (what the policy pack sees)."""
        return [
            RecordedResource(
                type=kubernetes_resource_type(item.object),
                name=f"{item.release}:{item.namespace + '/' if item.namespace else ''}{item.name}",
                inputs=item.object,
                parent_urn=item.release,
                custom=True,
                urn=f"chart:{item.release}:{item.kind}:{item.namespace or ''}:{item.name}",
            )
            for item in self.chart_objects
            if not item.is_hook
        ]

    @property
    def all_kubernetes_objects(self) -> list[dict[str, Any]]:
        """Everything that would exist in the cluster: ours and the charts'."""
        return [*self.kubernetes_objects, *self.deployed_chart_objects]

    @property
    def aws_resources(self) -> list[RecordedResource]:
        return [r for r in self.resources if r.custom and r.type.startswith("aws:")]

    @property
    def components(self) -> list[RecordedResource]:
        return [r for r in self.resources if not r.custom]

    def find(self, kind: str, name: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        """Kubernetes objects of a kind, optionally narrowed by name and namespace."""
        found = []
        for obj in self.kubernetes_objects:
            metadata = obj.get("metadata", {})
            if obj.get("kind") != kind:
                continue
            if name is not None and metadata.get("name") != name:
                continue
            if namespace is not None and metadata.get("namespace") != namespace:
                continue
            found.append(obj)
        return found

    def aws(self, type_: str) -> list[RecordedResource]:
        return [r for r in self.aws_resources if r.type == type_]


def kubernetes_resource_type(obj: dict[str, Any]) -> str:
    """Pulumi's type token of a Kubernetes object (`v1` is the `core` group: kubernetes:core/v1:Pod)."""
    api_version = obj["apiVersion"]
    return f"kubernetes:{api_version if '/' in api_version else 'core/' + api_version}:{obj['kind']}"


def unwrap_secrets(value: Any) -> Any:
    """Wire values as the program wrote them.

    Secret envelopes are replaced by their values (the render is for review, not for state), and
    whole-number floats become ints again: Pulumi's wire format carries every number as a double,
    but `runAsUser: 10001.0` is not what the program said, and scanners treat it differently.
    """
    if isinstance(value, dict):
        if value.get(_SECRET_SIG) == "1b47061264138c4ac30d75fd1eb44270" and "value" in value:
            return unwrap_secrets(value["value"])
        return {key: unwrap_secrets(item) for key, item in value.items()}
    if isinstance(value, list):
        return [unwrap_secrets(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _fake_outputs(type_: str, name: str, inputs: dict[str, Any], region: str) -> dict[str, Any]:
    """Plausible computed outputs for the AWS resources whose outputs feed other resources."""
    account = PLACEHOLDER_ACCOUNT_ID
    outputs = dict(inputs)
    outputs.setdefault("arn", f"arn:aws:{type_.split(':')[1].split('/')[0]}:{region}:{account}:{name}")
    if type_ == "aws:eks/cluster:Cluster":
        cluster_name = inputs.get("name", name)
        outputs.update(
            endpoint=f"https://{cluster_name}.gr7.{region}.eks.amazonaws.com",
            certificateAuthority={"data": "LS0tLS1CRUdJTi1QTEFDRUhPTERFUi0tLS0t"},
            identities=[
                {
                    "oidcs": [
                        {
                            "issuer": f"https://oidc.eks.{region}.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE"
                        }
                    ]
                }
            ],
            vpcConfig={
                **inputs.get("vpcConfig", {}),
                "clusterSecurityGroupId": PLACEHOLDER_CLUSTER_SECURITY_GROUP_ID,
            },
            arn=f"arn:aws:eks:{region}:{account}:cluster/{cluster_name}",
        )
    elif type_ == "aws:iam/role:Role":
        outputs["arn"] = f"arn:aws:iam::{account}:role/{inputs.get('name', name)}"
        outputs.setdefault("name", name)
    elif type_ == "aws:iam/openIdConnectProvider:OpenIdConnectProvider":
        url = str(inputs.get("url", "")).removeprefix("https://")
        outputs["arn"] = f"arn:aws:iam::{account}:oidc-provider/{url}"
    elif type_ == "aws:s3/bucket:Bucket" or type_.startswith("aws:s3/bucketV2"):
        bucket = inputs.get("bucket", name)
        outputs.update(bucket=bucket, arn=f"arn:aws:s3:::{bucket}", id=bucket)
    elif type_ == "aws:efs/fileSystem:FileSystem":
        outputs["id"] = "fs-0123456789abcdef0"
    elif type_ == "aws:ec2/launchTemplate:LaunchTemplate":
        outputs["latestVersion"] = 1
    elif type_ == "aws:eks/nodeGroup:NodeGroup":
        # The Auto Scaling group EKS creates for the group (its tags carry Cluster Autoscaler hints).
        group_name = f"eks-{name}-00000000-0000-0000-0000-000000000000"
        outputs["resources"] = [{"autoscalingGroups": [{"name": group_name}]}]
    elif type_ == "aws:kms/key:Key":
        key_id = f"00000000-0000-0000-0000-{zlib.crc32(name.encode()):012d}"  # stable across runs
        outputs.update(keyId=key_id, arn=f"arn:aws:kms:{region}:{account}:key/{key_id}")
    elif type_ == "aws:wafv2/webAcl:WebAcl":
        acl, acl_id = inputs.get("name", name), f"{zlib.crc32(name.encode()):08x}"
        outputs["arn"] = f"arn:aws:wafv2:{region}:{account}:regional/webacl/{acl}/{acl_id}"
    elif type_ == "aws:secretsmanager/secret:Secret":
        outputs["arn"] = f"arn:aws:secretsmanager:{region}:{account}:secret:{inputs.get('name', name)}-AbCdEf"
    return outputs


def _fake_id(type_: str, name: str, inputs: dict[str, Any]) -> str:
    short = type_.split(":")[-1].lower()
    if type_ == "aws:efs/fileSystem:FileSystem":
        return "fs-0123456789abcdef0"
    if type_.startswith("aws:s3/bucket"):
        return str(inputs.get("bucket", name))
    if type_.startswith("aws:ec2/"):
        prefixes = {
            "vpc": "vpc",
            "subnet": "subnet",
            "securitygroup": "sg",
            "natgateway": "nat",
            "internetgateway": "igw",
            "routetable": "rtb",
            "eip": "eipalloc",
            "launchtemplate": "lt",
        }
        # crc32, not hash(): ids must be the same in every process so renders diff cleanly.
        return f"{prefixes.get(short, short)}-{zlib.crc32(name.encode()):012d}"
    return f"{name}-id"


def _make_mocks(region: str, records: list[RecordedResource]):
    import pulumi
    from pulumi.runtime.mocks import MockMonitor

    class RecordingMocks(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs):
            inputs = unwrap_secrets(args.inputs)
            resource_id = _fake_id(args.typ, args.name, inputs)
            outputs = (
                _fake_outputs(args.typ, args.name, inputs, region) if args.typ.startswith("aws:") else inputs
            )
            pending = _pending_parents.pop((args.typ, args.name), "")
            ignored = _pending_ignore_changes.pop((args.typ, args.name), ())
            records.append(
                RecordedResource(
                    args.typ, args.name, inputs, pending, bool(args.custom), ignore_changes=ignored
                )
            )
            return [resource_id, outputs]

        def call(self, args: pulumi.runtime.MockCallArgs):
            if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
                names = [f"{region}{letter}" for letter in "abcdef"]
                return {"names": names, "zoneIds": [f"use-az{i}" for i in range(1, 7)], "state": "available"}
            if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
                return {
                    "accountId": PLACEHOLDER_ACCOUNT_ID,
                    "arn": f"arn:aws:iam::{PLACEHOLDER_ACCOUNT_ID}:user/render",
                    "userId": "AIDARENDER",
                    "id": PLACEHOLDER_ACCOUNT_ID,
                }
            if args.token == "aws:index/getPartition:getPartition":
                return {"partition": "aws", "dnsSuffix": "amazonaws.com", "id": "aws"}
            if args.token == "aws:index/getRegion:getRegion":
                return {"name": region, "region": region, "id": region}
            if args.token == "aws:iam/getSessionContext:getSessionContext":
                arn = str(args.args.get("arn", ""))  # the mocked caller is an IAM user: passed through
                return {"arn": arn, "issuerArn": arn, "id": arn}
            if args.token == "aws:eks/getAddonVersion:getAddonVersion":
                # EKS's real default is looked up at preview; the render marks it as a placeholder.
                addon = args.args.get("addonName")
                return {
                    "addonName": addon,
                    "version": "v0.0.0-eksbuild.render",
                    "id": addon,
                    "kubernetesVersion": args.args.get("kubernetesVersion"),
                }
            return {}

    _pending_parents: dict[tuple[str, str], str] = {}
    _pending_ignore_changes: dict[tuple[str, str], tuple[str, ...]] = {}

    class ParentRecordingMonitor(MockMonitor):
        def RegisterResource(self, request):
            _pending_parents[(request.type, request.name)] = request.parent
            _pending_ignore_changes[(request.type, request.name)] = tuple(request.ignoreChanges)
            response = super().RegisterResource(request)
            for record in reversed(records):
                if record.type == request.type and record.name == request.name and not record.urn:
                    record.urn = response.urn
                    break
            return response

    mocks = RecordingMocks()
    return mocks, ParentRecordingMonitor(mocks)


def render_stack(
    stack: str, *, stack_file: Path | None = None, allow_missing_charts: bool = False
) -> RenderResult:
    """Run the Pulumi program for one stack under mocks; raises ConfigError for an invalid config.

    Chart releases are expanded from the verified chart cache; a chart that differs from the lock
    always raises ChartCacheError, a missing one too unless `allow_missing_charts`, when the release
    is listed in `unexpanded_releases` and only its values are rendered.
    """
    path = stack_file or stack_file_for(stack)
    shown = display_path(path)
    # Validate (with the full message) before starting the runtime: bad input must never turn into
    # a Pulumi traceback.
    from infra.stack_checks import load_stack

    config = load_stack(stack, stack_file=path)
    raw_config = read_stack_file(path)
    # Each render gets a fresh context: the Pulumi runtime keeps its state in context variables.
    result = contextvars.Context().run(_render_in_context, stack, shown, raw_config)
    result.chart_objects, result.unexpanded_releases = expand_chart_releases(
        result, config, allow_missing_charts=allow_missing_charts
    )
    return result


KUBERNETES_API_VERSIONS = Path(__file__).resolve().parent / "data" / "kubernetes-api-versions.json"
"""Built-in API versions per Kubernetes version (scripts/snapshot-kubernetes-api-versions.py)."""


def builtin_api_versions(kubernetes_version: str) -> set[str]:
    """What the cluster's API server serves before any CRD: `.Capabilities.APIVersions` of a real install."""
    return set(json.loads(KUBERNETES_API_VERSIONS.read_text())[kubernetes_version])


def _operator_api_versions(monitoring: MonitoringConfig) -> set[str]:
    """API versions an existing cluster already serves that charts may ask `.Capabilities` about."""
    if monitoring.enabled and monitoring.prometheus == "existing" and monitoring.existing_prometheus_operator:
        group = "monitoring.coreos.com/v1"
        return {group, *(f"{group}/{kind}" for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"))}
    return set()


def expand_chart_releases(
    result: RenderResult, config: PlatformConfig, *, allow_missing_charts: bool = False
) -> tuple[list[ChartObject], list[str]]:
    """Render every chart release with Helm, as `helm.v4.Chart` would at `pulumi up`.

    Twice: the first pass finds the CustomResourceDefinitions the stack installs, so the second
    renders with `.Capabilities.APIVersions` as they are once the stack is up (docs/charts.md).
    Each release's chart is checked against the lock first; returns the objects and the releases
    left unexpanded because their chart is not in the cache (only with `allow_missing_charts`).
    """
    problems: list[CacheProblem] = []
    missing: list[str] = []
    releases = []
    for release in (r.inputs for r in result.resources if r.type == CHART_RELEASE_TYPE):
        found = cache_problems(lock_entry_for_path(release["chart"]), Path(release["chart"]).parents[1])
        if not found:
            releases.append(release)
        elif allow_missing_charts and all(problem.missing for problem in found):
            missing.append(release["name"])
        else:
            problems.extend(p for p in found if p not in problems)
    if problems:
        raise ChartCacheError(problems)

    def render(
        release: dict[str, Any], api_versions: set[str], cluster_scoped: set[str]
    ) -> list[ChartObject]:
        return render_chart(
            Path.cwd() / release["chart"],
            release=release["name"],
            namespace=release["namespace"],
            values=release.get("values") or {},
            kubernetes_version=config.cluster.kubernetes_version,
            api_versions=api_versions,
            cluster_scoped_kinds=cluster_scoped,
        )

    builtin = builtin_api_versions(config.cluster.kubernetes_version)
    first = [render(release, builtin, set()) for release in releases]
    api_versions, cluster_scoped = crd_api_versions(item for objects in first for item in objects)
    api_versions |= builtin | _operator_api_versions(config.monitoring)
    objects: list[ChartObject] = []
    for release, rendered in zip(releases, first, strict=True):
        custom_cluster_scoped = any(item.kind in cluster_scoped for item in rendered)
        if asks_api_versions(Path.cwd() / release["chart"]) or custom_cluster_scoped:
            rendered = render(release, api_versions, cluster_scoped)
        objects.extend(rendered)
    return objects, sorted(missing)


def _render_in_context(
    stack: str, shown: str, raw_config: dict[str, Any], check_charts: bool = False
) -> RenderResult:
    """The program under mocks; `check_charts` runs the chart-cache check `pulumi up` runs (tests)."""
    import pulumi
    from pulumi.runtime import config as runtime_config
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    from infra.program import run_program

    region = str((raw_config.get("cluster") or {}).get("region", "us-west-2"))
    records: list[RecordedResource] = []
    mocks, monitor = _make_mocks(region, records)
    pulumi.runtime.set_mocks(mocks, project="vllm-platform", stack=stack, preview=False, monitor=monitor)
    flat = {
        f"vllm-platform:{key}": json.dumps(value) if not isinstance(value, str) else value
        for key, value in raw_config.items()
    }
    runtime_config.set_all_config(flat)

    result = RenderResult(stack=stack, stack_file=shown, resources=records)

    def program() -> Any:
        outputs = run_program(stack_file_display=shown, check_charts=check_charts)

        def keep(values: dict[str, Any]) -> None:
            result.outputs.update(unwrap_secrets(values))

        return pulumi.Output.from_input(outputs).apply(keep)

    def run() -> None:
        value = program()
        _sync_await(value.future())

    _sync_await(run_pulumi_func(run))
    # The SDK registers resources from concurrent tasks, so arrival order varies between runs;
    # a stable order keeps renders and their diffs deterministic.
    records.sort(key=lambda record: (record.type, record.name))
    return result


def _object_filename(obj: dict[str, Any]) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml_documents(path: Path) -> list[Any]:
    """The non-empty documents of one file `write_render` wrote, read back with libyaml's parser where
    PyYAML has it (the safe constructors either way): a render's chart objects are megabytes of YAML,
    which the pure-Python parser took about 20 s to read per stack."""
    return [document for document in yaml.load_all(path.read_text(), Loader=_YAML_LOADER) if document]


def write_render(result: RenderResult, out_dir: Path) -> None:
    """One YAML file per Kubernetes object grouped by namespace; Helm releases; AWS inputs as JSON."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    kube_dir = out_dir / "kubernetes"
    for obj in result.kubernetes_objects:
        namespace = obj.get("metadata", {}).get("namespace") or "_cluster"
        target = kube_dir / namespace / _object_filename(obj)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(obj, sort_keys=False))
    for release in result.helm_releases:
        target = out_dir / "helm" / f"{release.get('namespace', 'default')}-{release['name']}.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        # The chart by name, version and digest, not by its cache path (which differs per machine).
        entry = chart_metadata(release)
        written = {**release, "chart": entry.name, "chartVersion": entry.version, "chartDigest": entry.digest}
        if release["name"] in result.unexpanded_releases:
            written["expanded"] = False
        target.write_text(yaml.safe_dump(written, sort_keys=False))
    for item in result.chart_objects:
        if item.is_hook:
            continue  # helm.v4.Chart does not apply hooks; tests/test_chart_objects.py reports any
        namespace = item.namespace or "_cluster"
        target = out_dir / "charts" / item.release / namespace / _object_filename(item.object)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(item.object, sort_keys=False))
    aws = [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in result.aws_resources]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "aws-resources.json").write_text(
        json.dumps(sorted(aws, key=lambda r: (r["type"], r["name"])), indent=2)
    )
    (out_dir / "stack-outputs.json").write_text(
        json.dumps(_redact_outputs(result.outputs), indent=2, default=str)
    )


def _redact_outputs(outputs: dict[str, Any]) -> dict[str, Any]:
    return {key: ("[secret]" if key == "kubeconfig" else value) for key, value in outputs.items()}


def chart_metadata(release: dict[str, Any]) -> LockedChart:
    """The lock entry of the chart a release installs (its `chart` input is that chart's cache path)."""
    return lock_entry_for_path(release["chart"])


def _release_versions(result: RenderResult) -> list[tuple[str, str]]:
    releases = [(release["name"], chart_metadata(release)) for release in result.helm_releases]
    return [(f"{name} ({chart.name})", chart.version) for name, chart in releases]


def summarize(result: RenderResult) -> str:
    kinds = Counter(obj["kind"] for obj in result.kubernetes_objects)
    aws_types = Counter(r.type.split(":")[-1] for r in result.aws_resources)
    lines = [
        f"stack {result.stack} ({result.stack_file}): {len(result.kubernetes_objects)} Kubernetes objects, "
        f"{len(result.helm_releases)} Helm releases ({len(result.deployed_chart_objects)} chart objects), "
        f"{len(result.aws_resources)} AWS resources",
        "  kubernetes: " + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())),
        "  helm: " + ", ".join(sorted(f"{name}@{version}" for name, version in _release_versions(result))),
        "  aws: " + ", ".join(f"{kind} {count}" for kind, count in sorted(aws_types.items())),
    ]
    if result.unexpanded_releases:
        lines.append(
            f"  not expanded ({len(result.unexpanded_releases)} of {len(result.helm_releases)} releases: "
            f"their charts are not in the chart cache; values written, objects not; run `{PULL_COMMAND}`): "
            + ", ".join(result.unexpanded_releases)
        )
    return "\n".join(lines)
