"""The Kubernetes provider for mode `existing`: a kubeconfig/context the user already has.

(In mode `eks` the provider is built from the cluster the AWS layer creates; see infra/program.py.)
"""

from __future__ import annotations

import pulumi_kubernetes as kubernetes

from domain.config import PlatformConfig


def existing_cluster_provider(config: PlatformConfig) -> kubernetes.Provider:
    # `kubeconfig` takes a path as well as contents; unset means the ambient KUBECONFIG.
    return kubernetes.Provider(
        "kubernetes",
        kubeconfig=config.cluster.kubeconfig_path,
        context=config.cluster.kubeconfig_context,
        enable_server_side_apply=True,
    )
