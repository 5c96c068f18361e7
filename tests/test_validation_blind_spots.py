"""The kinds of mistake `validate` used to accept (issue 40), as pure checks on prod's stack with one
change each: cloud API limits from botocore's model, secrets shared across readers, a to-zero model's
own hostname. (Their whole-file counterparts are tests/bad-stacks/*.yaml.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.config.loader import load_stack_config, stack_file_for
from domain.config.platform import PlatformConfig
from domain.secret_checks import secret_isolation_problems
from domain.validation import to_zero_hostname_problems
from infra.aws.api_limits import operation_model, request_violations, shape_violations
from infra.signal_checks import query_window_problems, range_seconds, signal_source_problems
from infra.stack_checks import aws_api_limit_problems, platform_problems

Edit = Callable[[dict[str, Any]], None]


def prod_with(tmp_path: Path, edit: Edit) -> PlatformConfig:
    """prod's stack file with `edit` applied to its `config:` (keys without the namespace), parsed
    and typed but not cross-checked, so one check can be called on its own."""
    document = yaml.safe_load(stack_file_for("prod").read_text())
    section = {key.removeprefix("vllm-platform:"): value for key, value in document["config"].items()}
    edit(section)
    document["config"] = {
        (key if ":" in key else f"vllm-platform:{key}"): value for key, value in section.items()
    }
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_stack_config("prod", stack_file=path)


def key_paths(problems: list[Any]) -> list[str]:
    return [problem.key_path() for problem in problems]


# --- cloud API limits (botocore's service model) ---------------------------------------------------


def test_eks_label_limits_are_read_from_botocores_model_not_written_here() -> None:
    labels = operation_model("eks", "CreateNodegroup").input_shape.members["labels"]
    assert (labels.key.metadata["min"], labels.key.metadata["max"]) == (1, 63)
    assert (labels.value.metadata["min"], labels.value.metadata["max"]) == (1, 63)
    found = request_violations("eks", "CreateNodegroup", {"labels": {"a" * 64: "x", "b": ""}})
    assert [(v.at, v.limit) for v in found] == [
        (("labels", "a" * 64, "key"), "labelKey: 1 to 63 characters"),
        (("labels", "b"), "labelValue: 1 to 63 characters"),
    ]


def test_what_botocores_own_validator_refuses_is_refused_here_and_also_the_maxima_it_leaves_to_aws() -> None:
    """botocore's client-side ParamValidator checks minimum lengths only (the rest is the service's);
    EKS itself then refuses the maxima at `pulumi up`. Both must be found before."""
    from botocore.validate import ParamValidator

    request = {
        "clusterName": "c",
        "nodegroupName": "n",
        "subnets": [],
        "nodeRole": "r",
        "labels": {"a" * 70: "", "b": "x"},
        "taints": [{"key": "", "value": "", "effect": "NO_SCHEDULE"}],
    }
    report = ParamValidator().validate(request, operation_model("eks", "CreateNodegroup").input_shape)
    botocore_finds = report.generate_report()
    assert "labels." + "a" * 70 in botocore_finds and "taints[0].key" in botocore_finds
    ours = {violation.at for violation in request_violations("eks", "CreateNodegroup", request)}
    assert ours == {("labels", "a" * 70), ("taints", 0, "key"), ("labels", "a" * 70, "key")}


def test_shape_check_covers_counts_enums_and_numbers() -> None:
    tags = operation_model("eks", "CreateNodegroup").input_shape.members["tags"]
    assert [v.limit for v in shape_violations(tags, {f"k{i}": "v" for i in range(51)})] == [
        "TagMap: 1 to 50 entries"
    ]
    taints = operation_model("eks", "CreateNodegroup").input_shape.members["taints"]
    (effect,) = shape_violations(taints, [{"key": "k", "value": "", "effect": "NoSchedule"}])
    assert effect.at == (0, "effect") and effect.limit.startswith("TaintEffect: one of NO_SCHEDULE")
    scaling = operation_model("eks", "CreateNodegroup").input_shape.members["scalingConfig"]
    (size,) = shape_violations(scaling, {"minSize": 0, "maxSize": 0, "desiredSize": 0})
    assert size.at == ("maxSize",) and size.limit == "Capacity: at least 1"


def test_an_empty_taint_value_is_within_eks_limits() -> None:
    # taintValue is 0-63 characters in the model: a key-only taint is fine for EKS, unlike a label.
    assert request_violations("eks", "CreateNodegroup", {"taints": [{"key": "k", "value": ""}]}) == []


def test_gpu_group_label_key_with_a_long_prefix_is_refused_at_its_key(tmp_path: Path) -> None:
    fits = "team.research-platform.example.com/serving-cost-centre-for-gpus"
    key = fits + "1"
    assert (len(fits), len(key)) == (63, 64)

    def edit(config: dict[str, Any]) -> None:
        config["node_groups"]["gpu"]["h200"]["labels"].update({fits: "llm", key: "llm"})

    problems = aws_api_limit_problems(prod_with(tmp_path, edit))
    assert key_paths(problems) == [f"vllm-platform:node_groups.gpu.h200.labels.{key}"]
    assert "labelKey: 1 to 63 characters" in problems[0].message
    assert "shorten it" in problems[0].message


def test_empty_label_values_are_refused_on_gpu_and_system_groups(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["node_groups"]["gpu"]["l40s"]["labels"] = {"spot-ready": ""}
        config["node_groups"]["system"]["labels"] = {"pool": ""}

    problems = aws_api_limit_problems(prod_with(tmp_path, edit))
    assert sorted(key_paths(problems)) == [
        "vllm-platform:node_groups.gpu.l40s.labels.spot-ready",
        "vllm-platform:node_groups.system.labels.pool",
    ]
    assert all("EKS refuses an empty value" in problem.message for problem in problems)


def test_taint_key_beyond_63_characters_is_refused_at_the_taint(tmp_path: Path) -> None:
    key = "dedicated.research-platform.example.com/inference-only-nodes-pool"

    def edit(config: dict[str, Any]) -> None:
        config["node_groups"]["gpu"]["l40s"]["taints"] = [
            {"key": "nvidia.com/gpu", "value": "true"},
            {"key": key, "effect": "NoSchedule"},
        ]

    problems = aws_api_limit_problems(prod_with(tmp_path, edit))
    assert key_paths(problems) == ["vllm-platform:node_groups.gpu.l40s.taints[1].key"]
    assert "taintKey: 1 to 63 characters" in problems[0].message


def test_shipped_stacks_send_only_values_within_the_aws_limits() -> None:
    for stack in ("dev", "staging", "prod"):
        config = load_stack_config(stack)
        assert aws_api_limit_problems(config) == [], stack


def test_mode_existing_sends_nothing_to_aws_so_nothing_is_checked(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["node_groups"]["gpu"]["l40s"]["labels"] = {"spot-ready": ""}

    config = prod_with(tmp_path, edit)
    assert aws_api_limit_problems(config) != []
    existing = config.model_copy(update={"cluster": config.cluster.model_copy(update={"mode": "existing"})})
    assert aws_api_limit_problems(existing) == []


# --- every secret a pod may read holds only what that pod may know ---------------------------------


def _tenant_keys_in_one_secret(config: dict[str, Any]) -> None:
    for tenant in config["tenants"]:
        tenant["api_key_secrets"] = [{"name": "vllm-platform/prod/tenant-keys", "key": tenant["name"]}]


def test_tenant_keys_as_fields_of_one_secret_are_refused_for_each_exposed_key(tmp_path: Path) -> None:
    problems = secret_isolation_problems(prod_with(tmp_path, _tenant_keys_in_one_secret))
    # search is on the 8B and the Qwen, research on the 70B and the 8B: the 70B's role would read
    # search's field, and the Qwen's role research's.
    assert sorted(key_paths(problems)) == [
        "vllm-platform:tenants[0].api_key_secrets[0].name",
        "vllm-platform:tenants[1].api_key_secrets[0].name",
    ]
    by_path = {problem.key_path(): problem.message for problem in problems}
    search = by_path["vllm-platform:tenants[0].api_key_secrets[0].name"]
    assert (
        "field 'search' of this secret is for model 'llama-3-1-8b' and model 'qwen2-5-7b-tp2' only" in search
    )
    assert "model 'llama-3-1-70b' reads the same secret (for 'research')" in search
    assert "IAM grants a Secrets Manager secret whole" in search


def test_operator_key_as_a_field_beside_a_tenant_key_is_refused(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["security"] = {"operator_key_secret": {"name": "vllm-platform/prod/keys", "key": "operator"}}
        config["tenants"][1]["api_key_secrets"] = [{"name": "vllm-platform/prod/keys", "key": "research"}]

    problems = secret_isolation_problems(prod_with(tmp_path, edit))
    # Every model reads the operator key, so the Qwen (no research tenant) could read research's key.
    assert key_paths(problems) == ["vllm-platform:tenants[1].api_key_secrets[0].name"]
    assert "model 'qwen2-5-7b-tp2' reads the same secret (for 'operator')" in problems[0].message


def test_one_secret_read_whole_by_the_same_pods_is_allowed(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        # research's two keys in one secret (a rotation): exactly the same pods read both fields.
        config["tenants"][1]["api_key_secrets"] = [
            {"name": "vllm-platform/prod/tenants/research", "key": "current"},
            {"name": "vllm-platform/prod/tenants/research", "key": "next"},
        ]

    assert secret_isolation_problems(prod_with(tmp_path, edit)) == []


def test_monitoring_secrets_beside_a_models_key_are_refused(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["monitoring"]["alertmanager_config_secret"] = {
            "name": "vllm-platform/prod/tenants/search/api-key",
            "key": "alertmanager.yaml",
        }

    problems = secret_isolation_problems(prod_with(tmp_path, edit))
    assert sorted(key_paths(problems)) == [
        "vllm-platform:monitoring.alertmanager_config_secret.name",
        "vllm-platform:tenants[0].api_key_secrets[0].name",
    ]


def test_kubernetes_secrets_mount_only_the_named_keys_so_fields_may_share_one(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        _tenant_keys_in_one_secret(config)
        for tenant in config["tenants"]:
            tenant["api_key_secrets"][0]["name"] = "tenant-keys"
        config["security"] = {"secret_store": {"provider": "kubernetes-secret"}}

    assert secret_isolation_problems(prod_with(tmp_path, edit)) == []


def test_shipped_stacks_keep_every_key_in_a_secret_of_its_own() -> None:
    for stack in ("dev", "staging", "prod"):
        assert secret_isolation_problems(load_stack_config(stack)) == [], stack


# --- a model at zero has no hostname of its own ---------------------------------------------------


def test_a_to_zero_model_gets_no_default_hostname() -> None:
    config = load_stack_config("prod")
    hosts = {model.name: model.ingress_host for model in config.models}
    assert hosts == {
        "llama-3-1-8b": "llama-3-1-8b.llm.example.com",
        "llama-3-1-70b": "llama-3-1-70b.llm.example.com",
        "qwen2-5-7b-tp2": None,
    }
    assert to_zero_hostname_problems(config) == []


def test_a_to_zero_model_with_a_hostname_of_its_own_is_refused(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["models"][2]["ingress_host"] = "qwen.llm.example.com"

    problems = to_zero_hostname_problems(prod_with(tmp_path, edit))
    assert key_paths(problems) == ["vllm-platform:models[2].ingress_host"]
    assert "nothing would serve this host" in problems[0].message
    assert 'https://api.llm.example.com with "model": "Qwen/Qwen2.5-7B-Instruct"' in problems[0].message


def test_a_to_zero_model_needs_no_hostname_where_every_other_model_does(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        # No domain: the always-on models need ingress_host, the to-zero one must not be asked for one.
        del config["ingress"]["domain"]
        config["router"]["host"] = "api.llm.example.com"
        config["models"][0]["ingress_host"] = "llama-8b.llm.example.com"
        config["models"][1]["ingress_host"] = "llama-70b.llm.example.com"

    assert platform_problems(prod_with(tmp_path, edit)) == []


# --- every signal an autoscaler or alert reads is produced, at an interval its ranges resolve --------


def test_range_selectors_are_read_in_seconds_and_subqueries_are_not_scrapes() -> None:
    query = "rate(a[5m]) + increase(b[1h30m]) + deriv((c)[10m:30s]) + d[90s] + e[500ms]"
    assert list(range_seconds(query)) == [("[5m]", 300), ("[1h30m]", 5400), ("[90s]", 90), ("[500ms]", 0.5)]


@pytest.mark.parametrize(("idle", "refused"), [(239, True), (240, False)])
def test_the_wake_triggers_idle_window_must_hold_two_scrapes(
    tmp_path: Path, idle: int, refused: bool
) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["monitoring"]["scrape_interval_seconds"] = 120
        config["models"][2]["autoscaling"]["idle_seconds_before_zero"] = idle

    problems = query_window_problems(prod_with(tmp_path, edit))
    if not refused:
        assert problems == []
        return
    assert key_paths(problems) == ["vllm-platform:models[2].autoscaling.idle_seconds_before_zero"]
    assert f"reads a range of [{idle}s]" in problems[0].message
    assert (
        "raise it to at least 240, or lower monitoring.scrape_interval_seconds to 119 or less"
        in problems[0].message
    )


def test_every_alert_range_holds_two_scrapes_at_the_slowest_scrape_interval(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["monitoring"]["scrape_interval_seconds"] = 120  # the schema's maximum

    config = prod_with(tmp_path, edit)
    assert config.monitoring.alerts.enabled
    assert query_window_problems(config) == []


def test_an_alert_range_below_two_scrapes_is_refused_at_the_scrape_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No shipped alert has a range under 240 s; one rendered with 3m must still be caught.
    from components import alert_rules

    monkeypatch.setattr(alert_rules, "RATE_WINDOW", "3m")

    def edit(config: dict[str, Any]) -> None:
        config["monitoring"]["scrape_interval_seconds"] = 120

    problems = query_window_problems(prod_with(tmp_path, edit))
    assert problems and set(key_paths(problems)) == {"vllm-platform:monitoring.scrape_interval_seconds"}
    assert "alert VllmTimeToFirstTokenHigh reads a range of [3m] (180 s)" in problems[0].message


def _existing_prometheus_without_operator(config: dict[str, Any]) -> None:
    config["monitoring"] = {
        "prometheus": "existing",
        "existing_prometheus_url": "http://prometheus.observability.svc:9090",
        "existing_prometheus_operator": False,
    }
    config.pop("addons", None)


def test_a_to_zero_models_wake_signal_needs_the_routers_pod_monitor(tmp_path: Path) -> None:
    problems = signal_source_problems(prod_with(tmp_path, _existing_prometheus_without_operator))
    assert key_paths(problems) == ["vllm-platform:models[2].autoscaling.min_replicas"]
    assert 'vllm_router_requests_total with model="qwen2-5-7b-tp2"' in problems[0].message
    assert "monitoring.existing_prometheus_operator: false" in problems[0].message


def test_an_existing_prometheus_operator_scrapes_the_wake_signal(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        _existing_prometheus_without_operator(config)
        config["monitoring"]["existing_prometheus_operator"] = True

    assert signal_source_problems(prod_with(tmp_path, edit)) == []


def test_series_gaps_name_what_produces_each_exporters_series(tmp_path: Path) -> None:
    from components.scrape import series_gaps

    def edit(config: dict[str, Any]) -> None:
        _existing_prometheus_without_operator(config)
        config["addons"] = {"dcgm_exporter": False, "keda": True, "argo_rollouts": True}
        config["models"][0]["vllm"]["extra_args"] = ["--disable-log-stats"]

    config = prod_with(tmp_path, edit)
    assert set(series_gaps(config, config.models[0])) == {"vllm", "dcgm", "router"}
    assert set(series_gaps(config, config.models[1])) == {"dcgm", "router"}
    assert set(series_gaps(load_stack_config("prod"), load_stack_config("prod").models[0])) == set()


def test_statistics_off_is_refused_where_alerts_canaries_and_autoscalers_read_them(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["models"][1]["vllm"]["extra_args"] = ["--disable-log-stats"]

    config = prod_with(tmp_path, edit)
    problems = signal_source_problems(config)
    assert key_paths(problems) == ["vllm-platform:models[1].vllm.extra_args[0]"]
    assert (
        "its autoscaler (vllm:num_requests_waiting, vllm:kv_cache_usage_perc), its canary analysis, its "
        "alerts (latency, errors, queue, KV cache) and the platform's dashboards read: remove it"
    ) in problems[0].message
    # Said once, at the flag: not again at each metric the autoscaler lists.
    assert key_paths(platform_problems(config)) == ["vllm-platform:models[1].vllm.extra_args[0]"]


def test_limits_the_config_schema_states_agree_with_botocores_model() -> None:
    """Bounds that live in the schema (so a stack file is refused while it is parsed) are AWS's own:
    a tenant's WAF rate limit (wafv2 RateBasedStatement.Limit) and a Secrets Manager secret name
    (CreateSecret.Name, 1-512 characters; its character set is the API reference's, not in the model)."""
    from botocore.session import get_session

    from domain.config.tenants import WAF_MAXIMUM_RATE_LIMIT, WAF_MINIMUM_RATE_LIMIT
    from domain.secret_checks import _SECRETS_MANAGER_NAME

    limit = get_session().get_service_model("wafv2").shape_for("RateBasedStatement").members["Limit"]
    assert (limit.metadata["min"], limit.metadata["max"]) == (WAF_MINIMUM_RATE_LIMIT, WAF_MAXIMUM_RATE_LIMIT)
    name = operation_model("secretsmanager", "CreateSecret").input_shape.members["Name"]
    longest, shortest = "a" * name.metadata["max"], "a" * name.metadata["min"]
    assert _SECRETS_MANAGER_NAME.match(longest) and _SECRETS_MANAGER_NAME.match(shortest)
    assert not _SECRETS_MANAGER_NAME.match(longest + "a")


def test_cluster_requests_values_are_checked_too() -> None:
    found = request_violations(
        "eks",
        "CreateCluster",
        {"name": "-vllm", "logging": {"clusterLogging": [{"types": ["api", "kubelet"]}]}},
    )
    assert [(v.at, v.limit.split(":")[0]) for v in found] == [
        (("name",), "ClusterName"),
        (("logging", "clusterLogging", 0, "types", 1), "LogType"),
    ]


def test_the_allocatable_a_pod_is_checked_against_follows_the_eks_kubelet_reservation() -> None:
    """Issue 50: pod requests are held against capacity less the kubelet's reservation, as the EKS AMIs
    compute it: CPU 60m for the first core, 10m for the second, 5m each for the next two, 2.5m above
    four (80m on 4 vCPUs, 550m on a p5's 192); memory 255 MiB + 11 MiB x 250 pods + 100 MiB eviction."""
    from domain.placement_checks import allocatable, kubelet_reserved_millicores

    assert [kubelet_reserved_millicores(n) for n in (1, 2, 4, 8, 192)] == [60, 70, 80, 90, 550]
    cores, gib = allocatable(192, 2048)
    assert cores == pytest.approx(191.45) and gib == pytest.approx(2048 - 3105 / 1024)
