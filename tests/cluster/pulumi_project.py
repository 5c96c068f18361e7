"""Runs our Pulumi program with the real Pulumi CLI (engine) and Kubernetes provider.

    python -m tests.cluster.pulumi_project WORKDIR OPERATION [--expect-no-changes] [--diff]

OPERATION is preview, up, refresh or destroy. It runs inside the cluster's network namespace (the
engine, the provider and the program all talk over loopback there) and prints one JSON line: the
operation, whether it succeeded, the change summary and the engine's full output.

How the program runs: the Python language host (`pulumi-language-python`) is not served by the Go
module proxy (domain/versions.py GO_TOOLS_NOT_SERVED), so the CLI is driven through the Python SDK's
Automation API with an inline program: the SDK starts its own language runtime in this process and
hands the CLI its address (`--client`). The engine, the provider, the plan, the diff, the state and
every API call are the real ones; the program is `infra.program.run_program`, the function the
project's entry point (infra/__main__.py) calls.

WORKDIR (written by `write_project`) holds Pulumi.yaml (the local file backend, and the provider
built by tools/build.sh as a project plugin, so the engine uses that binary whatever version the
SDK asks for), the stack file `Pulumi.cluster.yaml`, the state and PULUMI_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import yaml

STACK = "cluster"
PROJECT = "vllm-platform"


def write_project(workdir: Path, stack_file: Path, provider_dir: Path) -> None:
    """The project and stack files the engine reads; the stack file is copied as `cluster`'s."""
    (workdir / "state").mkdir(parents=True, exist_ok=True)
    (workdir / "pulumi-home").mkdir(exist_ok=True)
    project = {
        "name": PROJECT,
        "runtime": "python",
        "backend": {"url": f"file://{workdir / 'state'}"},
        "plugins": {"providers": [{"name": "kubernetes", "path": str(provider_dir)}]},
    }
    (workdir / "Pulumi.yaml").write_text(yaml.safe_dump(project, sort_keys=False))
    shutil.copyfile(stack_file, workdir / f"Pulumi.{STACK}.yaml")


def engine_environment(workdir: Path, kubeconfig: Path) -> dict[str, str]:
    return {
        "PULUMI_HOME": str(workdir / "pulumi-home"),
        "PULUMI_CONFIG_PASSPHRASE": "cluster-test",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_SKIP_CONFIRMATIONS": "true",
        "KUBECONFIG": str(kubeconfig),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("operation", choices=["preview", "up", "refresh", "destroy"])
    parser.add_argument("--expect-no-changes", action="store_true")
    parser.add_argument("--diff", action="store_true")
    parser.add_argument("--pulumi-root", type=Path, required=True, help="folder with bin/pulumi")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    args = parser.parse_args(argv)

    from pulumi import automation as auto

    environment = engine_environment(args.workdir, args.kubeconfig)
    # The program runs in this process: it reads the chart cache and kubeconfig from here too.
    os.environ.update(environment)

    def program() -> None:
        from infra.program import run_program

        run_program(stack_file_display=f"Pulumi.{STACK}.yaml")

    workspace = auto.LocalWorkspaceOptions(
        work_dir=str(args.workdir),
        pulumi_home=environment["PULUMI_HOME"],
        env_vars=environment,
        pulumi_command=auto.PulumiCommand(root=str(args.pulumi_root), skip_version_check=True),
    )
    stack = auto.create_or_select_stack(
        stack_name=STACK, project_name=PROJECT, program=program, opts=workspace
    )
    lines: list[str] = []
    options: dict = {"on_output": lines.append, "color": "never"}
    if args.operation in ("preview", "up", "refresh") and args.expect_no_changes:
        options["expect_no_changes"] = True
    if args.diff:
        options["diff"] = True
    result: dict = {"operation": args.operation, "ok": True, "summary": {}, "error": ""}
    try:
        outcome = getattr(stack, args.operation)(**options)
        changes = getattr(outcome, "change_summary", None)
        if changes is None and getattr(outcome, "summary", None) is not None:
            changes = outcome.summary.resource_changes
        result["summary"] = dict(changes or {})
    except auto.errors.CommandError as error:
        result["ok"] = False
        result["error"] = str(error)
    result["output"] = "\n".join(lines)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
