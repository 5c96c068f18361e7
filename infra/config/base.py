"""Shared building blocks of the typed config."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Kubernetes label keys: optional DNS-subdomain prefix, then a name of at most 63 characters.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class StrictModel(BaseModel):
    """Unknown keys are errors (typos must not be ignored); values are immutable once loaded."""

    # Attribute docstrings become field descriptions: the README's config reference is generated
    # from them (infra/config/reference.py), so the documentation cannot drift from the schema.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


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
