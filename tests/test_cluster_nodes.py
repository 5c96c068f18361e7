"""The deploy tests' KWOK nodes sit in zones as the stack's subnets place them (tests/cluster/nodes.py):
every group balanced over every zone of the node subnets, groups not lined up in the first zone."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import yaml

from domain.config import load_stack_config
from infra.aws.network import subnet_layout
from infra.stack_checks import load_stack
from tests.cluster.fixtures import CLUSTER_STACK_FILE
from tests.cluster.nodes import availability_zones, node_zones, stack_nodes


def test_the_zones_are_those_of_the_node_subnets() -> None:
    config = load_stack("prod")
    layout = subnet_layout(config.cluster.vpc_cidr, config.cluster.availability_zone_count)
    assert availability_zones(config) == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert len(layout.private_cidrs) == len(availability_zones(config))


def test_each_group_is_balanced_over_every_zone() -> None:
    config = load_stack("prod")
    zones = availability_zones(config)
    for group, placed in node_zones(config).items():
        counts = Counter(placed)
        assert set(counts) <= set(zones), group
        assert max(counts.values()) - min(counts.get(zone, 0) for zone in zones) <= 1, (group, placed)


def test_groups_do_not_all_start_in_the_first_zone(tmp_path: Path) -> None:
    # Three zones, two system nodes, one node per GPU group: the H200 node lands alone in the third
    # zone, as an Auto Scaling group may place it, and that is where a zone bug shows (issue 40).
    document = yaml.safe_load(CLUSTER_STACK_FILE.read_text())
    values = document["config"]
    values["vllm-platform:cluster"]["availability_zone_count"] = 3
    values["vllm-platform:node_groups"]["system"].update(min_size=2, desired_size=2, max_size=2)
    for group in values["vllm-platform:node_groups"]["gpu"].values():
        group.update(min_size=1, desired_size=1, max_size=1)
    path = tmp_path / "Pulumi.cluster.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = load_stack_config("cluster", stack_file=path)
    assert node_zones(config) == {
        "system": ["us-east-1a", "us-east-1b"],
        "h200": ["us-east-1c"],
        "l40s": ["us-east-1a"],
    }
    groups_in_zone: dict[str, set[str]] = defaultdict(set)
    for node in stack_nodes(config):
        labels = node["metadata"]["labels"]
        groups_in_zone[labels["topology.kubernetes.io/zone"]].add(labels["eks.amazonaws.com/nodegroup"])
    assert groups_in_zone["us-east-1c"] == {"h200"}
