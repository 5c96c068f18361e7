"""Capacity planning: what each GPU will hold and how long a replica takes to become ready.

Pure functions of the typed config; the Pulumi program computes the plan once and passes the
numbers down to the components (startupProbe budget) and to `vllm-platform plan`.
"""

from domain.capacity.plan import ModelPlan, PlatformPlan, plan_platform

__all__ = ["ModelPlan", "PlatformPlan", "plan_platform"]
