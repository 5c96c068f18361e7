"""Tenants' request rates, limited at the load balancer by AWS WAF (issue 26; docs/security.md,
"Tenants").

Why WAF and not the router or our own counter: the ALB is the first thing a request reaches, so a
request over the limit never costs a router hop or a GPU; WAF's rate-based rules count per
*aggregation instance* of custom keys, here the whole `Authorization` header, so each key has its
own count without a counter of ours, and a scope-down statement limits the rule to one tenant's
keys. vllm-router 0.1.17's limiter (`--max-concurrent-requests`, `--rate-limit-tokens-per-second`)
is one token bucket per router process for all callers, not per key.

How a tenant's keys are matched without the secret in any config: every key of a tenant starts
with its non-secret `key_prefix` (validated distinct per tenant; the vLLM pods refuse a tenant key
without it), and the scope-down statement matches `bearer <prefix>` at the start of the header.
The secret rest of the key is only ever an aggregation value inside WAF. Sampled requests are off
on these rules, so the WAF console never shows a header with a key.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from domain.config import PlatformConfig
from domain.config.tenants import TenantConfig

EVALUATION_WINDOW_SECONDS = 60
"""`requests_per_minute` is the limit of a 60 s window (WAF's windows: 60, 120, 300, 600 s)."""
RATE_LIMITED_BODY_KEY = "rate-limited"
RATE_LIMITED_BODY = json.dumps(
    {
        "error": {
            "message": "Rate limit reached for this API key; retry after a minute.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
)
"""OpenAI's shape for a 429, so SDKs raise their RateLimitError (and retry with back-off)."""


# The middleware accepts any case of "Bearer" and extra spaces after it: WAF compares the same way
# (prefixes are lowercase by validation).
_NORMALISED = [{"priority": 0, "type": "COMPRESS_WHITE_SPACE"}, {"priority": 1, "type": "LOWERCASE"}]


def web_acl_needed(tenants: Sequence[TenantConfig]) -> bool:
    return any(tenant.requests_per_minute is not None for tenant in tenants)


def _visibility(metric: str) -> dict[str, Any]:
    # No sampled requests: a sample shows the request's headers, the tenant's key among them.
    return {"cloudwatch_metrics_enabled": True, "metric_name": metric, "sampled_requests_enabled": False}


RATE_LIMITED = {
    "block": {
        "custom_response": {
            "response_code": 429,
            "custom_response_body_key": RATE_LIMITED_BODY_KEY,
            "response_headers": [{"name": "retry-after", "value": str(EVALUATION_WINDOW_SECONDS)}],
        }
    }
}
WITHOUT_TENANT_KEY_RULE = "requests-without-a-tenant-key"


def _tenant_key(tenant_prefix: str) -> dict[str, Any]:
    """A request whose Authorization starts with `bearer <prefix>`, as the middleware reads it."""
    return {
        "byte_match_statement": {
            "field_to_match": {"single_header": {"name": "authorization"}},
            "positional_constraint": "STARTS_WITH",
            "search_string": f"bearer {tenant_prefix}",
            "text_transformations": _NORMALISED,
        }
    }


def without_tenant_key_rule(config: PlatformConfig, priority: int) -> dict[str, Any]:
    """Requests that carry no tenant's key prefix, limited per client address (issue 40): no key,
    another scheme, a key of no tenant. The vLLM pods and the wake gate refuse them anyway; WAF
    bounds what a client sends of them. (A made-up key *with* a tenant's prefix is its own count in
    that tenant's rule, and gets 401.)"""
    matches = [_tenant_key(tenant.prefix) for tenant in config.tenants]
    any_tenant = matches[0] if len(matches) == 1 else {"or_statement": {"statements": matches}}
    return {
        "name": WITHOUT_TENANT_KEY_RULE,
        "priority": priority,
        "action": RATE_LIMITED,
        "statement": {
            "rate_based_statement": {
                "limit": config.ingress.requests_without_tenant_key_per_minute,
                "evaluation_window_sec": EVALUATION_WINDOW_SECONDS,
                "aggregate_key_type": "IP",
                "scope_down_statement": {"not_statement": {"statement": any_tenant}},
            }
        },
        "visibility_config": _visibility(WITHOUT_TENANT_KEY_RULE),
    }


def tenant_rate_rules(config: PlatformConfig) -> list[dict[str, Any]]:
    """One rate-based rule per tenant with `requests_per_minute`, and one per client address for
    requests with no tenant's key (pulumi_aws WebAclRule inputs)."""
    rules = []
    limited = [tenant for tenant in config.tenants if tenant.requests_per_minute is not None]
    for priority, tenant in enumerate(limited):
        rules.append(
            {
                "name": f"tenant-{tenant.name}-rate",
                "priority": priority,
                "action": RATE_LIMITED,
                "statement": {
                    "rate_based_statement": {
                        "limit": tenant.requests_per_minute,
                        "evaluation_window_sec": EVALUATION_WINDOW_SECONDS,
                        # Each distinct key counts on its own: a stranger sending a made-up key with this
                        # tenant's prefix uses up only that made-up key's count (and gets 401 from vLLM).
                        # Normalised as below, so "BEARER  <key>" is not a second count for the same key.
                        "aggregate_key_type": "CUSTOM_KEYS",
                        "custom_keys": [
                            {"header": {"name": "authorization", "text_transformations": _NORMALISED}}
                        ],
                        "scope_down_statement": _tenant_key(tenant.prefix),
                    }
                },
                "visibility_config": _visibility(f"tenant-{tenant.name}-rate"),
            }
        )
    if rules:
        rules.append(without_tenant_key_rule(config, len(rules)))
    return rules


def tenant_web_acl(
    name: str, config: PlatformConfig, opts: pulumi.ResourceOptions
) -> aws.wafv2.WebAcl | None:
    """The regional web ACL the stack's ALB gets (annotation `wafv2-acl-arn`); None without limits."""
    if not web_acl_needed(config.tenants):
        return None
    return aws.wafv2.WebAcl(
        name,
        name=f"{config.cluster.name}-tenants",
        description="vllm-platform: per-tenant request rates (docs/security.md, Tenants)",
        scope="REGIONAL",
        default_action={"allow": {}},
        custom_response_bodies=[
            {
                "key": RATE_LIMITED_BODY_KEY,
                "content": RATE_LIMITED_BODY,
                "content_type": "APPLICATION_JSON",
            }
        ],
        rules=tenant_rate_rules(config),
        visibility_config=_visibility(f"{config.cluster.name}-tenants"),
        opts=opts,
    )
