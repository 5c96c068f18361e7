"""Where one model revision's weights live (a model's `source`, a LoRA adapter's, a canary
candidate's): its own module so that rollout.py and models.py can both use it."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, model_validator

from domain.config.base import StrictModel
from domain.config.errors import ConfigProblem

_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<prefix>[^\s]+?)/?$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelSourceConfig(StrictModel):
    """Where the weights of one model revision live. Exactly one of `s3_uri` / `huggingface_repo`."""

    s3_uri: str | None = None
    """S3 prefix holding exactly this revision's files, e.g. s3://acme-models/llama-3.1-8b/0e9e39f/."""
    huggingface_repo: str | None = None
    """Hugging Face repo id, e.g. meta-llama/Llama-3.1-8B-Instruct (fetched once into the shared volume)."""
    revision: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
    """Immutable revision label (for Hugging Face: the commit sha); the cache key on the shared volume."""
    requires_hf_token: bool = False
    """Gated Hugging Face repos: mount the token from the secret store for the preloader."""

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelSourceConfig:
        if (self.s3_uri is None) == (self.huggingface_repo is None):
            raise ConfigProblem(
                "set exactly one of s3_uri (e.g. s3://bucket/llama-3.1-8b/rev/) or huggingface_repo "
                "(e.g. meta-llama/Llama-3.1-8B-Instruct)",
                at=("s3_uri",),
                value=self.s3_uri,
            )
        if self.s3_uri is not None and not _S3_URI.match(self.s3_uri):
            raise ConfigProblem(
                "must look like s3://bucket/prefix/ (a bucket and a non-empty prefix)", at=("s3_uri",)
            )
        if self.huggingface_repo is not None and not _HF_REPO.match(self.huggingface_repo):
            raise ConfigProblem("must be a Hugging Face repo id like 'org/name'", at=("huggingface_repo",))
        if self.requires_hf_token and self.huggingface_repo is None:
            raise ConfigProblem("only Hugging Face sources use a token; remove it", at=("requires_hf_token",))
        return self

    @property
    def s3_bucket(self) -> str | None:
        match = _S3_URI.match(self.s3_uri or "")
        return match["bucket"] if match else None

    @property
    def s3_prefix(self) -> str | None:
        match = _S3_URI.match(self.s3_uri or "")
        return match["prefix"].rstrip("/") + "/" if match else None

    @property
    def uri(self) -> str:
        return self.s3_uri if self.s3_uri is not None else f"hf://{self.huggingface_repo}"
