"""The search service's settings, typed: limits, polling, and the bearer token.

An unknown setting is a ``TypeError`` (a dataclass takes only its fields) and a value out of
range a :class:`~raycompat.errors.ConfigError`, both before the service binds its port. The
token is kept out of ``repr`` (and so out of every log line that prints the config).

The settings as config keys and as ``raycompat serve``'s options are
:class:`~raycompat.config.serve.ServiceSpec` (plain data, below the service);
:meth:`ServiceConfig.from_spec` builds the service's config from it, here, so the config layer
never imports the service.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from raycompat.errors import ConfigError
from raycompat.service.shadow import ShadowSpec

if TYPE_CHECKING:
    from raycompat.config.serve import ServiceSpec

TOKEN_ENV = "RAYCOMPAT_SERVE_TOKEN"


@dataclass(frozen=True)
class ServiceConfig:
    """What a service replica enforces and how it follows the store.

    Attributes:
        max_k: hits per query a request may ask for.
        max_batch: query rows (vectors or ids) in one request.
        max_body_bytes: a larger request body is answered 413 before it is parsed.
        poll_s: seconds between two reads of the serving records by the watcher.
        check_each_request: before each search, count the model's alias records and look for
            its retired tombstone (a listing and a stat, no record read) and follow a change
            at once, so an answer never comes from a version the records no longer serve;
            False: only the watcher follows (an answer may lag a change by up to ``poll_s``
            plus a load).
        token: the bearer token every request must carry; None: no token asked.
        probe_auth: the probes (``/healthz``, ``/readyz``) ask the token too; False (the
            default): they are open, as a load balancer's health check and the kubelet's
            probes carry no token, and they tell only counts.
        access_log: one log line per request (``app.py``); False: none.
        shadow: pairs whose searches also run on a candidate version, in the background
            (``shadow.py``).
    """

    max_k: int = 1000
    max_batch: int = 1000
    max_body_bytes: int = 8 * 1024 * 1024
    poll_s: float = 1.0
    check_each_request: bool = True
    token: str | None = field(default=None, repr=False)
    probe_auth: bool = False
    access_log: bool = True
    shadow: tuple[ShadowSpec, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_k", "max_batch", "max_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"service {name} must be an integer >= 1, got {value!r}")
        if not self.poll_s > 0:
            raise ConfigError(f"service poll_s must be > 0 seconds, got {self.poll_s!r}")
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
        return cls(
            max_k=spec.max_k,
            max_batch=spec.max_batch,
            max_body_bytes=spec.max_body_bytes,
            poll_s=spec.poll_s,
            check_each_request=spec.check_each_request,
            token=read_token(spec.token_file, key=token_key),
            probe_auth=spec.probe_auth,
            access_log=spec.access_log,
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
