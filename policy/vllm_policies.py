"""vllm-platform's own rules: what a GPU serving stack needs that no generic scanner checks.

Plain functions over plain data, so one code path serves both callers:
- the Pulumi policy pack (`policy/__main__.py`, run by `pulumi preview --policy-pack policy`),
  which hands them `args.props` — the resource's inputs (outputs, for stack policies);
- the test suite, which hands them the records of the offline render (`RenderResult.resources`).

Stdlib only: the pack runs in its own virtualenv without this repository installed. Props may be
read-only Mapping/Sequence proxies (pulumi_policy raises UnknownValueError on values unknown during
preview), never assume dict/list.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_GPU_TAINT_KEYS = ("nvidia.com/gpu",)
# Kubernetes' default when a pod does not set terminationGracePeriodSeconds.
DEFAULT_GRACE_PERIOD_SECONDS = 30
EKS_NODE_GROUP_TYPE = "aws:eks/nodeGroup:NodeGroup"
HELM_RELEASE_TYPE = "kubernetes:helm.sh/v3:Release"
HELM_CHART_TYPE = "kubernetes:helm.sh/v4:Chart"
# EKS spells taint effects in its API's enum style.
_EKS_TAINT_EFFECTS = {
    "NO_SCHEDULE": "NoSchedule",
    "NO_EXECUTE": "NoExecute",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
}
_HARD_TAINT_EFFECTS = ("NoSchedule", "NoExecute")
# Rollout: Argo Rollouts' replacement for a Deployment (canary models); same spec.template.
_WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Rollout")
LWS_KIND = "LeaderWorkerSet"
"""A model larger than one node (issue 42): groups of pods from a leader and a worker template."""


@dataclass(frozen=True)
class Resource:
    """One resource as a rule sees it: Pulumi type token, Pulumi name, and its properties."""

    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""
    ignore_changes: tuple[str, ...] = ()
    """Its resource options' ignore_changes: properties `pulumi up` sets at creation only."""

    @property
    def is_kubernetes_object(self) -> bool:
        return (
            self.type.startswith("kubernetes:")
            and self.type not in (HELM_RELEASE_TYPE, HELM_CHART_TYPE)
            and "kind" in self.props
        )

    @property
    def kind(self) -> str:
        return str(self.props.get("kind", "")) if self.is_kubernetes_object else ""

    @property
    def metadata(self) -> Mapping[str, Any]:
        return _mapping(self.props.get("metadata"))

    @property
    def namespace(self) -> str:
        # Objects without a namespace land in `default` (cluster-scoped kinds ignore it).
        return str(self.metadata.get("namespace") or "default")

    @property
    def label(self) -> str:
        """How messages name the object: `Kind namespace/name` (or the Pulumi name for non-objects)."""
        if not self.is_kubernetes_object:
            return f"{self.type} {self.name}"
        name = self.metadata.get("name", self.name)
        namespace = self.metadata.get("namespace")
        return f"{self.kind} {namespace}/{name}" if namespace else f"{self.kind} {name}"


@dataclass(frozen=True)
class Violation:
    resource: Resource | None
    message: str

    def __str__(self) -> str:
        return f"{self.resource.label}: {self.message}" if self.resource else self.message


@dataclass(frozen=True)
class PolicySettings:
    """The pack's configuration (policy config `gpuTaintKeys`); defaults match the stack's defaults."""

    gpu_taint_keys: tuple[str, ...] = DEFAULT_GPU_TAINT_KEYS


ResourceCheck = Callable[[Resource, PolicySettings], list[str]]
StackCheck = Callable[[Sequence[Resource], PolicySettings], list[Violation]]


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    scope: Literal["resource", "stack"]
    check: Callable[..., Any] = field(repr=False)


# ---------------------------------------------------------------------------------------------
# Reading Kubernetes objects (tolerant of missing fields and of read-only proxies)
# ---------------------------------------------------------------------------------------------


def number_text(value: Any) -> str:
    """A quantity as text; the engine hands the pack every number as a float (1 arrives as 1.0)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sequence(value: Any) -> Sequence[Any]:
    return value if isinstance(value, Sequence) and not isinstance(value, str | bytes) else ()


def pod_spec(resource: Resource) -> Mapping[str, Any] | None:
    """The pod spec a Kubernetes object creates pods from, or None for objects without pods."""
    spec = _mapping(resource.props.get("spec"))
    kind = resource.kind
    if kind == "Pod":
        return spec
    if kind in _WORKLOAD_KINDS:
        return _mapping(_mapping(spec.get("template")).get("spec"))
    if kind == "CronJob":
        job = _mapping(_mapping(spec.get("jobTemplate")).get("spec"))
        return _mapping(_mapping(job.get("template")).get("spec"))
    return None


def _lws_templates(resource: Resource) -> list[tuple[str, Mapping[str, Any]]]:
    """A LeaderWorkerSet's (role, pod template): the leader's defaults to the worker's, as LWS does."""
    group = _mapping(_mapping(resource.props.get("spec")).get("leaderWorkerTemplate"))
    worker = _mapping(group.get("workerTemplate"))
    return [("leader", _mapping(group.get("leaderTemplate")) or worker), ("worker", worker)]


def pod_specs(resource: Resource) -> list[tuple[str, Mapping[str, Any]]]:
    """(role, pod spec) of every pod template the object creates pods from: one, role "", for the
    workload kinds; a LeaderWorkerSet's leader and worker. Empty for objects without pods."""
    if resource.kind == LWS_KIND:
        return [(role, _mapping(template.get("spec"))) for role, template in _lws_templates(resource)]
    spec = pod_spec(resource)
    return [] if spec is None else [("", spec)]


def _each_template(
    resource: Resource,
    settings: PolicySettings,
    check: Callable[[Mapping[str, Any], PolicySettings], list[str]],
) -> list[str]:
    """`check` over each pod spec of `resource`; a LeaderWorkerSet's findings name their template."""
    return [
        f"{role} template: {problem}" if role else problem
        for role, spec in pod_specs(resource)
        for problem in check(spec, settings)
    ]


def pod_template_labels(resource: Resource) -> Mapping[str, Any]:
    spec = _mapping(resource.props.get("spec"))
    if resource.kind == "Pod":
        return _mapping(resource.metadata.get("labels"))
    if resource.kind == LWS_KIND:
        # What a selector must match on every member: the labels both templates carry.
        leader, worker = (
            _mapping(_mapping(t.get("metadata")).get("labels")) for _, t in _lws_templates(resource)
        )
        return {key: value for key, value in leader.items() if worker.get(key) == value}
    return _mapping(_mapping(_mapping(spec.get("template")).get("metadata")).get("labels"))


def pods_per_replica(resource: Resource) -> int:
    """A LeaderWorkerSet's replica is a group of `size` pods; every other workload's is one pod."""
    if resource.kind != LWS_KIND:
        return 1
    group = _mapping(_mapping(resource.props.get("spec")).get("leaderWorkerTemplate"))
    return int(group.get("size", 1))


def all_containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in _sequence(spec.get(key)):
            yield _mapping(container)


def _gpu_quantities(container: Mapping[str, Any]) -> tuple[Any, Any]:
    resources = _mapping(container.get("resources"))
    return _mapping(resources.get("requests")).get(GPU_RESOURCE), _mapping(resources.get("limits")).get(
        GPU_RESOURCE
    )


def requests_gpus(spec: Mapping[str, Any]) -> bool:
    return any(quantity is not None for c in all_containers(spec) for quantity in _gpu_quantities(c))


def _container_words(container: Mapping[str, Any]) -> list[str]:
    return [str(word) for word in (*_sequence(container.get("command")), *_sequence(container.get("args")))]


def parse_image(reference: str) -> tuple[str, str | None, str | None]:
    """(repository, tag, digest) of an image reference; a registry port is not a tag."""
    name, _, digest = reference.partition("@")
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        return name[:colon], name[colon + 1 :], digest or None
    return name, None, digest or None


def is_vllm_container(container: Mapping[str, Any]) -> bool:
    """The vLLM OpenAI server: the upstream image, `vllm serve`, or the api_server module."""
    repository = parse_image(str(container.get("image", "")))[0]
    if repository.rsplit("/", 1)[-1].startswith("vllm-openai"):
        return True
    words = _container_words(container)
    pairs = itertools.pairwise(words)
    return any(a.rsplit("/", 1)[-1] == "vllm" and b == "serve" for a, b in pairs) or (
        "vllm.entrypoints.openai.api_server" in words
    )


def flag_value(words: Sequence[str], flag: str) -> str | None:
    """The value of `--flag VALUE` or `--flag=VALUE` (the last one wins, as with argparse)."""
    found = None
    for index, word in enumerate(words):
        if word == flag and index + 1 < len(words):
            found = words[index + 1]
        elif word.startswith(flag + "="):
            found = word.split("=", 1)[1]
    return found


_SLEEP = re.compile(r"(?:^|[;&|\s])sleep\s+(\d+)(?:s)?(?:\s|$|;|&)")


def pre_stop_sleep_seconds(container: Mapping[str, Any]) -> int:
    """Seconds a preStop hook sleeps: the native `sleep` action or an exec `sleep N`; 0 without one."""
    pre_stop = _mapping(_mapping(container.get("lifecycle")).get("preStop"))
    sleep = _mapping(pre_stop.get("sleep"))
    if "seconds" in sleep:
        return int(sleep["seconds"])
    command = " ".join(str(word) for word in _sequence(_mapping(pre_stop.get("exec")).get("command")))
    return sum(int(seconds) for seconds in _SLEEP.findall(command))


# ---------------------------------------------------------------------------------------------
# Scheduling: selectors, node groups, taints and tolerations (Kubernetes semantics)
# ---------------------------------------------------------------------------------------------


def tolerates(toleration: Mapping[str, Any], key: str, value: str, effect: str) -> bool:
    """Kubernetes' rule: empty effect matches all effects; Exists ignores the value; empty key + Exists
    matches every taint."""
    tol_effect = toleration.get("effect") or ""
    if tol_effect and tol_effect != effect:
        return False
    operator = toleration.get("operator") or "Equal"
    tol_key = toleration.get("key") or ""
    if not tol_key:
        return operator == "Exists"
    if tol_key != key:
        return False
    return operator == "Exists" or str(toleration.get("value") or "") == value


def _tolerates_key(toleration: Mapping[str, Any], key: str, effect: str) -> bool:
    """Tolerates a taint of this key and effect whatever its value (the pack knows keys, not values)."""
    if (toleration.get("effect") or effect) != effect:
        return False
    if not toleration.get("key"):
        return toleration.get("operator") == "Exists"
    return toleration.get("key") == key


def _required_node_selector_terms(spec: Mapping[str, Any]) -> Sequence[Any]:
    node_affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = _mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    return _sequence(required.get("nodeSelectorTerms"))


def _expression_matches(expression: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    key = expression.get("key")
    operator = expression.get("operator")
    values = [str(v) for v in _sequence(expression.get("values"))]
    if operator == "In":
        return key in labels and str(labels[key]) in values
    if operator == "NotIn":
        return key not in labels or str(labels[key]) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False  # Gt/Lt on node-group labels: not used by this stack; treat as no match


def selects_node_labels(spec: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """Whether nodes with these labels satisfy the pod's nodeSelector and required node affinity."""
    selector = _mapping(spec.get("nodeSelector"))
    if any(str(labels.get(key)) != str(value) for key, value in selector.items()):
        return False
    terms = _required_node_selector_terms(spec)
    if not terms:
        return True
    return any(
        all(
            _expression_matches(_mapping(e), labels)
            for e in _sequence(_mapping(term).get("matchExpressions"))
        )
        for term in terms
    )


@dataclass(frozen=True)
class NodeGroup:
    name: str
    labels: Mapping[str, Any]
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect in Kubernetes spelling)


def node_groups(resources: Sequence[Resource]) -> list[NodeGroup]:
    groups = []
    for resource in resources:
        if resource.type != EKS_NODE_GROUP_TYPE:
            continue
        taints = tuple(
            (
                str(t.get("key", "")),
                str(t.get("value") or ""),
                _EKS_TAINT_EFFECTS.get(str(t.get("effect")), str(t.get("effect"))),
            )
            for t in map(_mapping, _sequence(resource.props.get("taints")))
        )
        name = str(resource.props.get("nodeGroupName") or resource.name)
        groups.append(NodeGroup(name, _mapping(resource.props.get("labels")), taints))
    groups += [_node_pool_group(resource) for resource in resources if _is_karpenter_node_pool(resource)]
    return groups


def _is_karpenter_node_pool(resource: Resource) -> bool:
    api_version = str(resource.props.get("apiVersion", ""))
    return resource.kind == "NodePool" and api_version.startswith("karpenter.sh/")


def _node_pool_group(resource: Resource) -> NodeGroup:
    """A Karpenter NodePool (issue 41) as the node group its nodes form: the template's labels, the
    label Karpenter puts on every node it launches for the pool, the labels a requirement pins to one
    value, and the template's taints (already in Kubernetes spelling)."""
    spec = _mapping(resource.props.get("spec"))
    template = _mapping(spec.get("template"))
    name = str(resource.metadata.get("name") or resource.name)
    labels: dict[str, Any] = {**_mapping(_mapping(template.get("metadata")).get("labels"))}
    labels["karpenter.sh/nodepool"] = name
    template_spec = _mapping(template.get("spec"))
    for requirement in map(_mapping, _sequence(template_spec.get("requirements"))):
        values = _sequence(requirement.get("values"))
        if requirement.get("operator") == "In" and len(values) == 1:
            labels.setdefault(str(requirement.get("key")), values[0])
    taints = tuple(
        (str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
        for t in map(_mapping, _sequence(template_spec.get("taints")))
    )
    return NodeGroup(name, labels, taints)


# ---------------------------------------------------------------------------------------------
# Resource rules
# ---------------------------------------------------------------------------------------------


def check_gpu_pods_target_gpu_nodes(resource: Resource, settings: PolicySettings) -> list[str]:
    return _each_template(resource, settings, _gpu_pod_targets_gpu_nodes)


def _gpu_pod_targets_gpu_nodes(spec: Mapping[str, Any], settings: PolicySettings) -> list[str]:
    if not requests_gpus(spec):
        return []
    problems = []
    if not _mapping(spec.get("nodeSelector")) and not _required_node_selector_terms(spec):
        problems.append(
            f"requests {GPU_RESOURCE} but has no nodeSelector or required node affinity; select its GPU "
            "group's nodes (label vllm-platform/gpu-group) so it cannot land on a node without that GPU model"
        )
    tolerations = [_mapping(t) for t in _sequence(spec.get("tolerations"))]
    for key in settings.gpu_taint_keys:
        if not any(_tolerates_key(t, key, "NoSchedule") for t in tolerations):
            problems.append(
                f"requests {GPU_RESOURCE} but does not tolerate the GPU taint '{key}' (effect NoSchedule); "
                "add the toleration of its GPU group's taint or the pod stays Pending"
            )
    return problems


def check_gpu_request_equals_limit(resource: Resource, settings: PolicySettings) -> list[str]:
    return _each_template(resource, settings, _gpu_request_equals_limit)


def _gpu_request_equals_limit(spec: Mapping[str, Any], settings: PolicySettings) -> list[str]:
    problems = []
    for container in all_containers(spec):
        request, limit = _gpu_quantities(container)
        if request is None and limit is None:
            continue
        if request is None or limit is None or number_text(request) != number_text(limit):
            problems.append(
                f"container '{container.get('name')}' has {GPU_RESOURCE} request {request} and limit "
                f"{limit}; "
                "set both to the tensor-parallel size (GPUs cannot be overcommitted)"
            )
    return problems


def check_vllm_pods_start_and_drain_safely(resource: Resource, settings: PolicySettings) -> list[str]:
    return _each_template(resource, settings, _vllm_pod_starts_and_drains_safely)


def _vllm_pod_starts_and_drains_safely(spec: Mapping[str, Any], settings: PolicySettings) -> list[str]:
    memory_volumes = {
        str(_mapping(v).get("name"))
        for v in _sequence(spec.get("volumes"))
        if "emptyDir" in _mapping(v) and _mapping(_mapping(v).get("emptyDir")).get("medium") == "Memory"
    }
    grace = spec.get("terminationGracePeriodSeconds")
    grace_seconds = int(grace) if grace is not None else DEFAULT_GRACE_PERIOD_SECONDS
    problems = []
    for container in _sequence(spec.get("containers")):
        container = _mapping(container)
        if not is_vllm_container(container):
            continue
        name = container.get("name")
        shm_mounts = [
            m
            for m in map(_mapping, _sequence(container.get("volumeMounts")))
            if m.get("mountPath") == "/dev/shm"
        ]
        if not any(str(m.get("name")) in memory_volumes for m in shm_mounts):
            problems.append(
                f"vLLM container '{name}' has no memory-backed /dev/shm; mount an emptyDir with medium "
                "Memory "
                "at /dev/shm (NCCL and vLLM's worker IPC outgrow the runtime's 64 MiB default, also at TP=1)"
            )
        # A headless member of a multi-node group (`vllm serve --headless`) serves no API: its
        # group's leader carries the probes.
        headless = "--headless" in _container_words(container)
        if not headless and not _mapping(container.get("startupProbe")):
            problems.append(
                f"vLLM container '{name}' has no startupProbe; loading a model takes minutes, give it a "
                "startupProbe on /health sized from the model (not a fixed initialDelaySeconds)"
            )
        sleep = pre_stop_sleep_seconds(container)
        timeout_text = flag_value(_container_words(container), "--shutdown-timeout")
        if timeout_text is None:
            problems.append(
                f"vLLM container '{name}' does not pass --shutdown-timeout; set it so in-flight (streaming) "
                "requests finish on rollouts and scale-in"
            )
            continue
        needed = sleep + int(float(timeout_text))
        if grace_seconds <= needed:
            problems.append(
                f"terminationGracePeriodSeconds {grace_seconds} is not longer than the preStop sleep "
                f"({sleep}s) plus --shutdown-timeout ({timeout_text}s); set it above {needed} so the kubelet "
                "does not kill "
                "vLLM mid-drain"
            )
    return problems


_FLOATING_TAGS = {"latest", "stable", "main", "master", "nightly", "edge", "dev"}


def check_images_pinned(resource: Resource, settings: PolicySettings) -> list[str]:
    return _each_template(resource, settings, _images_pinned)


def _images_pinned(spec: Mapping[str, Any], settings: PolicySettings) -> list[str]:
    problems = []
    for container in all_containers(spec):
        image = str(container.get("image") or "")
        _, tag, digest = parse_image(image)
        if digest:
            continue
        if not image or tag is None or tag.lower() in _FLOATING_TAGS or not any(ch.isdigit() for ch in tag):
            problems.append(
                f"container '{container.get('name')}' image '{image}' is not pinned to a version; use a "
                "versioned tag or a digest (pins live in domain/versions.py)"
            )
    return problems


_VERSION_RANGE = re.compile(r"[\^~*<>=|xX ]|^$")


def check_helm_charts_pinned(resource: Resource, settings: PolicySettings) -> list[str]:
    if resource.type == HELM_CHART_TYPE:
        # The stack installs only locked charts from the verified chart cache
        # (<cache>/<name>-<version>/<name>, checked against the lock before the program registers
        # anything): a repository or OCI reference would deploy something the render never expanded.
        chart = str(resource.props.get("chart") or "")
        parts = chart.rstrip("/").split("/")
        cached = (
            "://" not in chart
            and chart.startswith("/")
            and len(parts) >= 3
            and parts[-2].startswith(f"{parts[-1]}-")
            and parts[-2] != f"{parts[-1]}-"
        )
        if resource.props.get("repositoryOpts") or not cached:
            return [
                f"Helm chart '{chart}' is not a chart from the verified chart cache "
                "(<cache>/<name>-<version>/<name>); pin and lock it (docs/charts.md), run "
                "`vllm-platform charts pull`, and install it from there"
            ]
        return []
    if resource.type != HELM_RELEASE_TYPE:
        return []
    version = str(resource.props.get("version") or "")
    chart = resource.props.get("chart")
    if _VERSION_RANGE.search(version) or version.lower() == "latest":
        return [
            f"Helm chart '{chart}' has version '{version}'; pin an exact chart version in domain/versions.py"
        ]
    return []


# Name parts that mark a credential. Compared per `_`/`-`/`.`-separated part, so TOKENIZERS_PARALLELISM
# or KEYSPACE are not taken for secrets.
_SECRET_NAME_PARTS = {"KEY", "APIKEY", "TOKEN", "PASSWORD", "PASSWD", "SECRET", "CREDENTIALS", "PASSPHRASE"}
# Names that hold where a secret is, not the secret itself.
_REFERENCE_SUFFIXES = {"FILE", "PATH", "DIR", "NAME", "ARN", "REF", "MOUNT", "KEYS"}
# Formats of well-known credentials (a literal with one of these is a leak whatever its key is).
_SECRET_VALUE = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\b(AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bhf_[A-Za-z0-9]{30,}\b"
    r"|\bsk-[A-Za-z0-9_-]{20,}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}\b"
    r"|\bxox[abpr]-[A-Za-z0-9-]{10,}\b"
    r"|\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\."
)
# `password: hunter2`-style lines inside config files held in a ConfigMap.
_SECRET_ASSIGNMENT = re.compile(
    r"""^\s*["']?(?P<key>[A-Za-z0-9_.-]*(password|passwd|secret|token|api[_-]?key|apikey))["']?\s*[:=]\s*"""
    r"""["']?(?P<value>[^\s"'#]+)""",
    re.IGNORECASE | re.MULTILINE,
)


def looks_like_credential(text: str) -> bool:
    """Whether `text` contains a well-known credential format (also used by `vllm-platform validate`)."""
    return _SECRET_VALUE.search(text) is not None


def looks_like_secret_name(name: str) -> bool:
    parts = [p for p in re.split(r"[_.\-]+", name.upper()) if p]
    if not parts or parts[-1] in _REFERENCE_SUFFIXES:
        return False
    return any(
        part in _SECRET_NAME_PARTS or part.endswith(("APIKEY", "PASSWORD", "TOKEN", "SECRET"))
        for part in parts
    )


def _secret_assignments(text: str) -> list[str]:
    found = []
    for match in _SECRET_ASSIGNMENT.finditer(text):
        key, value = match["key"], match["value"]
        if (
            not looks_like_secret_name(key)
            or value.startswith(("/", "$", "{", "<", "["))
            or value.lower()
            in {
                "null",
                "none",
                "true",
                "false",
                "~",
                "",
            }
        ):
            continue
        found.append(key)
    return found


# Reviewed: serving certificates an add-on chart generates for its own admission webhook (Helm's genCA at
# template time; on `pulumi up` the chart's `lookup` keeps the one in the cluster). Not a credential of
# ours, and nothing to sync from a secret store: docs/charts.md "Webhook certificates".
CHART_WEBHOOK_CERTIFICATES = frozenset({("kube-system", "aws-load-balancer-tls")})


def _is_chart_webhook_certificate(resource: Resource) -> bool:
    metadata = _mapping(resource.props.get("metadata"))
    return (
        resource.props.get("type") == "kubernetes.io/tls"
        and (metadata.get("namespace"), metadata.get("name")) in CHART_WEBHOOK_CERTIFICATES
    )


def check_no_secret_literals(resource: Resource, settings: PolicySettings) -> list[str]:
    problems = _each_template(resource, settings, _no_secret_env_literals)
    if resource.kind == "ConfigMap":
        for section in ("data", "binaryData"):
            for key, value in _mapping(resource.props.get(section)).items():
                text = str(value)
                if (
                    looks_like_secret_name(str(key))
                    or _SECRET_VALUE.search(text)
                    or _secret_assignments(text)
                ):
                    problems.append(
                        f"{section} key '{key}' looks like a credential; ConfigMaps are readable by "
                        "anyone with "
                        "read access to the namespace — keep credentials in the secret store"
                    )
    if (
        resource.kind == "Secret"
        and not _is_chart_webhook_certificate(resource)
        and (_mapping(resource.props.get("data")) or _mapping(resource.props.get("stringData")))
    ):
        problems.append(
            "a Secret with literal data puts the value in the Pulumi program and state; sync it from the "
            "secret store with the Secrets Store CSI driver (SecretProviderClass secretObjects) instead"
        )
    return problems


def _no_secret_env_literals(spec: Mapping[str, Any], settings: PolicySettings) -> list[str]:
    problems = []
    for container in all_containers(spec):
        for env in map(_mapping, _sequence(container.get("env"))):
            value = env.get("value")
            if value in (None, ""):
                continue
            name = str(env.get("name", ""))
            if looks_like_secret_name(name) or _SECRET_VALUE.search(str(value)):
                problems.append(
                    f"container '{container.get('name')}' sets env {name} to a literal value; "
                    "read it from "
                    "the secret store (CSI-mounted Secret via valueFrom.secretKeyRef or a mounted file)"
                )
    return problems


# ---------------------------------------------------------------------------------------------
# Stack rules (need more than one resource)
# ---------------------------------------------------------------------------------------------


def check_gpu_pods_tolerate_node_group_taints(
    resources: Sequence[Resource], settings: PolicySettings
) -> list[Violation]:
    """Every GPU pod lands on a node group of the stack and tolerates that group's hard taints.

    Only where the stack owns the node groups (mode `eks`); on an existing cluster the node groups
    are not resources of the stack, and check_gpu_pods_target_gpu_nodes is what applies.
    """
    groups = node_groups(resources)
    if not groups:
        return []
    violations = []
    templates = [(r, spec) for r in resources if r.is_kubernetes_object for _, spec in pod_specs(r)]
    for resource, spec in templates:
        if not requests_gpus(spec):
            continue
        selected = [g for g in groups if selects_node_labels(spec, g.labels)]
        if not selected:
            violations.append(
                Violation(
                    resource,
                    (
                        "its nodeSelector/node affinity matches no node group of the stack "
                        f"({', '.join(g.name for g in groups)}); it would stay Pending"
                    ),
                )
            )
            continue
        tolerations = [_mapping(t) for t in _sequence(spec.get("tolerations"))]
        for group in selected:
            for key, value, effect in group.taints:
                if effect in _HARD_TAINT_EFFECTS and not any(
                    tolerates(t, key, value, effect) for t in tolerations
                ):
                    shown = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
                    violations.append(
                        Violation(
                            resource,
                            (
                                f"does not tolerate taint {shown} of node group {group.name}; add the "
                                "toleration from components/scheduling.py (gpu_group_tolerations) or the "
                                "pod stays Pending"
                            ),
                        )
                    )
    return violations


def _autoscaler_targets(resources: Sequence[Resource]) -> Iterator[tuple[Resource, str, str, str]]:
    """(autoscaler, namespace, kind, name) for every HPA and KEDA ScaledObject."""
    for resource in resources:
        if resource.kind not in ("HorizontalPodAutoscaler", "ScaledObject"):
            continue
        target = _mapping(_mapping(resource.props.get("spec")).get("scaleTargetRef"))
        # KEDA's scaleTargetRef.kind defaults to Deployment.
        yield (
            resource,
            resource.namespace,
            str(target.get("kind") or "Deployment"),
            str(target.get("name", "")),
        )


def declares_replicas(workload: Resource) -> bool:
    """Whether the program sets spec.replicas.

    The render and resource policies see inputs. Stack policies see outputs: for a deployed object,
    the live object, where the API server always fills spec.replicas — there, whether Pulumi's field
    manager owns spec.replicas (metadata.managedFields, server-side apply) is what the program set.
    """
    managed_fields = _sequence(workload.metadata.get("managedFields"))
    if not managed_fields:
        return "replicas" in _mapping(workload.props.get("spec"))
    for entry in map(_mapping, managed_fields):
        if not str(entry.get("manager", "")).startswith("pulumi") or entry.get("subresource"):
            continue
        if "f:replicas" in _mapping(_mapping(entry.get("fieldsV1")).get("f:spec")):
            return True
    return False


def _find_object(resources: Sequence[Resource], namespace: str, kind: str, name: str) -> Resource | None:
    for resource in resources:
        if (
            resource.kind == kind
            and resource.namespace == namespace
            and resource.metadata.get("name") == name
        ):
            return resource
    return None


def check_autoscaled_workloads_omit_replicas(
    resources: Sequence[Resource], settings: PolicySettings
) -> list[Violation]:
    violations = []
    for autoscaler, namespace, kind, name in _autoscaler_targets(resources):
        target = _find_object(resources, namespace, kind, name)
        if target is None:
            violations.append(
                Violation(
                    autoscaler,
                    (
                        f"scales {kind} {namespace}/{name}, which the stack does not define; "
                        "fix scaleTargetRef"
                    ),
                )
            )
        elif declares_replicas(target) and "spec.replicas" not in target.ignore_changes:
            # Set at creation only (ignore_changes), as a to-zero model's 0 is, no `up` resets it.
            violations.append(
                Violation(
                    target,
                    (
                        f"sets spec.replicas although {autoscaler.label} owns its replica count; "
                        "every `pulumi up` "
                        "would reset the autoscaler's decision — omit spec.replicas, or set it at "
                        "creation only (ignore_changes: spec.replicas)"
                    ),
                )
            )
    return violations


def _lowest_replicas(resources: Sequence[Resource], workload: Resource) -> int:
    """The fewest replicas the workload runs with: the autoscaler's minimum, else spec.replicas."""
    namespace, name = workload.namespace, workload.metadata.get("name")
    for autoscaler, as_namespace, kind, target in _autoscaler_targets(resources):
        if (as_namespace, kind, target) == (namespace, workload.kind, name):
            spec = _mapping(autoscaler.props.get("spec"))
            # HPA minReplicas defaults to 1; KEDA minReplicaCount defaults to 0.
            if autoscaler.kind == "ScaledObject":
                return int(spec.get("minReplicaCount", 0))
            return int(spec.get("minReplicas", 1))
    return int(_mapping(workload.props.get("spec")).get("replicas", 1))


def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    match_labels = _mapping(selector.get("matchLabels"))
    if any(str(labels.get(k)) != str(v) for k, v in match_labels.items()):
        return False
    expressions = [_mapping(e) for e in _sequence(selector.get("matchExpressions"))]
    return bool(match_labels or expressions) and all(_expression_matches(e, labels) for e in expressions)


def _scaled(value: Any, replicas: int, *, round_up: bool) -> int:
    """An int-or-percent PDB field as a pod count (Kubernetes rounds both fields up)."""
    text = number_text(value)
    if text.endswith("%"):
        fraction = float(text[:-1]) / 100 * replicas
        return math.ceil(fraction) if round_up else math.floor(fraction)
    return int(text)


def check_pdbs_allow_node_drains(resources: Sequence[Resource], settings: PolicySettings) -> list[Violation]:
    violations = []
    for pdb in resources:
        if pdb.kind != "PodDisruptionBudget":
            continue
        spec = _mapping(pdb.props.get("spec"))
        selector = _mapping(spec.get("selector"))
        workloads = [
            r
            for r in resources
            if r.kind in ("Deployment", "StatefulSet", "ReplicaSet", "Rollout", LWS_KIND)
            and r.namespace == pdb.namespace
            and _selector_matches(selector, pod_template_labels(r))
        ]
        if not workloads:
            violations.append(
                Violation(pdb, "its selector matches no workload of the stack; fix spec.selector")
            )
            continue
        # PDBs count pods: a LeaderWorkerSet's replica is a group of them.
        replicas = sum(_lowest_replicas(resources, w) * pods_per_replica(w) for w in workloads)
        if "maxUnavailable" in spec:
            allowed = _scaled(spec["maxUnavailable"], replicas, round_up=True)
        else:
            allowed = replicas - _scaled(spec.get("minAvailable", 1), replicas, round_up=True)
        if replicas > 0 and allowed < 1:
            violations.append(
                Violation(
                    pdb,
                    (
                        f"allows no disruption at {replicas} replica(s) (the lowest count it runs with), "
                        "so node drains and node-group upgrades block; use maxUnavailable: 1 or a "
                        "minAvailable below the replica count"
                    ),
                )
            )
        protects = allowed < replicas
        if protects and spec.get("unhealthyPodEvictionPolicy") != "AlwaysAllow":
            violations.append(
                Violation(
                    pdb,
                    (
                        "unhealthyPodEvictionPolicy is not AlwaysAllow: a pod that never becomes ready "
                        "(a model that fails to load) blocks every drain of its node; set "
                        "unhealthyPodEvictionPolicy: AlwaysAllow"
                    ),
                )
            )
    return violations


RULES: tuple[Rule, ...] = (
    Rule(
        "gpu-pods-target-gpu-nodes",
        "Pods requesting nvidia.com/gpu select GPU nodes and tolerate the GPU taint.",
        "resource",
        check_gpu_pods_target_gpu_nodes,
    ),
    Rule(
        "gpu-pods-tolerate-node-group-taints",
        "Pods requesting nvidia.com/gpu select a node group of the stack and tolerate its taints.",
        "stack",
        check_gpu_pods_tolerate_node_group_taints,
    ),
    Rule(
        "gpu-request-equals-limit",
        "nvidia.com/gpu requests equal limits on every container.",
        "resource",
        check_gpu_request_equals_limit,
    ),
    Rule(
        "vllm-pods-start-and-drain-safely",
        "vLLM pods have a memory-backed /dev/shm, a startupProbe, and a grace period longer than "
        "preStop sleep plus --shutdown-timeout.",
        "resource",
        check_vllm_pods_start_and_drain_safely,
    ),
    Rule(
        "autoscaled-workloads-omit-replicas",
        "A workload an HPA or ScaledObject scales does not set spec.replicas (or only at creation).",
        "stack",
        check_autoscaled_workloads_omit_replicas,
    ),
    Rule(
        "images-pinned",
        "Container images are pinned to a version or digest, never latest or untagged.",
        "resource",
        check_images_pinned,
    ),
    Rule(
        "helm-charts-pinned",
        "Helm releases install a vendored chart directory, or pin an exact chart version.",
        "resource",
        check_helm_charts_pinned,
    ),
    Rule(
        "pdbs-allow-node-drains",
        "PodDisruptionBudgets allow at least one eviction and evict unhealthy pods (AlwaysAllow).",
        "stack",
        check_pdbs_allow_node_drains,
    ),
    Rule(
        "no-secret-literals",
        "No credentials in env literals, ConfigMaps or Secret objects of the program.",
        "resource",
        check_no_secret_literals,
    ),
)


def run_rules(
    resources: Sequence[Resource], settings: PolicySettings | None = None, rules: Sequence[Rule] = RULES
) -> list[tuple[str, Violation]]:
    """Every rule over every resource: what the pack reports during a preview, as (rule, violation)."""
    settings = settings or PolicySettings()
    found: list[tuple[str, Violation]] = []
    for rule in rules:
        if rule.scope == "stack":
            found.extend((rule.name, v) for v in rule.check(resources, settings))
            continue
        for resource in resources:
            found.extend(
                (rule.name, Violation(resource, message)) for message in rule.check(resource, settings)
            )
    return found
