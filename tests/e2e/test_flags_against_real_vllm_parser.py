"""The flag snapshot and domain/vllm_flags.py against the real vLLM 0.32.0 `vllm serve` parser."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from domain.versions import VLLM_VERSION
from domain.vllm_flags import REMOVED_FLAGS, SNAPSHOT_DIR, check_server_arguments, load_server_flags
from tests.e2e.conftest import boot_server_now_if_the_session_needs_it, server_arguments
from tests.support.vllm_server import (
    REPO_ROOT,
    VllmArgumentsRejectedError,
    check_many_with_real_vllm,
    parse_with_real_vllm,
    vllm_subprocess_env,
)

pytestmark = pytest.mark.e2e

SNAPSHOT = SNAPSHOT_DIR / f"vllm-{VLLM_VERSION}-server-flags.json"
DISABLE_LOG_REQUESTS_PROBLEM = (
    f"vLLM {VLLM_VERSION} does not accept --disable-log-requests; remove it (request logging is off by "
    "default; use --enable-log-requests to turn it on)"
)

# What the stack renders for a production model on a GPU node, give or take the values.
PRODUCTION_STYLE_ARGUMENTS = [
    "/models/meta-llama/Llama-3.1-8B-Instruct",
    "--served-model-name",
    "llama-3-1-8b",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
    "--tensor-parallel-size",
    "2",
    "--max-model-len",
    "8192",
    "--gpu-memory-utilization",
    "0.9",
    "--max-num-seqs",
    "256",
    "--max-num-batched-tokens",
    "8192",
    "--dtype",
    "bfloat16",
    "--kv-cache-dtype",
    "auto",
    "--enable-prefix-caching",
    "--enable-chunked-prefill",
    "--shutdown-timeout",
    "30",
    "--uvicorn-log-level",
    "warning",
    "--disable-uvicorn-access-log",
    "--download-dir",
    "/models",
    "--compilation-config",
    '{"cache_dir": "/cache/vllm/torch_compile"}',
    "--generation-config",
    "vllm",
]


@dataclass(frozen=True)
class Case:
    """Arguments after `vllm serve`, whether the real parser accepts them, and what our checker says."""

    name: str
    args: tuple[str, ...]
    vllm_accepts: bool
    checker_problem: str | None  # a fragment of the one problem expected; None: no problem


CASES = [
    Case("plain model and flags", ("m", "--max-model-len", "4096", "--max-num-seqs", "8"), True, None),
    Case("flag=value", ("m", "--max-model-len=4096", "--dtype=bfloat16"), True, None),
    Case("underscores read as dashes", ("m", "--max_model_len", "4096"), True, None),
    Case("negation of a boolean pair", ("m", "--no-enable-prefix-caching"), True, None),
    Case("negative number as a value", ("m", "--max-model-len", "-1"), True, None),
    Case("-O level shorthand", ("m", "-O3"), True, None),
    Case("dotted JSON key", ("m", "--compilation-config.mode", "3"), True, None),
    Case("short option", ("m", "-tp", "2"), True, None),
    Case("several values", ("m", "--api-key", "a", "b", "--port", "8001"), True, None),
    Case("model after options", ("--max-model-len", "100", "m"), True, None),
    Case("enable request logging", ("m", "--enable-log-requests"), True, None),
    Case("typo", ("m", "--max-model-length", "4096"), False, "did you mean --max-model-len?"),
    Case("negation that does not exist", ("m", "--no-disable-log-stats"), False, "does not accept"),
    Case("value outside the choices", ("m", "--dtype", "fp64"), False, "'fp64' is not a choice"),
    Case("value given to a switch", ("m", "--enable-prefix-caching=true"), False, "takes no value"),
    Case("missing value", ("m", "--max-num-seqs"), False, "--max-num-seqs needs a value"),
    Case("extra positional", ("m", "--enforce-eager", "true"), False, "takes one argument, the model"),
    Case(
        "served name with the model not first",
        ("--port", "8001", "m", "--served-model-name", "x"),
        False,
        "must be the first argument",
    ),
    Case(
        "flag removed since V0", ("m", "--swap-space", "4"), False, "does not accept --swap-space; remove it"
    ),
    Case(
        "auto tool choice without a parser",
        ("m", "--enable-auto-tool-choice"),
        False,
        "--enable-auto-tool-choice requires --tool-call-parser",
    ),
    # Deliberately stricter than vLLM, each for a stated reason:
    Case("abbreviated flag", ("m", "--max-num-seq", "8"), True, "abbreviation that vLLM 0.32.0 expands"),
    Case(
        "flag given twice", ("m", "--max-model-len", "1", "--max-model-len", "2"), True, "keeps only the last"
    ),
    Case(
        "--model option",
        ("--model", "m", "--max-model-len", "100"),
        True,
        "accepts --model only with a warning",
    ),
    Case("no model at all", ("--max-model-len", "100"), True, "no model given"),
]


def lora_stack_arguments() -> list[str]:
    """What the lora test stack renders for its model: vLLM's LoRA flags from the typed `lora` block."""
    from tests.conftest import TEST_STACKS_DIR, model_workloads, rendered

    (workload,) = model_workloads(rendered("lora", TEST_STACKS_DIR / "Pulumi.lora.yaml"))
    (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    return list(container["args"])


@pytest.fixture(scope="module")
def real_parser_verdicts(vllm_python: Path, request: pytest.FixtureRequest) -> dict[str, str | None]:
    """Every argument list of this module through the real parser, in one vLLM subprocess."""
    boot_server_now_if_the_session_needs_it(request)
    lists = [list(case.args) for case in CASES]
    lists += [
        PRODUCTION_STYLE_ARGUMENTS,
        server_arguments(Path("/tmp/model")),
        ["m", "--disable-log-requests"],
        lora_stack_arguments(),
    ]
    verdicts = check_many_with_real_vllm(lists)
    return {json.dumps(args): verdict for args, verdict in zip(lists, verdicts, strict=True)}


def test_snapshot_equals_what_the_real_parser_yields_now(
    vllm_python: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    boot_server_now_if_the_session_needs_it(request)
    regenerated = tmp_path / "flags.json"
    subprocess.run(
        [str(vllm_python), "scripts/snapshot-vllm-flags.py", "--output", str(regenerated)],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    committed, fresh = json.loads(SNAPSHOT.read_text()), json.loads(regenerated.read_text())
    added = sorted(set(fresh["options"]) - set(committed["options"]))
    removed = sorted(set(committed["options"]) - set(fresh["options"]))
    changed = sorted(
        name
        for name in set(fresh["options"]) & set(committed["options"])
        if fresh["options"][name] != committed["options"][name]
    )
    assert fresh == committed, (
        f"{SNAPSHOT.name} is stale: added {added}, removed {removed}, changed {changed}. "
        "Regenerate it with: VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python scripts/snapshot-vllm-flags.py"
    )


def test_production_style_arguments_pass_the_real_parser_and_the_checker(
    real_parser_verdicts: dict[str, str | None],
) -> None:
    assert real_parser_verdicts[json.dumps(PRODUCTION_STYLE_ARGUMENTS)] is None
    assert check_server_arguments(PRODUCTION_STYLE_ARGUMENTS) == []


def test_e2e_server_arguments_pass_the_real_parser_and_the_checker(
    real_parser_verdicts: dict[str, str | None],
) -> None:
    args = server_arguments(Path("/tmp/model"))
    assert real_parser_verdicts[json.dumps(args)] is None
    assert check_server_arguments(args) == []


def test_lora_arguments_pass_the_real_parser_and_the_checker(
    real_parser_verdicts: dict[str, str | None],
) -> None:
    args = lora_stack_arguments()
    lora_flags = {"--enable-lora", "--lora-modules", "--max-loras", "--max-lora-rank", "--max-cpu-loras"}
    assert lora_flags <= set(args)
    assert real_parser_verdicts[json.dumps(args)] is None
    assert check_server_arguments(args) == []


def test_disable_log_requests_is_rejected_by_the_real_parser_and_by_the_checker(
    real_parser_verdicts: dict[str, str | None],
) -> None:
    assert real_parser_verdicts[json.dumps(["m", "--disable-log-requests"])] == (
        "unrecognized arguments: --disable-log-requests"
    )
    assert check_server_arguments(["m", "--disable-log-requests"]) == [DISABLE_LOG_REQUESTS_PROBLEM]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_checker_matches_the_real_parser(case: Case, real_parser_verdicts: dict[str, str | None]) -> None:
    verdict = real_parser_verdicts[json.dumps(list(case.args))]
    assert (verdict is None) == case.vllm_accepts, f"real parser said: {verdict}"
    problems = check_server_arguments(list(case.args))
    if case.checker_problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and case.checker_problem in problems[0], problems


def test_parse_with_real_vllm_raises_vllms_own_message(vllm_python: Path) -> None:
    with pytest.raises(VllmArgumentsRejectedError, match="invalid choice: 'fp64'"):
        parse_with_real_vllm(["m", "--max-model-len", "512", "--dtype", "fp64"])


def test_snapshot_answers_the_pinned_flag_questions() -> None:
    options = load_server_flags().options
    # The model is a positional (`vllm serve MODEL`); --model still exists (vLLM warns and moves it).
    assert "--model" in options and options["--model"].takes_value
    assert options["--shutdown-timeout"].takes_value
    assert options["--enable-prefix-caching"].action == "BooleanOptionalAction"
    assert options["--no-enable-prefix-caching"].dest == options["--enable-prefix-caching"].dest
    assert options["--api-key"].nargs == "+"
    assert "--disable-log-requests" not in options and "--enable-log-requests" in options


def test_every_removed_flag_is_really_gone_from_the_pinned_parser() -> None:
    still_there = [flag for flag in REMOVED_FLAGS if flag in load_server_flags().options]
    assert still_there == []


def test_every_removed_flag_hint_names_only_flags_the_pinned_parser_accepts() -> None:
    options = load_server_flags().options
    named = {word.rstrip(".,;)").split(".")[0] for hint in REMOVED_FLAGS.values() for word in hint.split()}
    unknown = sorted(word for word in named if word.startswith("--") and word not in options)
    assert unknown == []


def test_the_flashinfer_allreduce_backends_are_the_pinned_vllms_choices(vllm_python: Path) -> None:
    # vllm.flashinfer_allreduce_backend renders VLLM_FLASHINFER_ALLREDUCE_BACKEND; vLLM validates it
    # with env_with_choices and refuses to start on another value, so the typed choices must be its own.
    from typing import get_args

    from components.vllm_arguments import FLASHINFER_ALLREDUCE_BACKEND_ENV
    from domain.config.engine import VllmEngineConfig

    ours = set(get_args(VllmEngineConfig.model_fields["flashinfer_allreduce_backend"].annotation))
    for value in sorted(ours):
        checked = subprocess.run(
            [str(vllm_python), "-c", f"import vllm.envs as e; print(e.{FLASHINFER_ALLREDUCE_BACKEND_ENV})"],
            cwd=REPO_ROOT,
            env={**vllm_subprocess_env(), FLASHINFER_ALLREDUCE_BACKEND_ENV: value},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert checked.returncode == 0, checked.stderr[-2000:]
        assert checked.stdout.strip().splitlines()[-1] == value
    refused = subprocess.run(
        [str(vllm_python), "-c", f"import vllm.envs as e; print(e.{FLASHINFER_ALLREDUCE_BACKEND_ENV})"],
        cwd=REPO_ROOT,
        env={**vllm_subprocess_env(), FLASHINFER_ALLREDUCE_BACKEND_ENV: "nccl"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0 and "nccl" in refused.stderr
