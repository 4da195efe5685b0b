"""The search service's settings, typed: limits, polling, and the bearer token.

Each setting's default and range is declared once, in
:class:`~raycompat.config.serve.ServiceSettings` (plain data, below the service), which
:class:`ServiceConfig` extends with what the service holds at run time: the token itself and
the parsed shadow pairs. The deploy job's keys and ``raycompat serve``'s options are
:class:`~raycompat.config.serve.ServiceSpec` (the same settings, with a token file and shadow
pairs as text); :meth:`ServiceConfig.from_spec` builds the service's config from it, here, so
the config layer never imports the service.

An unknown setting is a ``TypeError`` (a dataclass takes only its fields) and a value out of
range a :class:`~raycompat.errors.ConfigError`, both before the service binds its port. The
token is kept out of ``repr`` (and so out of every log line that prints the config).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from raycompat.config.serve import ServiceSettings, ServiceSpec
from raycompat.errors import ConfigError
from raycompat.service.shadow import ShadowSpec

TOKEN_ENV = "RAYCOMPAT_SERVE_TOKEN"


@dataclass
class ServiceConfig(ServiceSettings):
    """What a service replica enforces and how it follows the store: the
    :class:`~raycompat.config.serve.ServiceSettings` (``max_k``, ``max_batch``,
    ``max_body_bytes``, ``poll_s``, ``check_each_request``, ``probe_auth``, ``access_log``;
    their defaults and ranges are there), and:

    Attributes:
        token: the bearer token every request must carry; None: no token asked.
        shadow: pairs whose searches also run on a candidate version, in the background
            (``shadow.py``).
    """

    token: str | None = field(default=None, repr=False)
    shadow: tuple[ShadowSpec, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.token is not None and not self.token:
            raise ConfigError("service token is empty: give one, or none")

    @classmethod
    def from_spec(cls, spec: ServiceSpec, options: bool = False) -> ServiceConfig:
        """The config ``spec`` describes, the token read from its ``token_file`` or the
        environment (:func:`read_token`); an error names the config key
        (``service.token_file``), or with ``options`` the command-line option
        (``--token-file``), as ``raycompat serve`` builds it from its options."""
        token_key, shadow_key = (
            ("--token-file", "--shadow") if options else ("service.token_file", "service.shadow")
        )
        settings = {f.name: getattr(spec, f.name) for f in dataclasses.fields(ServiceSettings)}
        return cls(
            **settings,
            token=read_token(spec.token_file, key=token_key),
            shadow=tuple(ShadowSpec.parse(text, shadow_key) for text in spec.shadow),
        )


def read_token(
    token_file: str | None, environ: dict | None = None, key: str = "--token-file"
) -> str | None:
    """The bearer token: the first line of ``token_file`` (whitespace stripped), else the
    environment's ``RAYCOMPAT_SERVE_TOKEN``, else None. Never logged.

    Raises:
        ConfigError: the file cannot be read or is empty (the message names ``key``, the
            option or config key, and the file only).
    """
    if token_file is None:
        return (environ if environ is not None else os.environ).get(TOKEN_ENV) or None
    try:
        text = Path(token_file).read_text()
    except OSError as error:
        raise ConfigError(f"{key} {token_file}: unreadable ({error.strerror})") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise ConfigError(f"{key} {token_file}: empty")
    return token
