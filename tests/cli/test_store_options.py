"""Every store command takes the jobs' S3 options (``raycompat/cli/store_options.py``,
``add_store_arguments`` and ``storage_options``; issue 37): ``--endpoint-url``, ``--profile``
and ``--storage-options``, or the endpoint of ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``.
Run against the moto S3 server (``s3_server``), in this process: ``main([...])``."""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest

from raycompat.cli.app import main, parser
from raycompat.cli.store_options import StorageOptionsError, storage_options
from raycompat.io import credentials
from raycompat.io.credentials import REDACTED, scrub
from raycompat.io.s3_options import ENDPOINT_ENV
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from tests.cli.test_arguments import walk

S3_FLAGS = {"--endpoint-url", "--profile", "--storage-options"}
DEAD_ENDPOINT = "http://127.0.0.1:9"  # nothing listens on the discard port


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No endpoint from the developer's environment; secrets registered here stay here."""
    for name in (*ENDPOINT_ENV, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(credentials, "_secrets", set())


@pytest.fixture
def s3_store(s3_bucket):
    """``(root, endpoint)`` of a store on the moto server holding gallery mnist, version v1."""
    bucket, options = s3_bucket
    store = GalleryStore(f"s3://{bucket}/store", options)
    staging = store.begin("mnist", VersionInfo("v1", "m1", 9, False, "v1 = extract(m1)"))
    staging.write_table(embedding_table(np.arange(4), np.ones((4, 9), np.float32)), "p.parquet")
    staging.commit()
    return store.uri(), options["client_kwargs"]["endpoint_url"]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def versions_and_gc(capsys, root: str, *flags: str) -> None:
    """``versions`` lists v1 and ``gc --dry-run`` plans (both read the bucket through s3fs
    and pyarrow's native client)."""
    code, out, err = run(capsys, "versions", "mnist", "--store", root, "--json", *flags)
    assert code == 0, err
    assert [v["version"] for v in json.loads(out)["versions"]] == ["v1"]
    code, out, err = run(capsys, "gc", "--store", root, "--dry-run", "--json", *flags)
    assert code == 0, err
    assert json.loads(out)["dry_run"] is True


def test_every_store_command_takes_the_s3_options():
    flags = {
        " ".join(path): {o for a in p._actions for o in a.option_strings}
        for path, p in walk(parser())
    }
    with_store = {path: found for path, found in flags.items() if "--store" in found}
    assert len(with_store) >= 15  # every parser but report and the index group
    assert [path for path, found in with_store.items() if not found >= S3_FLAGS] == []


def test_store_commands_reach_the_endpoint_given_by_flag(s3_store, capsys):
    root, endpoint = s3_store
    versions_and_gc(capsys, root, "--endpoint-url", endpoint)
    options = json.dumps({"client_kwargs": {"endpoint_url": endpoint}})
    versions_and_gc(capsys, root, "--storage-options", options)


def test_store_commands_reach_the_endpoint_of_the_environment(s3_store, capsys, monkeypatch):
    root, endpoint = s3_store
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    versions_and_gc(capsys, root)
    monkeypatch.setenv("AWS_ENDPOINT_URL", DEAD_ENDPOINT)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)  # botocore's order: this one first
    versions_and_gc(capsys, root)


def test_a_profile_gives_the_credentials(s3_store, s3_strict_auth, capsys, tmp_path, monkeypatch):
    """The moto server now refuses the environment's credentials; the profile's are allowed."""
    root, endpoint = s3_store
    path = tmp_path / "credentials"
    path.write_text(
        "[reader]\n"
        f"aws_access_key_id = {s3_strict_auth['key']}\n"
        f"aws_secret_access_key = {s3_strict_auth['secret']}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    argv = ["versions", "mnist", "--store", root, "--json", "--endpoint-url", endpoint]
    code, _, err = run(capsys, *argv)  # not the profile's credentials: one line, exit 1
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert re.search("ACCESS_DENIED|Forbidden|denied", err) and "storage error" in err
    code, out, err = run(capsys, *argv, "--profile", "reader")
    assert code == 0, err
    assert [v["version"] for v in json.loads(out)["versions"]] == ["v1"]


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"secret": "s3cr3t-in-bad-json", "key": ', "is not valid JSON"),
        ('"s3cr3t-as-a-string"', "must be a JSON object of s3fs options, got a string"),
        ("[1, 2]", "must be a JSON object of s3fs options, got an array"),
    ],
)
def test_bad_storage_options_are_one_line_exit_2(s3_store, capsys, text, message):
    root, _ = s3_store
    code, out, err = run(capsys, "gc", "--store", root, "--dry-run", "--storage-options", text)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("raycompat: error: --storage-options ")
    assert message in err and "s3cr3t" not in err


def test_credentials_in_storage_options_are_scrubbed(s3_store, capsys):
    root, endpoint = s3_store
    key, secret = "AKIAOPTIONSKEY000042", "options/secret+value/42"  # not the environment's
    options = json.dumps(
        {"key": key, "secret": secret, "client_kwargs": {"endpoint_url": endpoint}}
    )
    argv = ["versions", "nope", "--store", root, "--storage-options", options, "--verbose"]
    code, out, err = run(capsys, *argv)
    assert code == 1 and "nope" in err  # an unknown gallery, found through these options
    assert key not in out + err and secret not in out + err
    assert scrub(f"{key} {secret}") == f"{REDACTED} {REDACTED}"


def _args(**flags) -> argparse.Namespace:
    return argparse.Namespace(
        **{"endpoint_url": None, "profile": None, "storage_options": None, **flags}
    )


def test_flags_merge_into_storage_options_and_a_local_store_ignores_them(tmp_path):
    region = {"client_kwargs": {"region_name": "eu-west-1"}, "anon": True}
    args = _args(endpoint_url="http://e:1", profile="p", storage_options=json.dumps(region))
    assert storage_options(args, "s3://b/store") == {
        "client_kwargs": {"region_name": "eu-west-1", "endpoint_url": "http://e:1"},
        "anon": True,
        "profile": "p",
    }
    assert storage_options(args, str(tmp_path)) == {}
    same = _args(endpoint_url="http://e:1", storage_options='{"endpoint_url": "http://e:1"}')
    assert storage_options(same, "s3://b") == {
        "endpoint_url": "http://e:1",
        "client_kwargs": {"endpoint_url": "http://e:1"},
    }
    for flag, key in (("endpoint_url", "endpoint_url"), ("profile", "profile")):
        other = _args(**{flag: "a", "storage_options": json.dumps({key: "b"})})
        with pytest.raises(StorageOptionsError, match="name different"):
            storage_options(other, "s3://b")


def test_a_local_store_ignores_the_s3_options(capsys, caplog, tmp_path):
    from tests.conftest import store_with_v1

    root = store_with_v1(tmp_path).root
    s3_flags = ["--endpoint-url", DEAD_ENDPOINT, "--profile", "nobody"]
    code, out, err = run(capsys, "versions", "mnist", "--store", root, *s3_flags)
    assert code == 0 and "v1" in out
    assert "--endpoint-url, --profile not used for the local folder" in caplog.text


def test_export_reaches_an_s3_target_with_the_same_options(s3_store, s3_bucket, capsys, tmp_path):
    """From a local store to S3, and from S3 to a local folder (which takes no S3 options)."""
    pytest.importorskip("deltalake")
    from tests.conftest import store_with_v1

    root, endpoint = s3_store
    local = store_with_v1(tmp_path).root
    s3_target = f"s3://{s3_bucket[0]}/delta"
    version = ["--version", "v1", "--format", "delta"]
    for target, store in ((s3_target, local), (str(tmp_path / "delta"), root)):
        argv = ["export", "mnist", target, "--store", store, *version, "--endpoint-url", endpoint]
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert out.startswith("exported mnist v1: 4 rows") and target in out


def test_an_unreachable_endpoint_is_one_line_exit_1(capsys):
    """Issue 40, item 8: pyarrow's native client (the default) fails the first request."""
    code = main(["versions", "g", "--store", "s3://bucket/store", "--endpoint-url", DEAD_ENDPOINT])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(
        f"raycompat: error: s3://bucket/store: storage error at endpoint {DEAD_ENDPOINT} ("
    )
    assert err[0].endswith(
        "check --store, --endpoint-url and the credentials (--debug shows the traceback)"
    )


def test_an_unreachable_endpoint_through_s3fs_is_one_line_not_a_traceback(capsys, monkeypatch):
    """An option only s3fs knows sends the first request through botocore, whose refused
    connection (``EndpointConnectionError``) is no ``OSError``: still the one line, not
    botocore's traceback. One attempt, no retries (the test takes about a second)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unreachable-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unreachable-test-secret")
    options = json.dumps({"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}})
    argv = ["--endpoint-url", DEAD_ENDPOINT, "--storage-options", options]
    code = main(["versions", "g", "--store", "s3://bucket/store", *argv])
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]  # after the INFO line saying bulk I/O goes through s3fs
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert line.startswith(
        f"raycompat: error: s3://bucket/store: storage error at endpoint {DEAD_ENDPOINT} "
        '(Could not connect to the endpoint URL: "'
    )


@pytest.mark.parametrize("job", ["upgrade", "transform"])
def test_a_job_whose_store_is_unreachable_says_so_in_one_line(job, tmp_path):
    """The jobs reach their store with the same first request as the CLI (``reach_store``):
    one line naming the root and the endpoint, exit 1, before Ray starts."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    options = json.dumps({"client_kwargs": {"endpoint_url": DEAD_ENDPOINT}})
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    argv = ["store.root=s3://bucket/store", f"store.storage_options={options}"]
    if job == "transform":  # inputs that exist, so that the store is what fails
        h = tmp_path / "h"
        h.mkdir()
        argv = ["--config", "configs/transform_fct.yaml", *argv, f"transformation={h}",
                f"side_info_transformation={h}"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, f"jobs/{job}.py", *argv],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 1 and len(errors) == 1, result.stderr[-2000:]
    assert errors[0].startswith(f"{job}.py: error: s3://bucket/store: storage error at endpoint")
    assert errors[0].endswith("and the credentials (--debug shows the traceback)")
    assert "Traceback" not in result.stderr
