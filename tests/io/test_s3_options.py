"""One S3 setting (raycompat/io/s3_options.py): the run and sweep configs take the store's
``storage_options``; their old ``endpoint_url`` still works, mapped into it with a warning."""

from __future__ import annotations

import warnings

import pytest

from raycompat.config import dump_config, load_config
from raycompat.config.train import RunSpec, TrainConfig
from raycompat.config.tune import SweepConfig
from raycompat.errors import ConfigError
from raycompat.io.s3_options import (
    ENDPOINT_ENV,
    endpoint_of,
    with_endpoint,
    with_environment_endpoint,
)

ENDPOINT = "http://127.0.0.1:9000"


def test_endpoint_of_reads_both_s3fs_spellings():
    assert endpoint_of({"client_kwargs": {"endpoint_url": ENDPOINT}}) == ENDPOINT
    assert endpoint_of({"endpoint_url": ENDPOINT}) == ENDPOINT
    assert endpoint_of({}) is None and endpoint_of(None) is None


def test_with_endpoint_moves_the_old_setting_into_client_kwargs():
    options = {"key": "k", "client_kwargs": {"region_name": "eu-west-1"}}
    assert with_endpoint("run.", options, None) is options  # nothing to do, no warning
    with pytest.warns(DeprecationWarning) as caught:
        out = with_endpoint("run.", options, ENDPOINT)
    client = {"region_name": "eu-west-1", "endpoint_url": ENDPOINT}
    assert out == {"key": "k", "client_kwargs": client}
    assert options == {"key": "k", "client_kwargs": {"region_name": "eu-west-1"}}  # unchanged
    message = str(caught[0].message)
    assert "\n" not in message and "run.storage_options.client_kwargs.endpoint_url" in message


def test_with_endpoint_refuses_two_different_endpoints():
    options = {"client_kwargs": {"endpoint_url": "http://other:1"}}
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="disagree"):
        with_endpoint("run.", options, ENDPOINT)
    with pytest.warns(DeprecationWarning):
        assert with_endpoint("", {"endpoint_url": ENDPOINT}, ENDPOINT) == {"endpoint_url": ENDPOINT}


def test_run_endpoint_url_is_a_deprecated_alias_of_storage_options(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"run\.endpoint_url is deprecated"):
        cfg = load_config(TrainConfig, None, [f"run.endpoint_url={ENDPOINT}"])
    assert cfg.run.endpoint_url is None
    assert cfg.run.storage_options == {"client_kwargs": {"endpoint_url": ENDPOINT}}
    # The written config carries storage_options only, so rerunning it warns no more.
    written = tmp_path / "config.yaml"
    written.write_text(dump_config(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config(TrainConfig, written).run == cfg.run


def test_sweep_endpoint_url_is_a_deprecated_alias_of_storage_options():
    with pytest.warns(DeprecationWarning, match=r"^endpoint_url is deprecated"):
        sweep = load_config(SweepConfig, None, [f"endpoint_url={ENDPOINT}"])
    assert sweep.storage_options == {"client_kwargs": {"endpoint_url": ENDPOINT}}
    assert SweepConfig(storage_options=sweep.storage_options).storage_options == (
        sweep.storage_options
    )


def test_the_same_options_are_accepted_by_store_run_and_sweep_configs():
    from raycompat.config.pipelines import StoreSpec

    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": ENDPOINT}}
    assert StoreSpec(storage_options=options).storage_options == options
    assert RunSpec(storage_options=options).storage_options == options
    assert SweepConfig(storage_options=options).storage_options == options


@pytest.fixture
def no_endpoint_env(monkeypatch):
    for name in (*ENDPOINT_ENV, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_environment_endpoint_is_used_when_the_options_name_none(no_endpoint_env):
    """botocore's variables, in botocore's order; options that name an endpoint keep it."""
    mp = no_endpoint_env
    assert with_environment_endpoint(None) == {}
    mp.setenv("AWS_ENDPOINT_URL", "http://generic:1")
    options = {"key": "k", "client_kwargs": {"region_name": "eu-west-1"}}
    client = {"region_name": "eu-west-1", "endpoint_url": "http://generic:1"}
    assert with_environment_endpoint(options) == {"key": "k", "client_kwargs": client}
    assert options == {"key": "k", "client_kwargs": {"region_name": "eu-west-1"}}  # unchanged
    mp.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:2")
    assert endpoint_of(with_environment_endpoint({})) == "http://s3-only:2"
    for named in ({"client_kwargs": {"endpoint_url": ENDPOINT}}, {"endpoint_url": ENDPOINT}):
        assert with_environment_endpoint(named) == named
    mp.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert with_environment_endpoint({}) == {}
