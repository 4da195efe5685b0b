"""Shared fixtures: a real S3 endpoint served by moto's standalone server.

As in s3fs's own test suite, ``moto.server`` runs as a separate process (so requests go through
real HTTP, aiobotocore and s3fs exactly as against a cloud bucket), bound to 127.0.0.1 on a free
port. Fake credentials are put in the environment for the session and restored afterwards; a
local ``~/.aws`` and instance-metadata lookups are kept out.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest

FAKE_AWS_ENV = {
    # Distinctive values, so that a test can grep every output and log for them.
    "AWS_ACCESS_KEY_ID": "AKIARAYCOMPATFAKE0001",
    "AWS_SECRET_ACCESS_KEY": "raycompat/fake+secret/0123456789abcdef",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/raycompat-test-aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/raycompat-test-aws-credentials",
    "AWS_EC2_METADATA_DISABLED": "true",
}
# Ray Train's controller polls its workers every 2 s by default, so every training run of the
# suite (dozens) waits up to 2 s at each start, end and failure for nothing. Every Ray process
# the tests start (the session's runtime, `ray start --head`, submitted jobs) inherits this.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
# Each run also starts a preemption-watcher actor (one more process importing Ray, for spot
# instances being reclaimed), which no test exercises.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

UNSET_AWS_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_S3")


def bucket_objects(fs, bucket: str) -> dict[str, bytes]:
    """Every object of ``bucket`` as ``path -> bytes`` (zero-byte "directory" markers skipped);
    what the planted-credential tests grep."""
    blobs = {}
    for path in fs.find(bucket):
        try:
            blobs[path] = fs.cat(path)
        except FileNotFoundError:
            continue
    return blobs


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means the server is up
    except OSError:
        return False


def _moto_api(endpoint: str, path: str, body: bytes) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/{path}", data=body, method="POST",
                                     headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request, timeout=10):
        pass


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """Endpoint URL (``http://127.0.0.1:<port>``) of a moto S3 server running for the session."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in FAKE_AWS_ENV.items():
            mp.setenv(name, value)
        for name in UNSET_AWS_ENV:
            mp.delenv(name, raising=False)
        for name in ("NO_PROXY", "no_proxy"):  # never send the local endpoint through a proxy
            mp.setenv(name, ",".join(filter(None, ["127.0.0.1,localhost", os.environ.get(name)])))
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log, stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 60
            while not _answers(f"{endpoint}/moto-api/"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"moto server on {endpoint} did not start; log:\n{log_path.read_text()}"
                    )
                time.sleep(0.1)
            yield endpoint
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh, empty bucket: yields ``(bucket_name, storage_options)`` for s3fs / fsspec."""
    import s3fs

    storage_options = {"client_kwargs": {"endpoint_url": s3_server}}
    bucket = f"raycompat-test-{uuid.uuid4().hex[:12]}"
    fs = s3fs.S3FileSystem(**storage_options)
    fs.mkdir(bucket)
    yield bucket, storage_options
    try:
        fs.rm(bucket, recursive=True)
    except OSError:
        pass  # a test may have left the server refusing the fake credentials


@pytest.fixture
def s3_strict_auth(s3_server):
    """Turn on IAM authentication in the moto server for one test.

    Yields ``{"key": ..., "secret": ...}`` of an IAM user allowed ``s3:*``; any other credentials
    (including the session's fake ones) are refused with 403 until the test ends.
    """
    import boto3

    iam = boto3.client("iam", endpoint_url=s3_server, region_name="us-east-1")
    user = f"reader-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="s3-all", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
    }))
    access = iam.create_access_key(UserName=user)["AccessKey"]
    _moto_api(s3_server, "reset-auth", b"0")
    try:
        yield {"key": access["AccessKeyId"], "secret": access["SecretAccessKey"]}
    finally:
        _moto_api(s3_server, "reset-auth", b"inf")


@pytest.fixture(scope="session")
def ray_local(s3_server):
    """A real local Ray runtime for the session: 4 logical CPUs on the 2-core CI machine, so that
    2 training workers (1 CPU each) leave room for Ray Data's decode actors.

    Ray starts after the S3 server fixture has put the fake credentials in the environment, so
    every Ray process inherits them as a cluster node inherits its instance role; nothing passes
    them through Ray's runtime environment (which Ray records).
    """
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def demo_stores(ray_local, tmp_path_factory):
    """The stores ``make demo`` and its documented backfill leave (``tests/demo_store.py``),
    written once per session by the demo's job: tests copy the one they use."""
    from tests.demo_store import write_demo_stores

    return write_demo_stores(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_history(ray_local, tmp_path_factory):
    """``(root, summary)``: the upgrade job's tiny history (m1 initial, m2 refused;
    ``tests/cluster/upgrade/test_job.py``'s ``tiny_config``) run once per session into
    ``root/a``. Tests copy ``root/a`` (with its config written again for the copy) or rerun it
    unchanged (nothing new is published)."""
    from tests.cluster.upgrade.test_job import tiny_run

    root = tmp_path_factory.mktemp("tiny")
    return root, tiny_run(root / "a")


@pytest.fixture
def one_faiss_thread():
    """faiss on one OpenMP thread for the test (deterministic sums; no oversubscription of the
    2-core CI machine); the previous count is restored afterwards."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """``(root, storage_options)`` of an empty store, on local disk or the moto S3 server."""
    if request.param == "local":
        return str(tmp_path / "store"), {}
    bucket, options = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/store", options


def store_with_v1(tmp_path):
    """A store holding gallery ``mnist`` with one tiny published version ``v1`` of model m1."""
    import numpy as np

    from raycompat.store import GalleryStore, VersionInfo, embedding_table

    store = GalleryStore(str(tmp_path / "store"))
    staging = store.begin("mnist", VersionInfo("v1", "m1", 9, False, "v1 = extract(m1)"))
    staging.write_table(embedding_table(np.arange(4), np.ones((4, 9), np.float32)), "p.parquet")
    staging.commit()
    return store


class SessionLogs:
    """What Ray's session folder gained while a test ran: files created since, and the bytes
    appended since to files that existed (Ray's logs are appended to for the whole session).

    The credential tests scan what their own job made Ray write. Earlier tests' lines stay out:
    a Tune sweep run before them logs the credentials Ray Tune copies from the environment into
    every trainable's runtime environment (``ray.tune.execution.class_cache``), which is Ray's
    behaviour with environment credentials (docs/tune.md, "Credentials"), not this job's.
    """

    def __init__(self, ray) -> None:
        from pathlib import Path

        self.root = Path(ray._private.worker._global_node.get_session_dir_path())
        self.sizes = {p: p.stat().st_size for p in self.root.rglob("*") if p.is_file()}

    def written(self, limit: int = 50_000_000) -> dict[str, bytes]:
        blobs = {}
        for path in self.root.rglob("*"):
            if path.is_file() and path.stat().st_size < limit:
                with open(path, "rb") as handle:
                    handle.seek(self.sizes.get(path, 0))
                    blobs[str(path)] = handle.read()
        return blobs
