"""A real two-node Ray cluster on one machine, with every output on the moto S3 server.

``ray start --head`` and ``ray start --address=...`` run side by side, each with its own ports,
temp dir, and a marker resource (``node_a`` / ``node_b``). Each test drives the cluster from a
subprocess (``ray.init(address=...)``), independent of the session's local Ray, and asserts
where the work ran from node ids recorded inside the actors and workers themselves:

- a transform whose two actors (2 CPUs each, so one fits per 2-CPU node) write parts from both
  nodes; the version is published on S3 with the source's id fingerprint, then its index is
  built by a task on node_b and loaded and searched by a task on node_a. The transformations
  ``h``/``g`` are written to a folder that is deleted once the driver has read them and before
  any actor starts: the actors, on either node, get them from Ray's object store;
- a 2-worker DDP training (2 CPUs per worker, so the ranks cannot share a node) whose
  checkpoints, holding one file from each rank, land in the bucket.

Limits: both nodes share one filesystem, so a folder "only the driver's node has" is played by
one that no longer exists when the actors start. Every output the tests check was written to,
and is read back from, S3.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import s3fs

from raycompat.store import GalleryStore
from tests.cluster.pipelines.test_pipelines import make_source, random_models, target
from tests.cluster.train.test_train_ray import TOY

pytestmark = [pytest.mark.slow, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)
NODE_CPUS = 2  # per node; a 2-CPU actor or worker fills a node, so two of them must spread


@dataclass
class Cluster:
    address: str  # GCS address, for ray.init(address=...)
    env: dict  # the environment the nodes were started with (fake AWS credentials included)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _node_command(temp_dir: str, resource: str, head_args: list[str]) -> list[str]:
    node, objm, metrics, env_agent, agent, grpc = _free_ports(6)
    return [
        f"{VENV_BIN}/ray",
        "start",
        *head_args,
        "--node-ip-address=127.0.0.1",
        f"--node-manager-port={node}",
        f"--object-manager-port={objm}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={env_agent}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={grpc}",
        f"--num-cpus={NODE_CPUS}",
        "--num-gpus=0",
        f"--resources={json.dumps({resource: 1})}",
        f"--object-store-memory={256 * 1024**2}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]


# ``ray start`` gives up when a node has not registered with the GCS within 30 s (hard-coded in
# ray/_private/node.py); on a loaded 2-core machine that happened once in a full suite. Such a
# start is retried once with a fresh pair of nodes.
STARTUP_TIMEOUT = "timed out during startup"


@pytest.fixture(scope="module")
def two_nodes(s3_server):
    """Head (``node_a``) and worker (``node_b``) on loopback, each with its own temp dir.

    Started after ``s3_server`` put the fake credentials in the environment, so every Ray
    process inherits them as a cloud node inherits its instance role. Stopped by killing the
    processes whose command line names either temp dir (``ray stop`` would also stop the
    session's own local Ray).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PATH"] = f"{VENV_BIN}:{env['PATH']}"
    for attempt in range(2):
        temp_dirs = _temp_dirs()
        try:
            address, out = _start_nodes(temp_dirs, env)
            if out.returncode == 0:
                break
            if attempt or STARTUP_TIMEOUT not in out.stdout + out.stderr:
                pytest.fail(f"{' '.join(out.args)}\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
        except BaseException:
            _stop_nodes(temp_dirs)
            raise
        _stop_nodes(temp_dirs)
    try:
        yield Cluster(address, env)
    finally:
        _stop_nodes(temp_dirs)


def _temp_dirs() -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"/tmp/rc2a{tag}", f"/tmp/rc2b{tag}"]  # short: Unix socket paths are limited


def _start_nodes(temp_dirs: list[str], env: dict) -> tuple[str, subprocess.CompletedProcess]:
    """``ray start`` the head, then the worker: the address and the first failed (or the last)
    command's result."""
    gcs, client = _free_ports(2)
    head = _node_command(
        temp_dirs[0],
        "node_a",
        [
            "--head",
            f"--port={gcs}",
            "--include-dashboard=false",
            f"--ray-client-server-port={client}",
        ],
    )
    address = f"127.0.0.1:{gcs}"
    worker = _node_command(temp_dirs[1], "node_b", [f"--address={address}"])
    for cmd in (head, worker):
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        if out.returncode:
            break
    return address, out


def _stop_nodes(temp_dirs: list[str]) -> None:
    """Kill the processes whose command line names either temp dir, then remove the dirs."""
    for proc in psutil.process_iter(["cmdline"]):
        if any(d in part for part in proc.info["cmdline"] or [] for d in temp_dirs):
            proc.kill()
    for directory in temp_dirs:
        shutil.rmtree(directory, ignore_errors=True)


# Run by the subprocess driver before each test's own script: connect, wait for both nodes,
# and start ``Where``, which records the node that ran each piece of work.
DRIVER = """
import json, sys, time
import ray

args = json.loads(sys.argv[1])
ray.init(address=args["address"], namespace="two-nodes", log_to_driver=False)
deadline = time.monotonic() + 120
while len([n for n in ray.nodes() if n["Alive"]]) < 2:
    assert time.monotonic() < deadline, f"the worker node never joined: {ray.nodes()}"
    time.sleep(0.5)
NODES = {
    n["NodeID"]: next(r for r in ("node_a", "node_b") if r in n["Resources"])
    for n in ray.nodes() if n["Alive"]
}


@ray.remote(num_cpus=0)
class Where:
    def __init__(self):
        self.seen = []

    def add(self, key, node):
        self.seen.append([key, node])

    def get(self):
        return self.seen

    def nodes(self, prefix):
        return len({node for key, node in self.seen if key.startswith(prefix)})


where = Where.options(name="where").remote()


def here(key):
    node = ray.get_runtime_context().get_node_id()
    ray.get(ray.get_actor("where", namespace="two-nodes").add.remote(key, node))


def finish(**result):
    seen = ray.get(where.get.remote())
    result["where"] = [[key, NODES[node]] for key, node in seen]
    print("RESULT " + json.dumps(result))
"""


def run_driver(cluster: Cluster, script: str, args: dict, timeout: float) -> dict:
    """Run ``DRIVER + script`` as a fresh Python process connected to the cluster; its result."""
    out = subprocess.run(
        [sys.executable, "-c", DRIVER + script, json.dumps({**args, "address": cluster.address})],
        env=cluster.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, f"{out.stdout[-4000:]}\n{out.stderr[-6000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


TRANSFORM = """
import shutil

from raycompat.cluster.pipelines import RunOptions, runner, transform_version
from raycompat.cluster.pipelines.transform import TransformChunks
from raycompat.store import GalleryStore, VersionInfo
from raycompat.index.version_index import build_version_index, load_version_index


# Each chunk waits (at most 90 s) until parts are being written on both nodes: a busy first
# actor is what makes Ray Data's pool (min_size=1) scale up to its second one, on the other node.
class PlacedTransform(TransformChunks):
    def fill(self, chunk, writer):
        here(chunk.part)
        recorder = ray.get_actor("where", namespace="two-nodes")
        self.deadline = getattr(self, "deadline", time.monotonic() + 90)  # per actor
        while ray.get(recorder.nodes.remote("part-")) < 2 and time.monotonic() < self.deadline:
            time.sleep(0.2)
        super().fill(chunk, writer)


def store():
    return GalleryStore(args["root"], args["storage_options"])


run_chunks = runner.run_chunks


def placed_run(chunks, worker, *rest):
    # The driver has read h and g by now; their folder is gone before any actor starts, as a
    # folder on the driver's node only would be for actors on other nodes.
    shutil.rmtree(args["h"])
    return run_chunks(chunks, PlacedTransform, *rest)


runner.run_chunks = placed_run
result = transform_version(
    store(), args["gallery"], "v1", VersionInfo(**args["target"]), args["h"], args["g"],
    RunOptions(**args["run"]),
)


@ray.remote(num_cpus=0, resources={"node_b": 0.01})
def build_index():
    here("index-build")
    return build_version_index(store(), args["gallery"], "v2", use_gpu=False)


@ray.remote(num_cpus=0, resources={"node_a": 0.01})
def search(ids):
    here("index-search")
    gallery = store()
    table = gallery.read(args["gallery"], "v2")
    rows = [table["id"].to_pylist().index(i) for i in ids]
    queries = table["embedding"].combine_chunks().flatten().to_numpy()
    queries = queries.reshape(table.num_rows, -1)[rows]
    return load_version_index(gallery, args["gallery"], "v2", use_gpu=False).search(queries, 1)[1]


build = ray.get(build_index.remote())
found = ray.get(search.remote(args["queries"]))
finish(rows_written=result["rows_written"], index=build, found=found[:, 0].tolist())
"""


def test_transform_actors_on_both_nodes_publish_on_s3(two_nodes, s3_bucket, tmp_path):
    bucket, options = s3_bucket
    root = f"s3://{bucket}/stores/main"
    store = make_source(root, "g", rows=4_000, files=4, group_rows=1_000, storage_options=options)
    source = store.version("g", "v1")
    h_dir, g_dir = random_models(tmp_path)  # one folder for both; the driver deletes it
    queries = [1, 3 * 1_999 + 1, 3 * 3_999 + 1]
    started = time.monotonic()
    result = run_driver(
        two_nodes,
        TRANSFORM,
        {
            "root": root,
            "storage_options": options,
            "gallery": "g",
            "target": dataclasses.asdict(target()),
            "h": h_dir,
            "g": g_dir,
            # 2 CPUs per actor: the two actors cannot share a 2-CPU node
            "run": {"actors": 2, "rows_per_file": 1_000, "threads_per_actor": NODE_CPUS},
            "queries": queries,
        },
        timeout=300,
    )
    elapsed = time.monotonic() - started

    where = dict(result["where"])
    parts = {key: node for key, node in where.items() if key.startswith("part-")}
    assert sorted(parts) == [f"part-{i:05d}-0000.parquet" for i in range(4)]
    assert set(parts.values()) == {"node_a", "node_b"}, parts  # writers on both nodes
    assert where["index-build"] == "node_b" and where["index-search"] == "node_a"
    assert result["rows_written"] == 4_000
    assert not os.path.exists(h_dir)  # the actors built h and g without their folder

    reader = GalleryStore(root, options)  # a fresh reader, through S3 only
    published = reader.version("g", "v2")
    assert source.ids and published.rows == 4_000 and published.ids == source.ids
    assert len(published.files) == 4
    out = reader.read("g", "v2")
    assert sorted(out["id"].to_pylist()) == sorted(reader.read("g", "v1")["id"].to_pylist())
    assert result["index"].startswith(f"s3://{bucket}/stores/main/g/_index/v2/")
    assert result["found"] == queries  # each query's nearest neighbour is itself
    print(f"two-node transform + index in {elapsed:.0f} s, parts by node: {parts}")


TRAIN = """
import ray.train

from raycompat.config import load_config
from raycompat.cluster.train import driver
from raycompat.config.train import TrainConfig
from raycompat.cluster.train.loop import train_loop_per_worker


def placed_loop(config):
    here(f"rank{ray.train.get_context().get_world_rank()}")
    train_loop_per_worker(config)


driver.train_loop_per_worker = placed_loop
result = driver.run_training(load_config(TrainConfig, None, args["overrides"]))
finish(run_path=result.run_path, checkpoint=result.checkpoints["step_1"].path)
"""


def test_two_training_workers_on_different_nodes_checkpoint_to_s3(two_nodes, s3_server, s3_bucket):
    bucket, options = s3_bucket
    overrides = [
        *TOY,
        "scenario.tasks=[6]",
        "epochs=1",
        "scaling.num_workers=2",
        # One CPU each would fit both on one node: only the placement strategy spreads them.
        "scaling.cpus_per_worker=1",
        "scaling.placement_strategy=STRICT_SPREAD",
        f"run.storage_path=s3://{bucket}/runs",
        f"run.endpoint_url={s3_server}",
        "run.name=two-nodes",
    ]
    started = time.monotonic()
    result = run_driver(two_nodes, TRAIN, {"overrides": overrides}, timeout=300)
    elapsed = time.monotonic() - started

    ranks = dict(result["where"])
    assert sorted(ranks) == ["rank0", "rank1"] and ranks["rank0"] != ranks["rank1"], ranks
    assert result["run_path"] == f"{bucket}/runs/two-nodes"
    fs = s3fs.S3FileSystem(**options)
    checkpoint = result["checkpoint"]
    assert checkpoint.startswith(f"{bucket}/runs/two-nodes/")
    stored = {path.rsplit("/", 1)[1] for path in fs.find(checkpoint)}
    # every rank uploads its own file into the same checkpoint, from its own node
    assert {"rows_rank0.npy", "rows_rank1.npy", "metrics.json"} <= stored, stored
    for name in ("state.json", "compatibility.json", "summary.json", "config.yaml"):
        assert fs.exists(f"{result['run_path']}/{name}"), name
    print(f"two-node training in {elapsed:.0f} s, ranks by node: {ranks}")
