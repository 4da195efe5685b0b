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
    assert started == [{"address": expected, "include_dashboard": False}]
    assert announced == [expected]


class _Started(Exception):
    """Raised where the command would start Ray: the test stops there."""


COMMANDS_THAT_START_RAY = {
    "adopt": ["adopt", "faces", "TABLE", "--version", "v2", "--model", "m1"],
    "index build": ["index", "build", "faces", "--version", "v1", "--kind", "sharded_ivf"],
    "adapt --runner ray": [
        "adapt", "faces", "--version", "v1", "--model", "m1", "--pairs", "PAIRS",
        "--runner", "ray",
    ],
}  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS_THAT_START_RAY)
@pytest.mark.parametrize("address", [None, "auto", "local"])
def test_every_command_that_starts_ray_asks_the_rule_with_its_address(
    tmp_path, monkeypatch, command, address
):
    """``adopt``, ``index build`` and ``adapt --runner ray`` start Ray through
    ``ray_for_command`` with their ``--address`` (the rule's step 1; the others are tested on
    ``ray_for_command`` itself, ``test_local_ray.py``), not with a Ray of their own."""
    import numpy as np
    import pyarrow.parquet as pq

    from raycompat.cli.app import main
    from raycompat.cluster import local_ray
    from raycompat.store import GalleryStore, VersionInfo, embedding_table

    store = GalleryStore(str(tmp_path / "store"))
    staging = store.begin("faces", VersionInfo("v1", "m1", 4, True, "v1 = extract(m1)"), "job")
    x = np.eye(4, dtype=np.float32)[np.arange(12) % 4]
    staging.write_table(embedding_table(np.arange(12), x), "a.parquet")
    staging.commit(expected_rows=12)
    table = tmp_path / "table"
    table.mkdir()
    pq.write_table(embedding_table(np.arange(12), x), table / "part-0.parquet")
    pq.write_table(embedding_table(np.arange(4), x[:4]), tmp_path / "pairs.parquet")
    asked = []

    def started(given):
        asked.append(given)
        raise _Started

    monkeypatch.setattr(local_ray, "ray_for_command", started)
    argv = [
        {"TABLE": str(table), "PAIRS": str(tmp_path / "pairs.parquet")}.get(word, word)
        for word in COMMANDS_THAT_START_RAY[command]
    ]
    given = [] if address is None else ["--address", address]
    with pytest.raises(_Started):
        main([*argv, "--store", store.root, *given])
    assert asked == [address]
