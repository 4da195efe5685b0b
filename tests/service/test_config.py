"""``ServiceConfig.from_spec``: the service builds its config from the deploy job's ``service``
keys (``ServiceSpec``, plain data in ``raycompat/config/serve.py``, which never imports the
service), and an error names the config key, or ``raycompat serve``'s option (issue 42, item 5;
issue 53, item 3)."""

from __future__ import annotations

import pytest

from raycompat.config import load_config
from raycompat.config.serve import ServeJobConfig
from raycompat.errors import ConfigError
from raycompat.service.config import ServiceConfig


def test_the_service_keys_build_the_services_config():
    cfg = load_config(ServeJobConfig, None, ["service.max_k=7", "service.shadow=[g/m1=v4]"])
    built = ServiceConfig.from_spec(cfg.service)
    assert (built.max_k, built.shadow[0].version, built.token) == (7, "v4", None)


def test_a_token_file_or_shadow_error_names_the_config_key(tmp_path):
    spec = load_config(ServeJobConfig, None, [f"service.token_file={tmp_path / 'none'}"]).service
    with pytest.raises(ConfigError, match=r"^service.token_file .*none: unreadable"):
        ServiceConfig.from_spec(spec)
    with pytest.raises(ConfigError, match=r"^--token-file .*none: unreadable"):
        ServiceConfig.from_spec(spec, options=True)  # raycompat serve's option
    bad = load_config(ServeJobConfig, None, ["service.shadow=[bad]"]).service
    with pytest.raises(ConfigError, match=r"^service.shadow 'bad': expected GALLERY/MODEL"):
        ServiceConfig.from_spec(bad)


def test_each_setting_has_one_home_in_service_settings():
    """``ServiceSettings`` declares every setting's default and range once (issue 53, item 4):
    the config keys (``ServiceSpec``), the service's config and ``raycompat serve``'s options
    read it, and none of them declares a setting again."""
    import dataclasses

    from raycompat.cli.app import parser
    from raycompat.config.serve import ServiceSettings, ServiceSpec

    names = [f.name for f in dataclasses.fields(ServiceSettings)]
    for cls in (ServiceSpec, ServiceConfig):
        assert issubclass(cls, ServiceSettings)
        assert not set(names) & set(vars(cls).get("__annotations__", {})), cls
    defaults = {name: getattr(ServiceSettings(), name) for name in names}
    assert {name: getattr(ServiceConfig(), name) for name in names} == defaults
    assert {name: getattr(ServiceSpec(), name) for name in names} == defaults
    args = vars(parser().parse_args(["serve", "--store", "s"]))
    options = {**args, "check_each_request": not args["poll_only"]}
    assert {name: options[name] for name in names} == defaults


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_k", 0, "service.max_k must be >= 1, got 0"),
        ("max_batch", -1, "service.max_batch must be >= 1, got -1"),
        ("poll_s", 0.0, "service.poll_s must be > 0, got 0.0"),
    ],
)
def test_the_service_and_its_config_keys_check_a_setting_the_same_way(key, value, message):
    import re

    with pytest.raises(ConfigError, match=re.escape(message)):
        ServiceConfig(**{key: value})
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(ServeJobConfig, None, [f"service.{key}={value}"])


def test_a_setting_built_in_python_is_type_checked_and_an_empty_token_refused():
    with pytest.raises(ConfigError, match="service.max_body_bytes must be an integer, got 2.5"):
        ServiceConfig(max_body_bytes=2.5)
    with pytest.raises(ConfigError, match="service token is empty"):
        ServiceConfig(token="")
