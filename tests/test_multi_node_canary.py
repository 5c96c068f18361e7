"""A multi-node model's canary (issue 42; docs/multi-node.md, "Canary"): the candidate in a
LeaderWorkerSet of its own, the stable/canary Services on one set's leaders each, the ALB weights the
stack sets, an Argo Rollouts AnalysisRun per weight, and what `validate` refuses.

The stack is stacks/Pulumi.multinode.yaml with the model on `strategy: canary`, Argo Rollouts on,
room for a second group (max_size 4) and a model volume for both revisions; each test varies it.
tests/test_rollouts_promtool.py runs the AnalysisRun's queries through promtool, and
tests/test_deploy_multi_node.py places the candidate's groups with the real LWS controller and has
Argo Rollouts' real controller take up the AnalysisRun.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from components.leader_worker_set import CANARY_SET, LWS_KIND, SET_NAME_LABEL, STABLE_SET, WORKER_INDEX_LABEL
from components.rollouts import ALB_ACTION_ANNOTATION, CANARY_SERVICE, ROOT_SERVICE, STABLE_SERVICE
from domain.config import ConfigError
from domain.config.loader import STACKS_DIR
from infra.render import RenderResult, render_stack
from infra.stack_checks import load_stack
from tests.support.charts import require_chart_data
from tests.test_custom_resources import _schema_for

NAMESPACE = "vllm-llama-3-1-405b"
NEW_REVISION = "5206a32e0bd3067aef1ce90f5528ade7d866253f"
CANDIDATE = {
    "source": {
        "s3_uri": f"s3://vllm-multinode-model-weights/meta-llama/Llama-3.1-405B-Instruct/{NEW_REVISION}/",
        "revision": NEW_REVISION,
    },
    "vllm": {"max_num_seqs": 96},
    "weight": 10,
}


def canary_stack(candidate: dict[str, Any] | None = CANDIDATE) -> dict[str, Any]:
    data = yaml.safe_load((STACKS_DIR / "Pulumi.multinode.yaml").read_text())
    config = data["config"]
    canary: dict[str, Any] = {} if candidate is None else {"candidate": copy.deepcopy(candidate)}
    config["vllm-platform:models"][0]["rollout"] = {"strategy": "canary", "canary": canary}
    config["vllm-platform:node_groups"]["gpu"]["h100"]["max_size"] = 4
    config["vllm-platform:addons"] = {"argo_rollouts": True}
    config["vllm-platform:storage"] = {"model_volume_size_gib": 2000}
    return data


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "Pulumi.multinode.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def render(tmp_path: Path, data: dict[str, Any]) -> RenderResult:
    return render_stack("multinode", stack_file=write(tmp_path, data), allow_missing_charts=True)


def model_of(data: dict[str, Any]) -> dict[str, Any]:
    return data["config"]["vllm-platform:models"][0]


def problems_of(tmp_path: Path, data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_stack("multinode", stack_file=write(tmp_path, data))
    return str(caught.value)


def _args(lws: dict[str, Any], role: str) -> str:
    return " ".join(lws["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"][0]["args"])


def _alb_weights(result: RenderResult) -> dict[str, int]:
    (ingress,) = result.find("Ingress", ROOT_SERVICE, NAMESPACE)
    action = json.loads(ingress["metadata"]["annotations"][ALB_ACTION_ANNOTATION])
    return {group["serviceName"]: group["weight"] for group in action["forwardConfig"]["targetGroups"]}


# --- what is rendered ------------------------------------------------------------------------------


def test_the_candidate_runs_in_a_leader_worker_set_of_its_own_beside_the_stable_one(tmp_path: Path) -> None:
    result = render(tmp_path, canary_stack())
    (stable,) = result.find(LWS_KIND, STABLE_SET, NAMESPACE)
    (canary,) = result.find(LWS_KIND, CANARY_SET, NAMESPACE)
    assert canary["spec"]["replicas"] == 1
    assert (
        canary["spec"]["leaderWorkerTemplate"]["size"] == stable["spec"]["leaderWorkerTemplate"]["size"] == 2
    )
    for role in ("leaderTemplate", "workerTemplate"):
        # The candidate's own revision and engine settings; the stable set keeps the model's.
        assert f"/{NEW_REVISION} " in _args(canary, role) and "--max-num-seqs 96" in _args(canary, role)
        assert NEW_REVISION not in _args(stable, role) and "--max-num-seqs 64" in _args(stable, role)
        preload = canary["spec"]["leaderWorkerTemplate"][role]["spec"]["initContainers"][0]["args"]
        assert preload[preload.index("--revision") + 1] == NEW_REVISION
    assert "--headless" in _args(canary, "workerTemplate") and "--headless" not in _args(
        canary, "leaderTemplate"
    )
    # Both sets are rendered with the same subdomain policy (a per-group headless Service each).
    assert canary["spec"]["networkConfig"] == stable["spec"]["networkConfig"]


def test_the_stable_and_canary_services_hold_one_sets_leaders_each(tmp_path: Path) -> None:
    result = render(tmp_path, canary_stack())
    selectors = {
        name: result.find("Service", name, NAMESPACE)[0]["spec"]["selector"]
        for name in (ROOT_SERVICE, STABLE_SERVICE, CANARY_SERVICE)
    }
    assert selectors[STABLE_SERVICE][SET_NAME_LABEL] == STABLE_SET
    assert selectors[CANARY_SERVICE][SET_NAME_LABEL] == CANARY_SET
    for selector in selectors.values():
        assert selector[WORKER_INDEX_LABEL] == "0"  # leaders only: workers run --headless
    # The root Service (router, in-cluster clients) holds both sets' leaders.
    assert SET_NAME_LABEL not in selectors[ROOT_SERVICE]


def test_the_alb_sends_the_candidates_weight_and_the_rest_to_the_stable_groups(tmp_path: Path) -> None:
    assert _alb_weights(render(tmp_path, canary_stack())) == {CANARY_SERVICE: 10, STABLE_SERVICE: 90}
    data = canary_stack({**CANDIDATE, "weight": 100})
    assert _alb_weights(render(tmp_path, data)) == {CANARY_SERVICE: 100, STABLE_SERVICE: 0}


def test_without_a_candidate_every_request_goes_to_the_stable_groups_and_nothing_is_judged(
    tmp_path: Path,
) -> None:
    result = render(tmp_path, canary_stack(candidate=None))
    assert [lws["metadata"]["name"] for lws in result.find(LWS_KIND, None, NAMESPACE)] == [STABLE_SET]
    assert result.find("AnalysisRun", None, NAMESPACE) == []
    assert _alb_weights(result) == {CANARY_SERVICE: 0, STABLE_SERVICE: 100}


def test_each_weight_gets_its_own_analysis_run_of_the_candidates_leaders_against_the_stable_ones(
    tmp_path: Path,
) -> None:
    require_chart_data()
    runs = {}
    for weight in (0, 10, 50):
        found = render(tmp_path, canary_stack({**CANDIDATE, "weight": weight})).find(
            "AnalysisRun", None, NAMESPACE
        )
        runs[weight] = found
    assert runs[0] == []  # started, serving nothing: nothing to judge
    (ten,), (fifty,) = runs[10], runs[50]
    assert ten["metadata"]["name"].startswith("vllm-canary-10-")
    assert fifty["metadata"]["name"].startswith("vllm-canary-50-")
    names = [metric["name"] for metric in ten["spec"]["metrics"]]
    assert names == ["error-rate", "http-error-rate", "ttft-p95", "tpot-p95", "queue-depth"]
    for metric in ten["spec"]["metrics"]:
        query = metric["provider"]["prometheus"]["query"]
        assert f'pod=~"{CANARY_SET}-[0-9]+"' in query and f'pod=~"{STABLE_SET}-[0-9]+"' in query, query
        assert "{{args." not in query  # an AnalysisRun of ours gets no arguments from a Rollout
        assert metric["successCondition"] == "result[0] <= 1"
    jsonschema.validate(ten, _schema_for(ten))


def test_the_namespace_quota_holds_the_stable_and_the_candidates_groups(tmp_path: Path) -> None:
    (quota,) = render(tmp_path, canary_stack()).find("ResourceQuota", "gpu-quota", NAMESPACE)
    # (1 stable + 1 candidate group + 1 group's pods draining) x 2 nodes x 8 GPUs.
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == str(3 * 2 * 8)


def test_an_autoscaled_stable_set_keeps_its_autoscaler_and_the_candidate_is_not_counted(
    tmp_path: Path,
) -> None:
    data = canary_stack()
    model = model_of(data)
    model.pop("replicas")
    model["autoscaling"] = {"enabled": True, "backend": "keda", "min_replicas": 1, "max_replicas": 1}
    data["config"]["vllm-platform:addons"]["keda"] = True
    (scaled,) = render(tmp_path, data).find("ScaledObject", None, NAMESPACE)
    assert scaled["spec"]["scaleTargetRef"]["name"] == STABLE_SET
    for trigger in scaled["spec"]["triggers"]:
        # `vllm-[0-9]+` matches the stable leaders `vllm-0`, never the candidate's `vllm-canary-0`.
        assert f'pod=~"{STABLE_SET}-[0-9]+"' in trigger["metadata"]["query"]


# --- what validate refuses ---------------------------------------------------------------------------


def test_a_candidate_needs_room_for_its_groups_beside_the_stable_ones(tmp_path: Path) -> None:
    data = canary_stack()
    data["config"]["vllm-platform:node_groups"]["gpu"]["h100"]["max_size"] = 2
    message = problems_of(tmp_path, data)
    assert "models[0].rollout.canary.candidate.replicas = 1" in message
    assert "1 stable and 1 candidate group(s) of 2 nodes = 4 nodes" in message and "max_size to 4" in message


def test_argos_step_settings_are_refused_on_a_multi_node_canary(tmp_path: Path) -> None:
    data = canary_stack()
    model_of(data)["rollout"]["canary"]["steps"] = [10, 50]
    message = problems_of(tmp_path, data)
    assert "models[0].rollout.canary.steps" in message and "candidate.weight" in message


def test_a_candidate_on_a_one_node_model_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())
    model = data["config"]["vllm-platform:models"][0]
    assert model["rollout"]["strategy"] == "canary"
    model["rollout"].setdefault("canary", {})["candidate"] = {"vllm": {"max_num_seqs": 96}}
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as caught:
        load_stack("prod", stack_file=path)
    assert "models[0].rollout.canary.candidate" in str(caught.value)
    assert "Argo Rollouts steps it through rollout.canary.steps" in str(caught.value)


def test_a_candidate_without_strategy_canary_is_refused(tmp_path: Path) -> None:
    data = canary_stack()
    model_of(data)["rollout"]["strategy"] = "rolling"
    assert "served only with rollout.strategy: canary" in problems_of(tmp_path, data)


def test_a_candidate_identical_to_the_stable_groups_is_refused(tmp_path: Path) -> None:
    data = canary_stack({"vllm": {"max_num_seqs": 64}, "weight": 10})  # the model's own value
    assert "runs exactly what the stable groups run" in problems_of(tmp_path, data)


def test_a_canary_of_a_model_that_scales_to_zero_is_refused(tmp_path: Path) -> None:
    data = canary_stack()
    model = model_of(data)
    model.pop("replicas")
    model["autoscaling"] = {"enabled": True, "backend": "keda", "min_replicas": 0, "max_replicas": 1}
    model.pop("ingress_host", None)
    data["config"]["vllm-platform:addons"]["keda"] = True
    assert "has no Ingress of its own, so no ALB weights" in problems_of(tmp_path, data)


@pytest.mark.parametrize(
    ("vllm", "key_path", "says"),
    [
        ({"max_num_sequences": 96}, "candidate.vllm.max_num_sequences", "models[].vllm has no such key"),
        ({"tuning_profile": "h200-throughput"}, "candidate.vllm.tuning_profile", "give the settings"),
        ({"extra_args": ["--no-such-flag"]}, "candidate.vllm.extra_args", "--no-such-flag"),
    ],
)
def test_bad_candidate_engine_settings_are_refused_at_the_candidates_key(
    tmp_path: Path, vllm: dict[str, Any], key_path: str, says: str
) -> None:
    message = problems_of(tmp_path, canary_stack({**CANDIDATE, "vllm": vllm}))
    assert f"models[0].rollout.canary.{key_path}" in message, message
    assert says in message, message


def test_a_candidate_that_does_not_fit_the_gpus_is_refused_like_the_model(tmp_path: Path) -> None:
    # The capacity plan sizes the candidate too: half of each H100 cannot hold 1/16 of 810 GB of weights.
    data = canary_stack({**CANDIDATE, "vllm": {"gpu_memory_utilization": 0.5}})
    message = problems_of(tmp_path, data)
    assert "models[0].gpus_per_replica = 8" in message, message
    assert "the canary's candidate: the model does not fit" in message, message
    assert "(0.5 × " in message, message  # the candidate's setting, not the model's 0.9


def test_every_policy_rule_passes_on_the_canary_render(tmp_path: Path) -> None:
    """The policy pack (policy/) over both sets: each template, and the PDB over both sets' pods."""
    from policy import vllm_policies as rules
    from tests.test_policy_pack import resources_of

    resources = resources_of(render(tmp_path, canary_stack()))
    sets = [r for r in resources if r.kind == LWS_KIND]
    assert sorted(r.props["metadata"]["name"] for r in sets) == sorted([STABLE_SET, CANARY_SET])
    assert [f"[{rule}] {violation}" for rule, violation in rules.run_rules(resources)] == []
