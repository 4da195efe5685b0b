"""What a job prints: our one-liners, Ray's warnings and errors, and no known-harmless noise.

The jobs start Ray with :func:`init_ray` instead of ``ray.init``. By default the console shows
one line per epoch per run (:mod:`raycompat.cluster.train.epoch_log`), the pipelines' progress lines
and Ray's warnings; ``--verbose`` (or ``RAYCOMPAT_VERBOSE=1``) restores everything:

- Ray Train's own INFO lines ("Reporting training result ...", "Checkpoint successfully
  created ...", worker-group start-up): every ``RunConfig`` we build carries
  :func:`train_logging_config`, WARNING unless verbose.
- Our DEBUG lines (``raycompat.*`` loggers), on the driver and in the Ray workers: the workers
  learn it from the ``RAYCOMPAT_VERBOSE`` environment variable (:func:`set_log_level`).
- Ray lines known to be harmless (:data:`HARMLESS_RAY_LINES`) are dropped from the worker
  output Ray forwards to the driver's console. They stay in Ray's session log files
  (``/tmp/ray/session_latest/logs``).

The filter wraps the handler Ray's log thread prints with (``ray_print_logs`` of
``ray._private.worker.global_worker_stdstream_dispatcher``): a private API of the pinned Ray
(2.58). Where it is missing, :func:`install_console_filter` does nothing and says so at DEBUG;
``tests/cluster/test_console.py`` fails if an upgrade of Ray moves it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

VERBOSE_ENV = "RAYCOMPAT_VERBOSE"
PRINT_HANDLER = "ray_print_logs"  # the name Ray registers its console printer under

# Ray lines the user can do nothing about, each with why it is harmless. A pattern matches
# anywhere in one forwarded line (Ray prefixes its own timestamp and process).
HARMLESS_RAY_LINES: tuple[tuple[re.Pattern, str], ...] = (
    (
        re.compile(
            r"core_worker\.cc:\d+: Actor with class name: '[^']*' and ID: '[0-9a-f]*' has "
            r"constructor arguments in the object store and max_restarts > 0"
        ),
        "Ray Train's own restartable actors (PreemptionWatcher, ...) warn about themselves; "
        "https://github.com/ray-project/ray/issues/53727",
    ),
)


def verbose_requested() -> bool:
    """``RAYCOMPAT_VERBOSE=1`` in this process's environment (set by a job's ``--verbose``)."""
    return os.environ.get(VERBOSE_ENV) == "1"


def set_log_level(verbose: bool = False) -> None:
    """``raycompat.*`` loggers at DEBUG when ``verbose`` or :func:`verbose_requested`, else
    INFO. Jobs call it on the driver (through :func:`init_ray`), training loops in each worker.

    Also the Ray modules that name their logger after their file (``getLogger(__file__)``),
    which ``LoggingConfig`` misses because it filters ``ray.train.*`` by name: Ray Train 2.58's
    worker context logs every "Reporting training result N: TrainingReport(...)" that way.
    They get the level Ray Train's own lines get: WARNING, INFO when verbose (the reports'
    metrics are in the run's ``metrics.jsonl``).
    """
    verbose = verbose or verbose_requested()
    logging.getLogger("raycompat").setLevel(logging.DEBUG if verbose else logging.INFO)
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "__file__", None):
        package = os.path.dirname(ray.__file__)
        for name, logger in list(logging.root.manager.loggerDict.items()):
            if name.startswith(package + os.sep) and isinstance(logger, logging.Logger):
                logger.setLevel(logging.INFO if verbose else logging.WARNING)


def train_logging_config():
    """``ray.train.LoggingConfig`` of every run we start: Ray Train's console at WARNING,
    INFO when verbose (read in the process that builds the trainer)."""
    import ray.train

    return ray.train.LoggingConfig(log_level="INFO" if verbose_requested() else "WARNING")


def is_harmless(line: str) -> bool:
    return any(pattern.search(line) for pattern, _ in HARMLESS_RAY_LINES)


def filtered(handler: Callable[[dict], None]) -> Callable[[dict], None]:
    """``handler`` (Ray's printer of a batch of forwarded lines: a dict with ``lines``,
    ``is_err``, ``pid``, ``actor_name``...) without the harmless lines; a batch left empty is
    not printed."""

    def print_batch(data: dict) -> None:
        lines = data.get("lines")
        if lines:
            kept = [line for line in lines if not is_harmless(line)]
            if not kept:
                return
            if len(kept) != len(lines):
                data = {**data, "lines": kept}
        handler(data)

    print_batch.unfiltered = handler
    return print_batch


def install_console_filter() -> bool:
    """Wrap Ray's console printer with :func:`filtered` (once). False where this Ray has no
    such printer (not connected with ``log_to_driver``, or a Ray that moved it)."""
    try:
        from ray._private.worker import global_worker_stdstream_dispatcher as dispatcher

        with dispatcher._lock:
            handlers = dispatcher.handlers
            for i, (name, handler) in enumerate(handlers):
                if name == PRINT_HANDLER:
                    if not hasattr(handler, "unfiltered"):
                        handlers[i] = (name, filtered(handler))
                    return True
    except (ImportError, AttributeError, TypeError, ValueError) as error:
        log.debug("Ray's console printer not found (%s): its output is not filtered", error)
        return False
    log.debug("Ray's console printer %r not registered: its output is not filtered", PRINT_HANDLER)
    return False


def worker_env(verbose: bool) -> dict | None:
    """``ray.init``'s ``runtime_env``: ``RAYCOMPAT_VERBOSE=1`` for every worker of the job
    (which may run on a cluster started before this process). None when not verbose, or when
    the job was submitted with a runtime env that already sets it (Ray refuses a second value
    of the same variable)."""
    if not verbose:
        return None
    submitted = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    env_vars = (submitted.get("runtime_env") or {}).get("env_vars") or {}
    return None if VERBOSE_ENV in env_vars else {"env_vars": {VERBOSE_ENV: "1"}}


def init_ray(address: str | None, verbose: bool = False) -> None:
    """What the jobs call instead of ``ray.init``: log levels set (``--verbose``, or
    ``RAYCOMPAT_VERBOSE=1``), Ray started or joined at ``address`` with the workers' output on
    this console, harmless lines filtered unless verbose. An already initialised Ray (a test
    session) is used as it is."""
    import ray

    verbose = verbose or verbose_requested()
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # this process's trainers, and a local Ray's workers
    set_log_level(verbose)
    if ray.is_initialized():
        return
    ray.init(address=address, log_to_driver=True, runtime_env=worker_env(verbose))
    if not verbose:
        install_console_filter()
