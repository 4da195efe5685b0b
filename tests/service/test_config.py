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
