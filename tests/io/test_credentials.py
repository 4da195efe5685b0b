"""Secrets never leave memory: ``redact`` on configs, ``scrub`` on text and log records, private
report files, and the planted-secret grep over everything the transform job writes.

The upgrade job's grep extends ``test_security.py``'s end-to-end run, the sweep's the S3 sweep of
``test_tune.py``, so no job runs twice for this.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from raycompat.config import dump_config, load_config, save_config, to_dict
from raycompat.config.pipelines import StoreSpec, TransformJobConfig
from raycompat.config.train import TrainConfig
from raycompat.config.upgrade import UpgradeConfig
from raycompat.io import credentials
from raycompat.io.credentials import (
    REDACTED,
    ScrubSecrets,
    configure_logging,
    drop_redacted,
    is_secret_key,
    redact,
    register_secrets,
    scrub,
    write_private,
)
from tests.conftest import FAKE_AWS_ENV, SessionLogs, bucket_objects

ROOT = Path(__file__).resolve().parents[2]
KEY, SECRET = FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"], FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"]


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Each test starts with no registered secret and leaves the process registry as it was."""
    monkeypatch.setattr(credentials, "_secrets", set())


def planted(endpoint: str = "http://127.0.0.1:9") -> dict:
    """s3fs options carrying the conftest credentials, as a user's config would."""
    return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}


def leaks(blobs: dict[str, bytes]) -> list[str]:
    return [name for name, data in blobs.items() if KEY.encode() in data or SECRET.encode() in data]


# ---- redact ------------------------------------------------------------------------------------


def test_redact_nested_case_insensitive_and_keeps_the_rest():
    options = {
        "key": KEY,
        "secret": SECRET,
        "anon": False,
        "client_kwargs": {
            "endpoint_url": "http://minio:9000",
            "region_name": "eu-west-1",
            "AWS_Session_Token": "tok-123456",
        },
        "config_kwargs": {"s3": {"addressing_style": "path"}, "proxy_password": "hunter22"},
        "profiles": [{"aws_secret_access_key": "abcd1234", "name": "a"}, "plain"],
        "MyCredentialFile": "/home/me/.aws/credentials",
        "token": None,
        "password": "",
    }
    before = copy.deepcopy(options)
    out = redact(options)
    assert options == before  # not mutated
    assert out == {
        "key": REDACTED,
        "secret": REDACTED,
        "anon": False,
        "client_kwargs": {
            "endpoint_url": "http://minio:9000",
            "region_name": "eu-west-1",
            "AWS_Session_Token": REDACTED,
        },
        "config_kwargs": {"s3": {"addressing_style": "path"}, "proxy_password": REDACTED},
        "profiles": [{"aws_secret_access_key": REDACTED, "name": "a"}, "plain"],
        "MyCredentialFile": REDACTED,
        "token": None,  # empty values hide nothing and still mean "not given"
        "password": "",
    }


def test_a_key_naming_where_a_secret_is_kept_is_not_one():
    """``service.token_file`` is a path, named in the deploy job's errors; the token is not."""
    assert is_secret_key("token") and is_secret_key("AWS_SESSION_TOKEN")
    assert not is_secret_key("token_file") and not is_secret_key("credentials_path")
    assert redact({"token_file": "/etc/t", "token": "abc"}) == {
        "token_file": "/etc/t", "token": REDACTED,
    }  # fmt: skip


def test_redact_dataclass_configs_and_dump_config():
    cfg = load_config(UpgradeConfig, None, [])
    cfg.store = StoreSpec(root="s3://b/store", gallery="g", storage_options=planted())
    out = redact(cfg)
    assert out["store"]["storage_options"]["secret"] == REDACTED
    assert out["store"]["storage_options"]["client_kwargs"]["endpoint_url"].startswith("http")
    assert cfg.store.storage_options["secret"] == SECRET  # the config itself keeps it
    text = dump_config(cfg)
    assert SECRET not in text and KEY not in text and REDACTED in text
    assert yaml.safe_load(text)["training"] == redact(cfg.training)


def test_no_field_of_a_written_config_looks_like_a_credential():
    """Every config a job writes (its defaults and each one under configs/) comes back from
    ``redact`` unchanged: a field named like a credential (``*token*``) would be written as
    ``<redacted>`` and the written config would no longer be the one that ran."""
    from raycompat.cli.demo import DemoConfig

    written = {
        "python jobs/train.py": TrainConfig,
        "python jobs/upgrade.py": UpgradeConfig,
        "python jobs/transform.py": TransformJobConfig,
        "python -m raycompat.cli.demo": DemoConfig,
    }
    configs = [(cls, None) for cls in written.values()]
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        configs += [(cls, path) for command, cls in written.items() if command in first]
    assert len(configs) > len(written) + 5
    for cls, path in configs:
        cfg = load_config(cls, path)
        assert redact(cfg) == to_dict(cfg), path


def test_a_written_config_reruns_with_credentials_from_the_environment(s3_bucket, tmp_path):
    """``<redacted>`` entries are dropped where options are used: the store then authenticates
    with the environment's credentials (here conftest's fake ones)."""
    from raycompat.store import GalleryStore

    bucket, options = s3_bucket
    path = tmp_path / "config.yaml"
    endpoint = options["client_kwargs"]["endpoint_url"]
    cfg = TransformJobConfig(store=StoreSpec(f"s3://{bucket}/s", "g", planted(endpoint)))
    save_config(cfg, path)
    rerun = load_config(TransformJobConfig, path)
    assert rerun.store.storage_options["key"] == REDACTED
    store = GalleryStore(rerun.store.root, rerun.store.storage_options)
    assert store.storage_options == {"client_kwargs": options["client_kwargs"]}
    assert store.galleries() == []  # it reaches the bucket
    assert drop_redacted({"a": {"token": REDACTED, "b": 1}}) == {"a": {"b": 1}}


# ---- scrub and the log filter ----------------------------------------------------------------


def test_scrub_registered_values_only_and_long_enough():
    register_secrets({"client_kwargs": {"aws_secret_access_key": SECRET}, "key": KEY})
    register_secrets({"token": "abc", "endpoint_url": "http://x", "secret": REDACTED})
    text = f"failed with key={KEY} secret={SECRET!r} abc http://x"
    assert scrub(text) == f"failed with key={REDACTED} secret='{REDACTED}' abc http://x"
    assert scrub(ValueError(SECRET)) == REDACTED


def test_log_filter_scrubs_message_arguments_and_traceback():
    register_secrets(planted())
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ScrubSecrets())
    logger = logging.getLogger("raycompat.test_secrets")
    logger.addHandler(handler)
    try:
        logger.warning(f"options {planted()}")
        logger.warning("options %s and %r", planted(), SECRET)
        try:
            raise PermissionError(f"denied for {KEY}")
        except PermissionError:
            logger.exception("open failed")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert KEY not in out and SECRET not in out
    assert out.count(REDACTED) >= 5 and "PermissionError: denied for <redacted>" in out


def test_configure_logging_guards_root_handlers_and_uncaught_errors(monkeypatch, capsys, caplog):
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    caplog.set_level(logging.INFO)
    configure_logging()
    assert all(
        any(isinstance(f, ScrubSecrets) for f in h.filters) for h in logging.getLogger().handlers
    )
    logging.getLogger("raycompat.jobs.x").info("env secret %s", SECRET)
    assert SECRET not in caplog.text and REDACTED in caplog.text
    try:
        raise RuntimeError(f"boom {SECRET}")
    except RuntimeError:
        sys.excepthook(*sys.exc_info())
    err = capsys.readouterr().err
    assert "RuntimeError: boom <redacted>" in err and SECRET not in err


def test_cli_error_message_is_scrubbed(monkeypatch, capsys):
    from raycompat.cli import app as cli
    from raycompat.errors import StoreError

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    register_secrets(planted())

    def fail(args):
        raise StoreError(f"cannot open store with {planted()}")

    monkeypatch.setitem(cli.COMMANDS, "models", fail)
    assert cli.main(["models", "--store", "s3://b/s"]) == 1
    err = capsys.readouterr().err
    assert "raycompat: error: cannot open store" in err and SECRET not in err and KEY not in err


# ---- private files ---------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_private_is_atomic_and_0600(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("old")
    os.chmod(path, 0o644)
    write_private(path, "new")
    assert path.read_text() == "new" and mode(path) == 0o600
    write_private(tmp_path / "b.bin", b"\x00\x01")
    assert mode(tmp_path / "b.bin") == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "report.json"]  # no temp
    save_config(TrainConfig(), tmp_path / "config.yaml", header="# Run: x\n")
    assert mode(tmp_path / "config.yaml") == 0o600
    assert (tmp_path / "config.yaml").read_text().startswith("# Run: x\nmethod: cores\n")


# ---- the planted-secret grep: the transform job on S3 ---------------------------------------


@pytest.mark.ray
@pytest.mark.slow
def test_transform_job_on_s3_writes_and_logs_no_credential(
    ray_local, s3_server, s3_bucket, tmp_path, capfd, caplog
):
    """The transform job with the credentials in ``store.storage_options`` (not only in the
    environment): no object in the bucket, no local file and no line of its output holds them."""
    import importlib.util

    import s3fs
    import torch

    from raycompat.store import GalleryStore, VersionInfo, embedding_table
    from raycompat.transformations import FCTTransformation, save_transformation

    caplog.set_level(logging.INFO)
    session = SessionLogs(ray_local)
    bucket, options = s3_bucket
    secret_options = planted(s3_server)
    store = GalleryStore(f"s3://{bucket}/store", secret_options)
    staging = store.begin("g", VersionInfo("v1", "m1", 8, False, "v1 = extract(m1)"))
    rng = np.random.default_rng(0)
    staging.write_table(embedding_table(np.arange(300), rng.normal(size=(300, 8))), "p-0.parquet")
    staging.commit(expected_rows=300)
    torch.manual_seed(0)
    save_transformation(tmp_path / "fct", FCTTransformation(8, 0, 4, width=16), "h")

    spec = importlib.util.spec_from_file_location("transform_job", ROOT / "jobs" / "transform.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"store": {"storage_options": secret_options}}))
    summary = job.main(
        [
            "--config",
            str(config),
            f"store.root=s3://{bucket}/store",
            "store.gallery=g",
            "source_version=v1",
            f"transformation={tmp_path / 'fct'}",
            "target.version=v2",
            "target.model_version=m2",
            "target.width=4",
            "run={rows_per_file: 200, actors: 1}",
        ]
    )
    assert (summary["version"], summary["rows"]) == ("v2", 300)
    logging.getLogger("raycompat.jobs.transform").info("store options: %s", secret_options)

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    blobs = bucket_objects(fs, bucket)
    assert any("/_versions/v2" in p for p in blobs) and len(blobs) >= 4
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != config:  # the user's own input holds them, of course
            blobs[str(path)] = path.read_bytes()
    blobs |= session.written()  # what Ray's own logs gained during the job, the workers' included
    out, err = capfd.readouterr()
    blobs |= {"stdout": out.encode(), "stderr": err.encode(), "log": caplog.text.encode()}
    assert not leaks(blobs), f"credentials found in {leaks(blobs)[:5]}"
    assert REDACTED in caplog.text  # the filter was on: the planted line came out scrubbed


def test_the_tune_tradeoff_plot_is_private_under_an_open_umask(tmp_path):
    """Every report picture goes through save_private_figure: the sweep's tradeoff.png too."""
    import pandas as pd

    from raycompat.cluster.tune.results import plot_tradeoff

    table = pd.DataFrame({"AC": [0.5, 1.0], "AA": [60.0, 70.0], "trial": ["t_00001", "t_00002"]})
    before = os.umask(0o022)
    try:
        plot_tradeoff(table, tmp_path / "tradeoff.png")
    finally:
        os.umask(before)
    path = tmp_path / "tradeoff.png"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes()[:4] == b"\x89PNG"
