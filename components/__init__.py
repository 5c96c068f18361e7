"""Kubernetes ComponentResources: typed args and an explicit provider in, nothing AWS-specific.

They also work on an existing cluster (`cluster.mode: existing`).
"""
