"""What the model Ingresses and the AWS Load Balancer Controller's IngressClassParams agree on."""

from __future__ import annotations

ALB_SSL_POLICY = "ELBSecurityPolicy-TLS13-1-2-Res-2021-06"
"""TLS 1.3, and TLS 1.2 with AEAD (GCM) suites only: the restricted variant of the controller's
recommended ELBSecurityPolicy-TLS13-1-2-2021-06, without its CBC (SHA-1/SHA-256 HMAC) suites."""


def ingress_group_name(cluster_name: str | None) -> str:
    """Every model of a stack shares one ALB (one hostname rule each) instead of paying for one each."""
    return f"{cluster_name}-models"
