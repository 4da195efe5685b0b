"""cluster.yaml, checked offline with the pinned Ray's own cluster-launcher code.

The Ray functions used here are internal (``ray.autoscaler._private``): ``prepare_config`` and
``validate_config`` (what ``ray up`` runs before it touches the cloud), the autoscaler's
bin-packing (``get_bin_pack_residual`` / ``get_nodes_for``, what it runs to choose nodes) and the
AWS provider's default security-group rule. They are read against ray==2.58.0, the version
pinned in pyproject.toml: the Ray pin matters, and a Ray upgrade must re-check these tests.
Nothing here calls AWS: ``bootstrap_aws`` (IAM, subnets, security groups, AMIs) is never run.
"""

from __future__ import annotations

import functools
import math
import os
import re
import secrets
import select
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
from ray.autoscaler._private.resource_demand_scheduler import (
    _default_utilization_scorer,
    get_bin_pack_residual,
    get_nodes_for,
)
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_YAML = ROOT / "cluster.yaml"
RAY_PIN = "2.58.0"
WORLD = {"0.0.0.0/0", "::/0"}


def _raw() -> dict:
    assert ray.__version__ == RAY_PIN, (
        f"these checks read Ray {RAY_PIN} internals but Ray {ray.__version__} is installed; "
        "re-read ray/autoscaler/_private before updating RAY_PIN"
    )
    return yaml.safe_load(CLUSTER_YAML.read_text())


@pytest.fixture(scope="module")
def prepared() -> dict:
    """cluster.yaml merged with Ray's AWS defaults, exactly as ``ray up`` prepares it."""
    config = prepare_config(_raw())
    validate_config(config)
    return config


# ---------------------------------------------------------------- schema


def test_validates_with_rays_own_schema(prepared):
    assert prepared["head_node_type"] == "head"
    assert set(prepared["available_node_types"]) == {"head", "gpu_worker", "cpu_worker"}
    per_type = sum(t["max_workers"] for t in prepared["available_node_types"].values())
    assert per_type == prepared["max_workers"] == 12


def _misspell_resources(config):
    gpu = config["available_node_types"]["gpu_worker"]
    gpu["resource"] = gpu.pop("resources")


def _min_above_max(config):
    config["available_node_types"]["gpu_worker"]["min_workers"] = 4
    config["max_workers"] = 3


@pytest.mark.parametrize(
    "break_it, error",
    [
        (_misspell_resources, jsonschema.ValidationError),
        (
            lambda c: c["available_node_types"]["cpu_worker"]["resources"].update(CPU=-1),
            jsonschema.ValidationError,
        ),
        (lambda c: c.update(dashboard_host="127.0.0.1"), jsonschema.ValidationError),
        (lambda c: c.update(head_node_type="nowhere"), ValueError),
        (_min_above_max, ValueError),
    ],
    ids=[
        "misspelt-resources",
        "negative-cpu",
        "unknown-top-level-key",
        "unknown-head-type",
        "min-workers-above-max",
    ],
)
def test_validation_catches_broken_configs(break_it, error):
    config = _raw()
    break_it(config)
    with pytest.raises(error):
        validate_config(prepare_config(config))


# ---------------------------------------------------------------- resources our jobs request


def _plan(prepared: dict, demands: list[dict]) -> tuple[dict, list[dict]]:
    """Nodes the autoscaler would add for ``demands`` with only the head running.

    Steps 4-5 of Ray's ``ResourceDemandScheduler.get_nodes_to_launch``: bin-pack onto the
    running head first, then choose new nodes for the rest within the per-type limits.
    """
    node_types = prepared["available_node_types"]
    head = prepared["head_node_type"]
    left, _ = get_bin_pack_residual([dict(node_types[head]["resources"])], demands)
    scorer = functools.partial(
        _default_utilization_scorer, node_availability_summary=NodeAvailabilitySummary({})
    )
    to_add, unfulfilled = get_nodes_for(
        node_types, {head: 1}, head, prepared["max_workers"], left, utilization_scorer=scorer
    )
    return dict(to_add), unfulfilled


def test_head_gets_no_work(prepared):
    head = prepared["available_node_types"]["head"]
    assert head["resources"] == {"CPU": 0} and head["max_workers"] == 0
    tiny = [{"CPU": 0.01}]
    assert get_bin_pack_residual([dict(head["resources"])], tiny)[0] == tiny
    to_add, unfulfilled = _plan(prepared, tiny)
    assert to_add == {"cpu_worker": 1} and unfulfilled == []


@pytest.mark.parametrize("workers, cpus_per_worker", [(8, 8), (16, 8), (32, 2), (16, 11)])
def test_training_run_lands_on_gpu_nodes(prepared, workers, cpus_per_worker):
    """``scaling.num_workers`` x {GPU: 1, CPU: cpus_per_worker}, plus the trainer's {CPU: 1}.

    By hand: GPUs bind first (8 per p4d node) and 8 workers x at most 11 CPUs + 1 <= 96 CPUs,
    so ``workers`` take ceil(workers / 8) nodes: 8 -> 1, 16 -> 2, 32 -> 4 (the limit).
    """
    demands = [{"GPU": 1, "CPU": cpus_per_worker}] * workers + [{"CPU": 1}]
    to_add, unfulfilled = _plan(prepared, demands)
    assert unfulfilled == []
    assert to_add == {"gpu_worker": math.ceil(workers / 8)}


def test_training_beyond_the_limits_is_left_unfulfilled(prepared):
    # 4 nodes x 8 GPUs = 32: a 33rd GPU worker has nowhere to go.
    to_add, unfulfilled = _plan(prepared, [{"GPU": 1, "CPU": 8}] * 33)
    assert to_add == {"gpu_worker": 4} and unfulfilled == [{"GPU": 1, "CPU": 8}]
    # One worker cannot ask for more GPUs than a node has.
    assert _plan(prepared, [{"GPU": 9}]) == ({}, [{"GPU": 9}])


def test_data_decode_stage_lands_on_cpu_nodes(prepared):
    """A Ray Data stage of 48 CPU decode actors x {CPU: 4} = 192 CPUs = 3 c6i nodes of 64.

    Ray conserves GPU nodes (AUTOSCALER_CONSERVE_GPU_NODES) so none is started for CPU work.
    """
    to_add, unfulfilled = _plan(prepared, [{"CPU": 4}] * 48)
    assert to_add == {"cpu_worker": 3} and unfulfilled == []


def test_data_stage_with_gpu_embedding_actors(prepared):
    """Decode on CPU nodes, embed with 8 x {GPU: 1, CPU: 4} actors on one GPU node."""
    demands = [{"CPU": 4}] * 16 + [{"GPU": 1, "CPU": 4}] * 8
    to_add, unfulfilled = _plan(prepared, demands)
    assert unfulfilled == []
    # 8 embedders use 32 of the GPU node's 96 CPUs; the 16 decoders (64 CPUs) fit beside them.
    assert to_add == {"gpu_worker": 1}


# ---------------------------------------------------------------- network exposure


def _ray_start(commands: list[str]) -> tuple[dict[str, str], list[str]]:
    """(exported environment, argv) of the ``ray start`` command in a start-command list."""
    (command,) = [c for c in commands if "ray start" in c]
    env, argv = {}, []
    for part in command.split(";"):
        words = shlex.split(part)
        if words[:1] == ["export"]:
            env.update(word.split("=", 1) for word in words[1:])
        elif words[:2] == ["ray", "start"]:
            argv = words
    return env, argv


def _flag(argv: list[str], name: str) -> str | None:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    return values[-1] if values else None


def _docker_env(config: dict) -> dict[str, str]:
    options = config["docker"]["run_options"]
    return dict(o.split("=", 2)[1:] for o in options if o.startswith("--env="))


def test_dashboard_binds_to_localhost_and_token_auth_is_on(prepared):
    env, argv = _ray_start(prepared["head_start_ray_commands"])
    assert "--head" in argv
    assert _flag(argv, "--dashboard-host") == "127.0.0.1"
    container_env = _docker_env(prepared)
    for where in (env, container_env):
        assert where["RAY_AUTH_MODE"] == "token"
        assert where["RAY_AUTH_TOKEN_PATH"] == "/home/ray/raycompat-auth/auth_token"
    worker_env, worker_argv = _ray_start(prepared["worker_start_ray_commands"])
    assert worker_env == env and _flag(worker_argv, "--address") == "$RAY_HEAD_IP:6379"
    # The token file's folder is mounted on every node from the admin's machine.
    token_dir = str(Path(env["RAY_AUTH_TOKEN_PATH"]).parent)
    assert prepared["file_mounts"][token_dir] == "~/.raycompat/cluster-auth"
    everything = yaml.safe_dump(prepared)
    assert "0.0.0.0" not in everything


def test_without_our_start_commands_ray_would_expose_the_dashboard():
    """Why cluster.yaml overrides the head start command: Ray's AWS defaults bind 0.0.0.0."""
    config = _raw()
    del config["head_start_ray_commands"]
    _, argv = _ray_start(prepare_config(config)["head_start_ray_commands"])
    assert _flag(argv, "--dashboard-host") == "0.0.0.0"


def _world_open(permissions: list[dict]) -> list[dict]:
    """Ingress rules (EC2 IpPermissions) open to the whole internet."""

    def cidrs(rule: dict) -> set[str]:
        return {r.get("CidrIp") for r in rule.get("IpRanges", [])} | {
            r.get("CidrIpv6") for r in rule.get("Ipv6Ranges", [])
        }

    return [rule for rule in permissions if cidrs(rule) & WORLD]


def _walk(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    for child in children:
        yield from _walk(child)


def test_no_ingress_rule_is_open_to_the_world(prepared):
    from ray.autoscaler._private.aws.config import _create_default_ssh_inbound_rules

    # Ray's own default group opens SSH to 0.0.0.0/0 (the detector sees it) ...
    assert _world_open(_create_default_ssh_inbound_rules())
    assert _world_open([{"FromPort": 8265, "ToPort": 8265, "Ipv6Ranges": [{"CidrIpv6": "::/0"}]}])
    # ... so every node type names our pre-made group and Ray never creates its default one.
    for name, node_type in prepared["available_node_types"].items():
        assert node_type["node_config"]["SecurityGroupIds"], name
    rules = [
        n["IpPermissions"] for n in _walk(prepared) if isinstance(n, dict) and "IpPermissions" in n
    ]
    assert all(not _world_open(r) for r in rules)


def test_documented_security_group_admits_only_admin_ssh():
    """docs/cluster.md creates the group: --cidr rules only for port 22, never the world."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    commands = [
        shlex.split(line.strip())
        for line in text.splitlines()
        if "authorize-security-group-ingress" in line
    ]
    assert len(commands) >= 2
    for words in commands:
        cidrs = [words[i + 1] for i, w in enumerate(words) if w in ("--cidr", "--cidr-ipv6")]
        assert cidrs or "--source-group" in words, words
        assert not set(cidrs) & WORLD, words
        if cidrs:  # addresses outside the group reach SSH and nothing else (not 6379/8265/10001)
            assert words[words.index("--port") + 1] == "22", words


# ---------------------------------------------------------------- credentials

KEY_LIKE = [
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # access key ids
    # a credential variable or storage_options entry given a value
    re.compile(r"(?:aws_secret_access_key|aws_access_key_id|aws_session_token)\s*[:=]\s*\S", re.I),
    re.compile(r"^\s*[\"']?secret[\"']?\s*:\s*\S", re.M),
]
SECRET_SHAPE = re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")


def _key_like(text: str) -> list[str]:
    hits = [m.group(0) for pattern in KEY_LIKE for m in pattern.finditer(text)]
    # 40 characters of mixed-case base64, like a secret access key (a hex digest is not).
    shaped = (m.group(0) for m in SECRET_SHAPE.finditer(text))
    return hits + [w for w in shaped if w != w.lower() and w != w.upper()]


def test_key_detector_finds_planted_keys_only():
    assert _key_like("id: " + "AKIA" + "IOSFODNN7EXAMPLE")
    assert _key_like("env: [AWS_SECRET_ACCESS_KEY=abc]")
    assert _key_like("storage_options: {key: k}\n  secret: s")
    assert _key_like("token " + "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY")
    assert not _key_like("# credentials: AWS_ACCESS_KEY_ID from the environment, never here")
    assert not _key_like("commit: " + "0123456789abcdef" * 2 + "01234567")


def test_no_aws_keys_in_cluster_yaml_or_configs():
    files = [CLUSTER_YAML, *sorted((ROOT / "configs").glob("**/*.yaml"))]
    found = {str(f.relative_to(ROOT)): _key_like(f.read_text()) for f in files}
    assert not {f: hits for f, hits in found.items() if hits}


def test_credentials_come_from_instance_profiles(prepared):
    assert "aws_credentials" not in prepared["provider"]
    assert not any(k.startswith("--env=AWS_") for k in prepared["docker"]["run_options"])
    for name, node_type in prepared["available_node_types"].items():
        node_config = node_type["node_config"]
        assert node_config["IamInstanceProfile"]["Name"].startswith("raycompat-ray-"), name
        # IMDSv2 only: a server-side request forgery cannot read the role's credentials.
        assert node_config["MetadataOptions"]["HttpTokens"] == "required", name


# ---------------------------------------------------------------- storage and placeholders


def test_shared_storage_prefix(prepared):
    assert re.fullmatch(
        r"s3://[A-Za-z0-9_.-]+/raycompat", _docker_env(prepared)["RAYCOMPAT_S3_PREFIX"]
    )


def test_every_placeholder_is_documented():
    placeholders = set(re.findall(r"REPLACE_ME_[A-Z_]+", CLUSTER_YAML.read_text()))
    assert placeholders >= {"REPLACE_ME_BUCKET", "REPLACE_ME_AMI"}
    docs = (ROOT / "docs" / "cluster.md").read_text()
    assert {p for p in placeholders if p not in docs} == set()


# ---------------------------------------------------------------- token authentication, live

_HEAD = """
import sys, ray
ray.init(num_cpus=1, include_dashboard=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes stdin
ray.shutdown()
"""
_CLIENT = """
import sys, ray
try:
    ray.init(address=sys.argv[1])
except ConnectionError:
    sys.exit(3)
print("CPU", ray.cluster_resources()["CPU"])
"""


def _env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    return {**env, **settings}


def _token_file(path: Path) -> str:
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return str(path)


@pytest.mark.ray
@pytest.mark.slow
def test_clusters_token_settings_refuse_clients_without_the_token(prepared, tmp_path):
    """A local Ray started with cluster.yaml's auth environment (the token file moved to
    tmp_path) refuses a client with a wrong token or none, and admits one with the token."""
    auth = {k: v for k, v in _docker_env(prepared).items() if k.startswith("RAY_AUTH")}
    good = _token_file(tmp_path / "auth_token")
    wrong = _token_file(tmp_path / "other_token")
    head = subprocess.Popen(
        [sys.executable, "-c", _HEAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(**{**auth, "RAY_AUTH_TOKEN_PATH": good}),
    )
    try:
        assert select.select([head.stdout], [], [], 120)[0], "local Ray head did not start"
        address = head.stdout.readline().strip()
        assert address, "local Ray head exited early"

        def connect(**settings: str) -> subprocess.CompletedProcess:
            # One connection attempt, not Ray's 20 s of retries, for the refused clients.
            env = _env(RAY_gcs_server_port_wait_time_s="1", **settings)
            return subprocess.run(
                [sys.executable, "-c", _CLIENT, address],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )

        refused = connect(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=wrong)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "Authentication token is missing or incorrect" in refused.stderr
        anonymous = connect()
        assert anonymous.returncode == 3, anonymous.stdout + anonymous.stderr
        admitted = connect(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=good)
        assert admitted.returncode == 0, admitted.stderr
        assert "CPU 1.0" in admitted.stdout
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()


def test_documented_job_commands_use_keys_the_jobs_accept():
    """Every ``ray job submit ... python jobs/<job>.py`` in docs/cluster.md passes overrides that
    the job's config class accepts (a renamed key must not leave the docs behind)."""
    import shlex

    from raycompat.config import load_config
    from raycompat.config.pipelines import TransformJobConfig
    from raycompat.config.tune import SweepConfig
    from raycompat.config.upgrade import UpgradeConfig

    classes = {"upgrade": UpgradeConfig, "tune": SweepConfig, "transform": TransformJobConfig}
    text = (ROOT / "docs" / "cluster.md").read_text().replace("\\\n", " ")
    commands = [line for line in text.splitlines() if line.startswith("ray job submit")]
    assert {c.split("jobs/")[1].split(".py")[0] for c in commands} == set(classes)
    for command in commands:
        words = shlex.split(command)
        job = next(w for w in words if w.startswith("jobs/"))[5:-3]
        overrides = [w for w in words[words.index("--config") + 2 :]]
        assert all("=" in w for w in overrides), command
        load_config(classes[job], None, overrides)  # unknown keys raise ConfigError
