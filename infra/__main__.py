"""Pulumi entry point (Pulumi.yaml `main: infra/`): `pulumi preview` / `pulumi up -s <stack>`."""

from infra.program import run_program

run_program()
