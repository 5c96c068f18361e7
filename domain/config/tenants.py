"""Tenants: the teams that call the API, each with its own keys, the served names it may call and
its limits (issue 26; docs/security.md, "Tenants")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, model_validator

from domain.config.base import StrictModel, dns_label
from domain.config.errors import ConfigProblem, Problem
from domain.config.models import ModelConfig, SecretRefConfig

if TYPE_CHECKING:
    from domain.config.platform import PlatformConfig

WAF_MINIMUM_RATE_LIMIT = 10
"""AWS WAF's lowest rate-based limit per evaluation window (WAF developer guide, "Rate-based rule
high-level settings"); the window here is 60 s, so a tenant's requests_per_minute is the limit."""
WAF_MAXIMUM_RATE_LIMIT = 2_000_000_000
"""AWS WAF's largest rate-based limit (API reference, RateBasedStatement.Limit)."""


class TenantConfig(StrictModel):
    """A team calling the API: its keys (from the secret store), the served names it may call, and
    optional limits. With `tenants` set, the per-model `api_key_secret` is not used: every vLLM pod
    accepts the keys of exactly the tenants allowed on one of its served names."""

    name: Annotated[str, dns_label(40)]
    """Unique; the `tenant` label of the usage series and part of the key prefix."""
    models: Annotated[list[str], Field(min_length=1)]
    """Served names this tenant may call: a model's `served_model_name` (or its `name` when unset),
    or a LoRA adapter's name. A base model does not imply its adapters: list them too."""
    api_key_secrets: list[SecretRefConfig] = []
    """The tenant's keys in the secret store (never the values): one, or two while a key rotates
    (add the new one, hand it out, remove the old one). Each key must start with `key_prefix`."""
    key_prefix: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}[_-]$")] | None = None
    """The non-secret start of every key of this tenant (lowercase, ending in `-` or `_`); defaults
    to `tk-<name>_` (not `sk-`: a long `sk-` prefix alone would match the credential patterns of
    validate and the policy pack). The WAF's
    per-tenant rate rule matches it (the secret rest of the key never appears in any config), and the
    vLLM pods refuse a key of this tenant that does not start with it."""
    requests_per_minute: (
        Annotated[int, Field(ge=WAF_MINIMUM_RATE_LIMIT, le=WAF_MAXIMUM_RATE_LIMIT)] | None
    ) = None
    """Most requests per minute per key, enforced at the load balancer by an AWS WAF rate-based rule
    (answers 429 beyond it) before any GPU sees the request; null: no limit. Needs `cluster.mode:
    eks` and ingress class `alb` (the stack creates the web ACL)."""
    max_concurrent_requests: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    """Sequences in flight at once over all pods of a model that the tenant may have, each prompt of
    a request times its `n` counting one, as vLLM's engines count them: each vLLM pod answers 429
    (`Retry-After`) past the tenant's share, ceil(this / the model's fewest replicas), counted over
    all its API-server processes (a request with more sequences than the share gets 400), and the
    `TenantOverConcurrencyLimit` alert fires when the summed in-flight requests pass it
    (docs/security.md, "Tenants"). Null: on a model other tenants may call too, the default share,
    the model's engine slots split evenly (`max_num_seqs` x fewest replicas x data-parallel engines
    per replica / its tenants; `vllm-platform plan` lists it), with no alert; on a model of its own,
    none."""

    @model_validator(mode="after")
    def _has_a_key(self) -> TenantConfig:
        if not self.api_key_secrets:
            raise ConfigProblem(
                "a tenant needs at least one key: add api_key_secrets: [{name: vllm-platform/<stack>/"
                f"tenants/{self.name}/api-key}}] (a secret-store reference, never the key itself)",
                at=("api_key_secrets",),
                value=[],
            )
        refs = [(ref.name, ref.key) for ref in self.api_key_secrets]
        for index, ref in enumerate(refs):
            if ref in refs[:index]:
                raise ConfigProblem(
                    f"the same key twice (also api_key_secrets[{refs.index(ref)}]); list each key once",
                    at=("api_key_secrets", index),
                )
        return self

    @property
    def prefix(self) -> str:
        return self.key_prefix or f"tk-{self.name}_"


def _did_you_mean(value: str, known: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(value, known, n=1)
    return f"did you mean '{close[0]}'? " if close else ""


def tenant_problems(config: PlatformConfig) -> list[ConfigProblem]:
    """What makes a `tenants` section unusable; run by PlatformConfig's validator (before the stack
    defaults fill `api_key_secret`, so an explicit one is still visible)."""
    if not config.tenants:
        return []
    problems: list[ConfigProblem] = []
    for index, model in enumerate(config.models):
        if model.api_key_secret is not None:
            problems.append(
                ConfigProblem(
                    "with tenants the per-model key is not used (each pod accepts the keys of the tenants "
                    "allowed on it); remove api_key_secret, or remove tenants to keep one key per model",
                    at=("models", index, "api_key_secret"),
                )
            )
    for index, model in enumerate(config.models):
        if model.lora is not None and model.lora.runtime_loading:
            # Decision (issue 34): refused, not "operator only": tenants' names are the pinned list, and
            # a loaded adapter would be a served name no tenant file lists and no review has seen.
            problems.append(
                ConfigProblem(
                    "runtime LoRA loading beside tenants lets adapters appear, change weights in place "
                    "(load_inplace) or vanish outside the reviewed tenants' names; list the adapters in "
                    "lora.adapters and set runtime_loading: false, or remove tenants",
                    at=("models", index, "lora", "runtime_loading"),
                    value=True,
                )
            )
    owners: dict[tuple[str, str], str] = {}
    if config.security.operator_key_secret is not None:
        operator = config.security.operator_key_secret
        owners[(operator.name, operator.key)] = "security.operator_key_secret"
    for index, tenant in enumerate(config.tenants):
        for position, ref in enumerate(tenant.api_key_secrets):
            owner = owners.get((ref.name, ref.key))
            if owner is not None and owner != f"tenants[{index}]":
                problems.append(
                    ConfigProblem(
                        f"the same secret is already {owner}'s key: whoever holds it would be both; give "
                        "each tenant (and the operator) a secret of its own",
                        at=("tenants", index, "api_key_secrets", position, "name"),
                        value=ref.name,
                    )
                )
            owners.setdefault((ref.name, ref.key), f"tenants[{index}]")
    served = [name for model in config.models for name in config.served_names(model)]
    seen: dict[str, int] = {}
    for index, tenant in enumerate(config.tenants):
        if tenant.name in seen:
            problems.append(
                ConfigProblem(
                    f"duplicate tenant name (also tenants[{seen[tenant.name]}]); tenant names must be unique",
                    at=("tenants", index, "name"),
                )
            )
        seen.setdefault(tenant.name, index)
        for position, name in enumerate(tenant.models):
            if name not in served:
                problems.append(
                    ConfigProblem(
                        f"no model or adapter is served under this name: {_did_you_mean(name, served)}the "
                        f"served names are {', '.join(served)} (a model's served_model_name, else its name)",
                        at=("tenants", index, "models", position),
                    )
                )
            elif name in tenant.models[:position]:
                problems.append(
                    ConfigProblem(
                        "listed twice; list each served name once", at=("tenants", index, "models", position)
                    )
                )
        for other_index, other in enumerate(config.tenants[:index]):
            if tenant.prefix.startswith(other.prefix) or other.prefix.startswith(tenant.prefix):
                problems.append(
                    ConfigProblem(
                        f"key prefix '{tenant.prefix}' overlaps tenant '{other.name}''s '{other.prefix}' "
                        f"(tenants[{other_index}]): one tenant's keys would be counted against the other's "
                        "rate limit; give each tenant a key_prefix that does not start another's",
                        at=("tenants", index, "key_prefix"),
                        value=tenant.prefix,
                    )
                )
        if tenant.requests_per_minute is not None:
            ingress = config.ingress
            if config.cluster.mode != "eks" or not ingress.enabled or ingress.class_name != "alb":
                problems.append(
                    ConfigProblem(
                        "a rate limit is enforced by an AWS WAF web ACL the stack creates on the ALB, which "
                        "needs cluster.mode 'eks' and ingress.enabled with class_name 'alb'; remove "
                        "requests_per_minute (and limit the rate at your own gateway) or use an ALB ingress",
                        at=("tenants", index, "requests_per_minute"),
                        value=tenant.requests_per_minute,
                    )
                )
            elif ingress.wafv2_acl_arn is not None:
                problems.append(
                    ConfigProblem(
                        "an ALB takes one web ACL, and ingress.wafv2_acl_arn names your own: either remove "
                        "wafv2_acl_arn (the stack's ACL then holds the tenants' rate rules) or remove "
                        "requests_per_minute and put a rate-based rule per tenant in your ACL "
                        '(docs/security.md, "Tenants")',
                        at=("tenants", index, "requests_per_minute"),
                        value=tenant.requests_per_minute,
                    )
                )
    return problems


def tenant_warnings(config: PlatformConfig) -> list[Problem]:
    """Valid but probably unintended: a served name no tenant may call answers every key with 401/403."""
    if not config.tenants:
        return []
    allowed = {name for tenant in config.tenants for name in tenant.models}
    return [
        Problem(
            ("models", index),
            name,
            f"no tenant may call '{name}': with tenants, a served name no tenant lists is unreachable; "
            "add it to a tenant's models or remove the model",
        )
        for index, model in enumerate(config.models)
        for name in config.served_names(model)
        if name not in allowed
    ]


def tenants_on(config: PlatformConfig, model: ModelConfig) -> list[TenantConfig]:
    """The tenants allowed on at least one of `model`'s served names: whose keys its pods accept."""
    served = set(config.served_names(model))
    return [tenant for tenant in config.tenants if served & set(tenant.models)]


def model_key_secrets(config: PlatformConfig, model: ModelConfig) -> list[SecretRefConfig]:
    """Every key `model`'s pods read from the secret store: its tenants' keys, or its own; and the
    operator key (`security.operator_key_secret`) where the stack has one."""
    operator = [config.security.operator_key_secret] if config.security.operator_key_secret else []
    if config.tenants:
        return [ref for tenant in tenants_on(config, model) for ref in tenant.api_key_secrets] + operator
    return ([model.api_key_secret] if model.api_key_secret is not None else []) + operator


def in_flight_share(max_concurrent_requests: int, model: ModelConfig) -> int:
    """A tenant's sequences one vLLM pod answers at once (issues 34, 49; docs/security.md, "Tenants"):
    its `max_concurrent_requests` spread over the model's fewest replicas (the HPA's minimum, or
    `replicas`; at least one), rounded up. The pod's API-server processes (one per data-parallel rank
    by default) count against one share together (the middleware's PodInFlight); pods count on their
    own, so the whole cap is the limit at the fewest replicas and grows with the replicas added above
    them; the alert on the summed in-flight series still fires at the limit itself."""
    return max(1, math.ceil(max_concurrent_requests / _fewest_replicas(model)))


def _fewest_replicas(model: ModelConfig) -> int:
    fewest = model.autoscaling.min_replicas if model.autoscaling.enabled else model.replicas
    return max(1, fewest)


@dataclass(frozen=True)
class TenantConcurrency:
    """How many requests of a tenant one model answers at once (`vllm-platform plan`'s tenant table)."""

    tenant: str
    model: str
    max_concurrent_requests: int | None
    """Sequences over the model's fewest replicas; None: no limit."""
    per_pod: int | None
    """What each pod enforces over all its API-server processes (`max_in_flight` in the pod's
    tenants file)."""
    source: Literal["stack", "default", "none"]
    """`stack`: the tenant's `max_concurrent_requests`; `default`: the even split of a shared model."""


def default_max_concurrent_requests(config: PlatformConfig, model: ModelConfig) -> int | None:
    """The limit of a tenant that sets none, on a model other tenants may call too (issue 40): the
    engine slots at the model's fewest replicas (`max_num_seqs` for each engine: one per replica, or
    a multi-node group's `data_parallel_size` engines behind its leader's API) split evenly between
    its tenants, rounded down. The shares then add up to at most what the engines run at once, so one
    tenant's flood never fills vLLM's batch and FCFS queue in front of another tenant's request (the
    probe measured a 30x slowdown without a share); a tenant alone on the model gets no default."""
    sharing = len(tenants_on(config, model))
    if sharing < 2:
        return None
    return max(1, _fewest_replicas(model) * model.data_parallel_size * model.vllm.max_num_seqs // sharing)


def tenant_concurrency(config: PlatformConfig, model: ModelConfig) -> list[TenantConcurrency]:
    default = default_max_concurrent_requests(config, model)
    rows = []
    for tenant in tenants_on(config, model):
        limit = tenant.max_concurrent_requests if tenant.max_concurrent_requests is not None else default
        source: Literal["stack", "default", "none"] = (
            "stack" if tenant.max_concurrent_requests is not None else "default" if default else "none"
        )
        share = None if limit is None else in_flight_share(limit, model)
        rows.append(TenantConcurrency(tenant.name, model.name, limit, share, source))
    return rows
