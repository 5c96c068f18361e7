"""The server arguments the stack renders, checked by the pinned vLLM itself (not a copy of its rules)."""

from __future__ import annotations

import pytest

from domain.vllm_flags import check_server_arguments
from tests.conftest import STACKS, TEST_STACKS_DIR, rendered
from tests.e2e.conftest import boot_server_now_if_the_session_needs_it
from tests.support.vllm_server import check_many_with_real_vllm


def _vllm_arguments_of_every_model() -> dict[str, list[str]]:
    results = [rendered(stack) for stack in STACKS]
    results.append(rendered("existing", TEST_STACKS_DIR / "Pulumi.existing.yaml"))
    arguments: dict[str, list[str]] = {}
    for result in results:
        # prod's models are Argo Rollouts (canary), the others Deployments: the same pod template.
        for deployment in [*result.find("Deployment"), *result.find("Rollout")]:
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                if container["name"] == "vllm":
                    assert container["command"] == ["vllm", "serve"]
                    key = f"{result.stack}/{deployment['metadata']['namespace']}"
                    arguments[key] = list(container["args"])
    return arguments


def test_every_model_in_every_stack_renders_arguments_the_pinned_vllm_parser_accepts(
    vllm_python: object, request: pytest.FixtureRequest
) -> None:
    boot_server_now_if_the_session_needs_it(request)
    arguments = _vllm_arguments_of_every_model()
    # dev 1, staging 2, prod 3, existing 1: every model of every stack is here.
    assert len(arguments) == 7, sorted(arguments)
    verdicts = check_many_with_real_vllm(list(arguments.values()))
    rejected = {key: verdict for key, verdict in zip(arguments, verdicts, strict=True) if verdict}
    assert rejected == {}
    # ...and the validate-time checker, which runs without vLLM installed, agrees.
    assert {
        key: check_server_arguments(args) for key, args in arguments.items() if check_server_arguments(args)
    } == {}
