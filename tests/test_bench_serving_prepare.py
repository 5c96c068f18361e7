"""bench/serving/prepare.py: the benchmark serves exactly what the stack renders, changed only as recorded."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench.serving import prepare
from infra.versions import LAB_GPU_VLLM_VERSION, VLLM_VERSION
from infra.vllm_flags import ServerOption, load_server_flags
from tests.conftest import rendered


@pytest.fixture(scope="module")
def plan() -> dict:
    return prepare.build_plan(result=rendered(prepare.STACK))


def _rendered_container() -> dict:
    _, _, container = prepare.find_vllm_container(rendered(prepare.STACK), prepare.MODEL)
    return container


def test_plan_takes_the_args_of_the_prod_8b_deployment(plan: dict) -> None:
    container = _rendered_container()
    assert plan["deployment"]["args"] == container["args"]
    assert plan["deployment"]["command"] == ["vllm", "serve"]
    assert plan["deployment"]["namespace"] == f"vllm-{prepare.MODEL}"


def test_every_rendered_flag_runs_in_the_lab_or_is_recorded_as_removed(plan: dict) -> None:
    rendered_args = plan["deployment"]["args"]
    lab_args = plan["lab"]["serve_args"]
    removed = {change["what"] for change in plan["lab"]["changes"] if change["action"] == "removed"}
    assert lab_args[0] == prepare.LAB_MODEL_DIR
    for token in rendered_args[1:]:
        if token.startswith("--"):
            assert token in lab_args or token in removed, token
    assert lab_args[-2:] == ["--load-format", "dummy"]
    changed = {change["what"] for change in plan["lab"]["changes"]}
    assert {"model", "--load-format"} <= changed


def test_lab_args_carry_the_tuning_profile_of_the_stack(plan: dict) -> None:
    from infra.catalogue.tuning_profiles import tuning_profiles

    profile = tuning_profiles()[plan["tuning_profile"]["name"]]
    args = plan["lab"]["serve_args"]
    assert args[args.index("--kv-cache-dtype") + 1] == profile.setting_values()["kv_cache_dtype"]
    assert args[args.index("--max-num-batched-tokens") + 1] == str(
        profile.setting_values()["max_num_batched_tokens"]
    )


def test_committed_plan_is_what_prepare_makes_from_the_current_stack(plan: dict) -> None:
    committed = json.loads(prepare.PLAN_FILE.read_text())
    assert committed == json.loads(json.dumps(plan)), (
        "bench/serving/plan.json is stale: run `.venv/bin/python -m bench.serving.prepare` and commit it"
    )


def test_defaults_run_sets_only_what_makes_it_comparable(plan: dict) -> None:
    defaults = plan["defaults"]["serve_args"]
    flags = [token for token in defaults if token.startswith("--")]
    assert flags == ["--served-model-name", "--port", "--max-model-len", "--load-format"]
    lab = plan["lab"]["serve_args"]
    assert defaults[defaults.index("--max-model-len") + 1] == lab[lab.index("--max-model-len") + 1]


def test_flag_the_lab_vllm_lacks_is_removed_with_the_reason() -> None:
    stack_flags = load_server_flags(VLLM_VERSION)
    lab_flags = prepare.load_lab_flags()
    newer_only = sorted(set(stack_flags.long_options()) - set(lab_flags.long_options()))
    flag = next(
        name
        for name in newer_only
        if stack_flags.options[name].takes_value and stack_flags.options[name].choices is None
    )
    args, changes = prepare.translate_arguments(
        ["/mnt/m", "--max-num-seqs", "8", flag, "15"],
        lab_flags=lab_flags,
        stack_flags=stack_flags,
        model_dir="/tmp/m/x",
    )
    assert args == ["/tmp/m/x", "--max-num-seqs", "8", "--load-format", "dummy"]
    removed = [change for change in changes if change.action == "removed"]
    assert [(change.what, change.before) for change in removed] == [(flag, f"{flag} 15")]
    assert LAB_GPU_VLLM_VERSION in removed[0].why


def test_value_outside_the_lab_choices_is_removed() -> None:
    stack_flags = load_server_flags(VLLM_VERSION)
    lab_flags = prepare.load_lab_flags()
    option = lab_flags.options["--kv-cache-dtype"]
    narrowed = replace(
        lab_flags, options={**lab_flags.options, "--kv-cache-dtype": replace(option, choices=("auto",))}
    )
    args, changes = prepare.translate_arguments(
        ["/m", "--kv-cache-dtype", "fp8"], lab_flags=narrowed, stack_flags=stack_flags, model_dir="/lab"
    )
    assert "--kv-cache-dtype" not in args
    assert any(change.what == "--kv-cache-dtype" and "auto" in change.why for change in changes)


def test_stack_that_sets_a_load_format_is_refused() -> None:
    flags = load_server_flags(VLLM_VERSION)
    with pytest.raises(ValueError, match="load-format"):
        prepare.translate_arguments(
            ["/m", "--load-format", "safetensors"],
            lab_flags=prepare.load_lab_flags(),
            stack_flags=flags,
            model_dir="/lab",
        )


def test_switch_followed_by_a_value_is_refused() -> None:
    flags = load_server_flags(VLLM_VERSION)
    assert flags.options["--enforce-eager"] == ServerOption(
        dest="enforce_eager",
        action=flags.options["--enforce-eager"].action,
        takes_value=False,
        nargs=flags.options["--enforce-eager"].nargs,
        choices=None,
        deprecated=False,
    )
    with pytest.raises(ValueError, match="switch"):
        prepare.split_flags(["/m", "--enforce-eager", "true"], flags)


def test_environment_drops_secrets_and_maps_pod_volumes() -> None:
    container = {
        "env": [
            {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "k", "key": "v"}}},
            {"name": "VLLM_CACHE_ROOT", "value": "/mnt/models/.vllm-cache/m"},
            {"name": "HOME", "value": "/home/vllm"},
            {"name": "XDG_CACHE_HOME", "value": "/home/vllm/.cache"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
        ],
        "volumeMounts": [
            {"name": "home", "mountPath": "/home/vllm"},
            {"name": "models", "mountPath": "/mnt/models"},
        ],
    }
    pod = {"volumes": [{"name": "home", "emptyDir": {}}, {"name": "models", "persistentVolumeClaim": {}}]}
    env, changes = prepare.translate_environment(container, pod)
    assert env == {
        "VLLM_CACHE_ROOT": "{shared_cache}",
        "HOME": "{scratch}/home",
        "XDG_CACHE_HOME": "{scratch}/home/.cache",
        "HF_HUB_OFFLINE": "1",
    }
    assert {change.what for change in changes} == {
        "env VLLM_API_KEY",
        "env VLLM_CACHE_ROOT",
        "env HOME",
        "env XDG_CACHE_HOME",
    }


def test_paths_inside_the_compile_cache_move_with_it_to_the_shared_lab_folder() -> None:
    container = {
        "env": [
            {"name": "VLLM_CACHE_ROOT", "value": "/mnt/models/.vllm-cache/m/H200/0.32.0"},
            {"name": "FLASHINFER_WORKSPACE_BASE", "value": "/mnt/models/.vllm-cache/m/H200/0.32.0/jit/fi"},
            {"name": "OTHER_ON_THE_VOLUME", "value": "/mnt/models/.vllm-cache/m/H200/0.32.0-old"},
        ],
        "volumeMounts": [{"name": "models", "mountPath": "/mnt/models"}],
    }
    pod = {"volumes": [{"name": "models", "persistentVolumeClaim": {}}]}
    env, changes = prepare.translate_environment(container, pod)
    assert env["FLASHINFER_WORKSPACE_BASE"] == "{shared_cache}/jit/fi"
    assert env["OTHER_ON_THE_VOLUME"] == "/mnt/models/.vllm-cache/m/H200/0.32.0-old", "a sibling, not inside"
    assert "env FLASHINFER_WORKSPACE_BASE" in {change.what for change in changes}


def test_the_stacks_jit_caches_are_in_the_lab_shared_cache_as_on_the_pod(plan: dict) -> None:
    env = plan["lab"]["env"]
    for name in ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR"):
        assert env[name].startswith(prepare.SHARED_CACHE + "/"), (name, env[name])
    assert env["HOME"].startswith(prepare.SCRATCH + "/")


def test_lab_flag_snapshot_is_of_the_lab_vllm() -> None:
    snapshot = json.loads(prepare.LAB_FLAGS_FILE.read_text())
    assert snapshot["vllm_version"] == LAB_GPU_VLLM_VERSION
    assert "--kv-cache-dtype" in snapshot["options"] and "--stream-interval" in snapshot["options"]


def test_probes_change_only_the_memory_utilisation(plan: dict) -> None:
    probe = next(p for p in plan["probes"] if p["name"].startswith("stack-"))
    lab = plan["lab"]["serve_args"]
    differing = [i for i, (a, b) in enumerate(zip(lab, probe["serve_args"], strict=True)) if a != b]
    assert len(differing) == 1
    assert lab[differing[0] - 1] == "--gpu-memory-utilization"
    assert float(probe["serve_args"][differing[0]]) == prepare.PROBE_UTILIZATION
