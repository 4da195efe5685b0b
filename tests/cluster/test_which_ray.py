"""Which Ray a job or command uses (``raycompat.cluster.which_ray``): the rule, and the line that
names the Ray it got."""

from __future__ import annotations

import re

import pytest

from raycompat.cluster.which_ray import LOCAL, cluster_line, resolve_address


@pytest.mark.parametrize(
    "address, env, expected",
    [
        (None, None, LOCAL),  # nothing named: a private Ray, never "the latest cluster"
        (None, "http://127.0.0.1:8265", "http://127.0.0.1:8265"),  # ray job submit's
        ("auto", None, "auto"),  # the cluster `ray start` left, when asked
        ("auto", "10.0.0.1:6379", "auto"),  # --address wins over RAY_ADDRESS
        ("local", "10.0.0.1:6379", LOCAL),  # a private one even where RAY_ADDRESS is set
        ("127.0.0.1:6390", None, "127.0.0.1:6390"),
    ],
)
def test_the_rule(monkeypatch, address, env, expected):
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    assert resolve_address(address) == expected


@pytest.mark.ray
def test_the_line_names_where_nodes_cpus_and_gpus(ray_local):
    import ray

    cpus = ray.cluster_resources()["CPU"]
    assert cluster_line(LOCAL) == (
        f"Ray: a private local Ray that ends with this process: 1 node(s), {cpus:g} CPU(s), "
        "0 GPU(s)"
    )
    joined = cluster_line("auto")
    assert re.fullmatch(
        r"Ray: the cluster at [\d.]+:\d+ \(address 'auto'\): 1 node\(s\), [\d.]+ CPU\(s\), "
        r"0 GPU\(s\)",
        joined,
    ), joined


@pytest.mark.parametrize("env, expected", [(None, LOCAL), ("10.0.0.1:6379", "10.0.0.1:6379")])
def test_a_pipeline_called_with_no_ray_starts_one_by_the_rule(monkeypatch, env, expected):
    """``transform_version`` and the other pipelines called from Python with no Ray yet start
    one as the jobs do, not with a bare ``ray.init()`` (which joins the latest cluster found on
    the machine, another user's on a shared one)."""
    import ray

    from raycompat.cluster.pipelines import runner

    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    started, announced = [], []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: started.append(kwargs))
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 2.0}}])
    monkeypatch.setattr(runner, "announce", announced.append)

    assert runner.live_nodes() == [{"CPU": 2.0}]
    assert started == [{"address": expected}] and announced == [expected]
