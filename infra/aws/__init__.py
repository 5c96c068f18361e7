"""The AWS layer (cluster mode `eks`): VPC, EKS, node groups, model storage and IRSA roles.

Imported only in mode `eks` (pulumi_aws is slow to import and mode `existing` needs none of it).
"""

from infra.aws.infrastructure import AwsInfrastructure

__all__ = ["AwsInfrastructure"]
