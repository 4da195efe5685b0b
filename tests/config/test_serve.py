"""The deploy job's config (``ServeJobConfig``): what the deployment's keys mean to Ray Serve,
and every bad value one line naming the key (issue 42, item 5). No Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from raycompat.config import load_config
from raycompat.config.serve import ServeJobConfig
from raycompat.errors import ConfigError

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "deploy_demo.yaml"


def test_the_shipped_config_autoscales_between_one_and_two_replicas_of_one_cpu():
    options = load_config(ServeJobConfig, SHIPPED).deployment.options()
    assert options == {
        "name": "SearchService",
        "max_ongoing_requests": 32,
        "ray_actor_options": {"num_cpus": 1.0, "num_gpus": 0.0},
        "autoscaling_config": {
            "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 8.0,
        },
    }  # fmt: skip


def test_fixed_replicas_and_a_memory_reservation():
    cfg = load_config(ServeJobConfig, None, ["deployment.num_replicas=3", "deployment.memory_gb=2"])
    options = cfg.deployment.options()
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["ray_actor_options"]["memory"] == 2 * 2**30
    assert load_config(ServeJobConfig).deployment.options()["num_replicas"] == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["deployment.num_replicas=2"], "deployment: give num_replicas or autoscaling, not both"),
        (["deployment.autoscaling.min_replicas=3"], "min_replicas 3 is above max_replicas 2"),
        (["deployment.replicas=2"], "unknown config key(s) deployment.replicas"),
        (["deployment.num_cpus=-1"], "deployment.num_cpus"),
        (["http.port=70000"], "http.port"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_file_and_key(overrides, message):
    with pytest.raises(ConfigError, match="deploy_demo.yaml: ") as raised:
        load_config(ServeJobConfig, SHIPPED, overrides)
    assert message in str(raised.value) and "\n" not in str(raised.value)
