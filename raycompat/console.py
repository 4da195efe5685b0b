"""What our entry points print: our own lines, and third-party lines only with ``--verbose``.

The ``raycompat`` CLI, the jobs and the demo call :func:`configure_console` once, after parsing
their arguments. By default the root logger is at WARNING and ``raycompat.*`` at INFO: the
console shows our lines (stage announcements, notes, one summary line) and any library's
warnings and errors, but no library's INFO lines (faiss' loader: eight lines on every command
that imports faiss, "No module named 'faiss.swigfaiss_avx512'" among them; pyiceberg's
"Defaulting to PyArrow FileIO"). ``--verbose`` (or ``RAYCOMPAT_VERBOSE=1``) puts the root at INFO
and ``raycompat.*`` at DEBUG. Log lines are plain text (no colour) whatever the stream; Ray's
prefixes of its workers' lines are coloured only on a terminal
(:func:`raycompat.cluster.console.init_ray`). Ray-free: the Ray layer's own quieting (Ray Data,
Ray Train, the workers) is :mod:`raycompat.cluster.console`.
"""

from __future__ import annotations

import logging
import os
from typing import IO

from raycompat.io.credentials import configure_logging

VERBOSE_ENV = "RAYCOMPAT_VERBOSE"  # a job's --verbose, passed on to its Ray workers
JOB_FORMAT = "%(asctime)s %(name)s: %(message)s"


def verbose_requested() -> bool:
    """``RAYCOMPAT_VERBOSE=1`` in this process's environment (set by a job's ``--verbose``)."""
    return os.environ.get(VERBOSE_ENV) == "1"


def set_console_levels(verbose: bool = False) -> None:
    """Root logger at WARNING and ``raycompat`` at INFO; INFO and DEBUG when ``verbose``."""
    logging.getLogger().setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("raycompat").setLevel(logging.DEBUG if verbose else logging.INFO)


def configure_console(
    verbose: bool = False, fmt: str = JOB_FORMAT, stream: IO[str] | None = None
) -> bool:
    """Logging of an entry point: plain lines in ``fmt`` on ``stream`` (default stderr), every
    line scrubbed of credentials (:func:`~raycompat.io.credentials.configure_logging`), levels
    by :func:`set_console_levels`. Returns whether the console is verbose (``verbose`` or
    :func:`verbose_requested`)."""
    verbose = verbose or verbose_requested()
    configure_logging(fmt, **({"stream": stream} if stream is not None else {}))
    set_console_levels(verbose)
    return verbose
