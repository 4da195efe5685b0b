"""Secrets never leave memory: redacted configs, scrubbed logs, private report files.

Credentials reach the project as s3fs ``storage_options`` (``key``, ``secret``, ``token``,
nested ``client_kwargs``...) or as ``AWS_*`` environment variables. Three guards keep them out
of everything a job writes:

- :func:`redact` replaces the value of every credential key of a config by :data:`REDACTED`
  before the config is dumped; :func:`drop_redacted` removes such markers again when a written
  config is run, so the credentials come from the environment (or an instance role) instead.
- :func:`register_secrets` remembers credential *values*; :func:`accept_storage_options`, the
  one door every filesystem's options pass through (:mod:`raycompat.io.uri`: store,
  training runs, sweeps, weights), registers them and the environment's; the job config
  loaders register whole configs early. :func:`scrub` removes them from any text, and
  :class:`ScrubSecrets`, installed by :func:`configure_logging`, from every log line.
- :func:`write_private` writes a report atomically with mode 0600 (reports name private paths).

No Ray here: this is the core.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import sys
import threading
import traceback
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REDACTED = "<redacted>"
# botocore / s3fs / pyarrow spellings of credentials; other keys match by a part of their name.
SECRET_KEYS = frozenset(
    {
        "key",
        "secret",
        "token",
        "session_token",
        "password",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "access_key",
        "secret_key",
        "security_token",
    }
)
SECRET_PARTS = ("secret", "token", "password", "credential")
SECRET_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
)
# Shorter values would scrub ordinary words and numbers out of every log line.
MIN_SECRET_LENGTH = 4

_secrets: set[str] = set()
_lock = threading.Lock()


def is_secret_key(name: Any) -> bool:
    """Whether ``name`` is a credential key (case-insensitive): ``secret``, ``AWS_..._TOKEN``;
    not a key that names where one is kept (``token_file``: a path, named in errors)."""
    lowered = str(name).lower()
    if lowered.endswith(("_file", "_path")):
        return False
    return lowered in SECRET_KEYS or any(part in lowered for part in SECRET_PARTS)


def _plain(obj: Any) -> Any:
    """Dataclass and pydantic configs as the dicts they dump to."""
    if isinstance(obj, type):
        return obj
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    return obj


def redact(obj: Any) -> Any:
    """A deep copy of ``obj`` (dict, list, dataclass config) with every credential value,
    at any depth, replaced by :data:`REDACTED`. Empty values (``None``, ``""``) are kept: they
    hide nothing and still mean "not given". ``obj`` itself is not changed."""
    obj = _plain(obj)
    if isinstance(obj, Mapping):
        return {
            k: REDACTED if is_secret_key(k) and v not in (None, "") else redact(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list | tuple):
        return type(obj)(redact(v) for v in obj)
    return obj


def drop_redacted(options: Mapping | None) -> dict:
    """``options`` without the entries a written config carries as :data:`REDACTED` (at any
    depth), so that rerunning it takes credentials from the environment, not the marker."""
    out = {}
    for k, v in (options or {}).items():
        if v == REDACTED:
            logging.getLogger(__name__).info("%s was redacted in this config: not passed on", k)
        else:
            out[k] = drop_redacted(v) if isinstance(v, Mapping) else v
    return out


def register_secrets(obj: Any) -> None:
    """Remember the credential values in ``obj`` (storage options, a whole config) for
    :func:`scrub`. Values shorter than :data:`MIN_SECRET_LENGTH` and markers are ignored."""
    obj = _plain(obj)
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if is_secret_key(k) and isinstance(v, str | bytes):
                _remember(v.decode() if isinstance(v, bytes) else v)
            else:
                register_secrets(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            register_secrets(v)


def accept_storage_options(options: Mapping | None) -> dict:
    """The s3fs ``storage_options`` a filesystem is built with: the entries a written config
    carries as :data:`REDACTED` dropped (:func:`drop_redacted`), and every credential value
    left, plus the environment's ``AWS_*`` ones, registered for :func:`scrub`."""
    options = drop_redacted(options)
    register_secrets(options)
    register_environment_secrets()
    return options


def register_environment_secrets() -> None:
    """Remember the ``AWS_*`` credentials of this process's environment."""
    for name in SECRET_ENV:
        _remember(os.environ.get(name, ""))


def _remember(value: str) -> None:
    if len(value) >= MIN_SECRET_LENGTH and value != REDACTED:
        with _lock:
            _secrets.add(value)


def scrub(text: Any) -> str:
    """``str(text)`` with every registered secret value replaced by :data:`REDACTED`."""
    text = str(text)
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)  # a secret containing another first
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


class ScrubSecrets(logging.Filter):
    """Handler filter: formats a record's message (and traceback), scrubs it and stores it back,
    so no handler sees a registered secret. Install it on handlers: a filter on a logger misses
    the records its children propagate."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _secrets:
            return True
        try:
            message = record.getMessage()
        except Exception:  # bad arguments: the handler reports them as it always does
            return True
        record.msg, record.args = scrub(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True


def _scrubbed_excepthook(kind, value, tb) -> None:
    sys.stderr.write(scrub("".join(traceback.format_exception(kind, value, tb))))


def configure_logging(fmt: str = "%(asctime)s %(name)s: %(message)s", **kwargs: Any) -> None:
    """``logging.basicConfig`` for a job or the CLI, with :class:`ScrubSecrets` on every root
    handler, the environment's credentials registered and an uncaught error's traceback
    scrubbed before it reaches stderr."""
    logging.basicConfig(level=logging.INFO, format=fmt, **kwargs)
    register_environment_secrets()
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, ScrubSecrets) for f in handler.filters):
            handler.addFilter(ScrubSecrets())
    sys.excepthook = _scrubbed_excepthook


def save_private_figure(fig, path: str | Path) -> None:
    """Save the matplotlib figure ``fig`` as a PNG at ``path`` with :func:`write_private` (mode
    0600, atomically, as every report file); ``savefig`` would write it with the umask's mode
    (0644), readable by everyone."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    write_private(path, png.getvalue())


def write_private(path: str | Path, data: str | bytes) -> None:
    """Write ``path`` atomically (a temporary sibling, then ``os.replace``) with mode 0600."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    # O_EXCL | O_NOFOLLOW: never write through a file or link someone else put there.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
