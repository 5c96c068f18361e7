"""Shared building blocks of the typed config."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

INT32_MAX = 2**31 - 1
"""Kubernetes replica counts (Deployment, HPA, KEDA) are int32."""

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Kubernetes label keys: optional DNS-subdomain prefix, then a name of at most 63 characters.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class StrictModel(BaseModel):
    """Unknown keys are errors (typos must not be ignored); values are immutable once loaded."""

    # Attribute docstrings become field descriptions: the README's config reference is generated
    # from them (domain/config/reference.py), so the documentation cannot drift from the schema.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def reject_retired_keys(data: Any, retired: Mapping[str, str]) -> None:
    """For a `mode="before"` model validator: a key that was a setting once fails with
    "<key> is no longer a setting: <why and what to do>", not as an unknown key."""
    for key, why in retired.items():
        if isinstance(data, dict) and key in data:
            raise ValueError(f"{key} is no longer a setting: {why}")


def dns_label(max_length: int):
    def check(value: str) -> str:
        if len(value) > max_length or not _DNS_LABEL.match(value):
            raise ValueError(
                f"must be a DNS label of at most {max_length} characters: lowercase letters, digits and "
                f"'-', starting with a letter and ending with a letter or digit (e.g. 'llama-3-8b')"
            )
        return value

    return AfterValidator(check)


def _check_labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        if not _LABEL_KEY.match(key) or len(key) > 253:
            raise ValueError(
                f"label key '{key}' is not a valid Kubernetes label key (e.g. 'team' or 'example.com/team')"
            )
        if not _LABEL_VALUE.match(str(value)):
            raise ValueError(
                f"label value '{value}' of '{key}' is not a valid Kubernetes label value "
                "(at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric)"
            )
    return labels


Labels = Annotated[dict[str, str], AfterValidator(_check_labels)]


def _check_cidr(value: str) -> str:
    import ipaddress

    try:
        network = ipaddress.IPv4Network(value, strict=True)
    except ValueError:
        raise ValueError(
            "must be an IPv4 CIDR with no host bits set, such as '203.0.113.0/24' or '198.51.100.7/32'"
        ) from None
    return str(network)


Cidr = Annotated[str, AfterValidator(_check_cidr)]
"""An IPv4 network in CIDR notation, parsed (not only pattern-matched)."""

_HOSTNAME_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _check_hostname(value: str) -> str:
    labels = value.split(".")
    if len(value) > 253 or len(labels) < 2 or not all(_HOSTNAME_LABEL.match(label) for label in labels):
        raise ValueError(
            "must be a lowercase RFC 1123 DNS name with at least two labels, each of 1-63 letters, "
            "digits and "
            "'-' not starting or ending with '-' (e.g. 'llama.models.example.com'); no scheme, port, path or "
            "wildcard"
        )
    return value


Hostname = Annotated[str, AfterValidator(_check_hostname)]
"""A fully qualified DNS name (RFC 1123), as an Ingress host and an ACM certificate name need."""


# An image reference as the distribution spec writes it: [registry[:port]/]path[:tag][@digest].
_DOMAIN_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_REGISTRY = rf"(?:{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL})*(?::[0-9]+)?/)"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(
    rf"^(?P<repository>{_REGISTRY}?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>[a-z0-9]+:[A-Za-z0-9=_-]+))?$"
)
_SHA256_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# A release version (0.1.0, v1.2, 1.2.3-mirror.1): a tag that names one build, unlike latest or a branch.
_VERSION_TAG = re.compile(r"^v?[0-9]+\.[0-9]+(?:\.[0-9]+)*(?:[-+_.][A-Za-z0-9][A-Za-z0-9_.-]*)?$")
_PIN_HINT = (
    "pin the image to a release version tag or a digest, e.g. "
    "registry.example.com/mirror/model-cache:0.1.0 or ...@sha256:<64 hex digits>"
)


def unpinned_image_problem(value: str) -> str | None:
    """Why an image reference is not pinned to one build (a version tag or a sha256 digest), or None.

    The one definition of "pinned": config validation (`PinnedImage`) and the image inventory of
    every rendered object (`vllm-platform images`, infra/images.py) both use it."""
    match = _IMAGE_REFERENCE.match(value)
    if match is None:
        return (
            f"is not an image reference ([registry/]repository[:tag][@sha256:digest], lowercase "
            f"repository); {_PIN_HINT}"
        )
    tag, digest = match["tag"], match["digest"]
    if digest is not None:
        if not _SHA256_DIGEST.match(digest):
            return f"digest must be sha256: followed by 64 lowercase hex digits; {_PIN_HINT}"
        return None
    if tag is None:
        return f"has no tag, so every node would pull whatever is newest; {_PIN_HINT}"
    if not _VERSION_TAG.match(tag):
        return (
            f"tag '{tag}' is not a version: a tag like latest or a branch name moves, so pods on "
            f"different nodes would run different code; {_PIN_HINT}"
        )
    return None


def _check_pinned_image(value: str) -> str:
    problem = unpinned_image_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# An image the stack pulls: pinned to a version tag or a sha256 digest, never `latest` or untagged.
PinnedImage = Annotated[str, AfterValidator(_check_pinned_image)]
