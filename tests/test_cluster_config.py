"""cluster.yaml passes the cluster launcher's own checks, offline.

``ray up`` reads the YAML, fills in the provider's defaults (``prepare_config``)
and validates the result against Ray's schema (``validate_config``) before it
makes any cloud call; these tests run exactly those functions of the installed
Ray, and no cloud API.
"""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.providers import _NODE_PROVIDERS
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"


def validate_like_ray_up(config: dict) -> dict:
    """The config checks of ``ray up``: schema of what the user wrote, then the prepared config."""
    validate_config(config)  # the user's file alone: required fields, types, node types
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


@pytest.fixture
def config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def test_cluster_yaml_is_valid_for_ray_up(config):
    prepared = validate_like_ray_up(config)
    assert prepared["provider"]["type"] in _NODE_PROVIDERS  # a provider `ray up` knows
    nodes = prepared["available_node_types"]
    assert prepared["head_node_type"] in nodes
    workers = [name for name in nodes if name != prepared["head_node_type"]]
    assert workers, "a worker node type"
    for name in workers:
        assert 0 <= nodes[name]["min_workers"] <= nodes[name]["max_workers"] <= prepared["max_workers"]
        assert nodes[name]["resources"].get("CPU", 0) > 0  # workers host the subtasks
    # the head hosts job masters only: no CPU, so no subtask lands on it
    assert nodes[prepared["head_node_type"]]["resources"].get("CPU") == 0
    setup = " ".join(prepared["setup_commands"])
    assert "openjdk-17" in setup and "raystream" in setup
    for commands in (prepared["head_start_ray_commands"], prepared["worker_start_ray_commands"]):
        assert "RAY_AUTH_MODE=token" in " ".join(commands)  # token authentication stays on
    assert any("auth_token" in local for local in prepared["file_mounts"].values())


def test_missing_provider_is_rejected_with_rays_message(config):
    del config["provider"]
    with pytest.raises(jsonschema.ValidationError, match="'provider' is a required property"):
        validate_like_ray_up(config)


def test_unknown_head_node_type_is_rejected_with_rays_message(config):
    config["head_node_type"] = "no-such-type"
    with pytest.raises(ValueError, match="`head_node_type` must be one of `available_node_types`"):
        validate_like_ray_up(config)


def test_node_type_without_node_config_is_rejected_with_rays_message(config):
    del config["available_node_types"]["worker"]["node_config"]
    with pytest.raises(jsonschema.ValidationError, match="'node_config' is a required property"):
        validate_like_ray_up(config)


def test_node_type_with_malformed_resources_is_rejected_with_rays_message(config):
    config["available_node_types"]["worker"]["resources"] = {"CPU": "four"}
    with pytest.raises(jsonschema.ValidationError, match="'four' is not of type 'integer'"):
        validate_like_ray_up(config)


def test_more_minimum_workers_than_the_cluster_may_have_is_rejected(config):
    config["available_node_types"]["worker"]["min_workers"] = config["max_workers"] + 1
    with pytest.raises(ValueError, match="global `max_workers` is smaller than the sum"):
        validate_like_ray_up(config)
