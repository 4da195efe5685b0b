"""What a job prints: our one-liners, Ray's warnings and errors, and no known-harmless noise.

The jobs start Ray with :func:`init_ray` instead of ``ray.init``. By default the console shows
our stage announcements (:mod:`raycompat.progress`), a run's epoch lines (the first, at most
one per 10 s, and the last; a progress bar where the console is a terminal, which
:func:`init_ray` tells the workers: :mod:`raycompat.cluster.train.epoch_log`), a sweep's line
per trial (:mod:`raycompat.cluster.tune.console`), the pipelines' progress lines and Ray's
warnings; ``--verbose`` (or ``RAYCOMPAT_VERBOSE=1``) restores everything. On the driver, every
library's INFO lines are left out by the root logger's level (:mod:`raycompat.console`). Each
library is quieted through its own configuration, on the driver and
(``worker_process_setup_hook``: :func:`configure_worker`) in every worker of the job:

- Ray Data (:func:`quiet_ray_data`): its ``DataContext`` prints no execution plan
  (``print_on_execution_start``) and no progress (``enable_progress_bars``: the 8-line block every
  10 s when stdout is not a terminal), unless verbose or stdout is a terminal; the console
  handler of its logger (``ray.data``: "Starting execution", "execution finished") at WARNING,
  its log file (``ray-data.log`` in Ray's session logs) left complete, and the handlers others
  attach to that logger (pytest's capture, a user's own) left as they are.
- Ray Tune and Ray Train's driver-side loggers (``ray.tune``, ``ray.train``) at WARNING
  (:data:`QUIET_LEVELS`), and faiss' loader (``faiss.loader``: "Loading faiss with AVX2
  support.").
- Ray Train's detached ``PlacementGroupCleaner`` actor asks Ray's state API for its controller
  without an address; with another Ray instance on the host, that raised "Found multiple active
  Ray instances" in its monitor thread (a traceback per run). :func:`configure_worker` gives every
  worker of the job ``RAY_ADDRESS``, the address of the cluster it belongs to. Where the state
  API has no server (a cluster without the dashboard), it warns every second that it "Failed to
  query Ray Train Controller actor state": its logger is at ERROR.
- The pipelines' actor pools (``raycompat.cluster.pipelines.runner``) are fixed-size and not
  restartable, which removes Ray Data's "will not allow it to scale up" warning and Ray core's
  ``core_worker.cc`` ERROR about restartable actors with constructor arguments in the object
  store at their cause.
- Ray Train's own INFO lines ("Reporting training result ...", "Checkpoint successfully
  created ...", worker-group start-up): every ``RunConfig`` we build carries
  :func:`train_logging_config`, WARNING unless verbose.
- Our DEBUG lines (``raycompat.*`` loggers), on the driver and in the Ray workers: the workers
  learn it from the ``RAYCOMPAT_VERBOSE`` environment variable (:func:`set_log_level`).
- Ray lines known to be harmless that no configuration turns off (:data:`HARMLESS_RAY_LINES`:
  the ``core_worker.cc`` ERROR for Ray Train's own restartable actors, the GCS's "Failed to
  kill actor ... RpcError" about an actor already gone, the raylet's "N PYTHON worker processes
  have been started" during a Tune sweep on a small node) are dropped from the worker output
  and the warnings Ray forwards to the driver's console: the one filter by pattern left. They
  stay in Ray's session log files (``/tmp/ray/session_latest/logs``).

- Colour: Ray colours the ``(pid=..., actor)`` prefix of each worker line it forwards; where
  stdout or stderr is not a terminal (a log written to a file), :func:`plain_prefixes` sets
  ``RAY_COLOR_PREFIX=0`` and strips the codes from Ray's own lines (the dashboard's address),
  so the log holds no escape codes.

``ray.init(logging_config=ray.LoggingConfig(...))`` is not used: it adds a second handler to the
driver's root logger (every warning of ours printed twice) and drops the ``(pid, actor)`` prefix
of the workers' lines.

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
from typing import Any

from raycompat.console import VERBOSE_ENV, verbose_requested
from raycompat.progress import CONSOLE_ENV, TERMINAL, on_terminal

log = logging.getLogger(__name__)

SETUP_HOOK = "raycompat.cluster.console.configure_worker"  # runs in every worker of a job
# Each logger's level unless verbose (INFO then): Ray's libraries' driver-side lines and faiss'
# loader at WARNING (Ray Data's console handler: quiet_ray_data); ERROR for two that warn about
# nothing the user can act on: Ray Data's progress module, once, that its bars are off, and Ray
# Train's PlacementGroupCleaner, every second of a run, that Ray's state API does not answer
# (a cluster started without the dashboard, as the tests' is).
QUIET_LEVELS = {
    "ray.train": logging.WARNING,
    "ray.tune": logging.WARNING,
    "faiss.loader": logging.WARNING,
    "ray.data._internal.progress": logging.ERROR,
    "ray.train.v2._internal.execution.controller.placement_group_cleaner": logging.ERROR,
}
COLOR_ENV = "RAY_COLOR_PREFIX"  # "0": Ray prints its workers' line prefixes without colour
# "0": Ray Train's workers keep Python's print. Ray Train 2.58 replaces it with one that logs
# each message to the root logger and also prints it: every progress-bar message of Ray's
# tqdm_ray reached the driver twice (a closed bar drawn again) and with an empty line.
TRAIN_PRINT_PATCH_ENV = "RAY_TRAIN_ENABLE_PRINT_PATCH"
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
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
    (
        re.compile(r"Failed to kill actor [0-9a-f]+, return status: .*RpcError"),
        "the GCS (its gcs_server.err, which Ray forwards) kills the actors of a run or a job "
        "that ends, and an actor whose worker has already gone cancels the call: the actor is "
        "dead either way (its INFO twin, 'Node with actor is already dead', stays in the log)",
    ),
    (
        re.compile(
            r"WARNING: \d+ PYTHON worker processes have been started on node: \S+ with "
            r"address: \S+, which is \d+x the maximum expected startup concurrency"
        ),
        "the raylet counts a Tune sweep's workers (per trial a trainable, Ray Train's "
        "controller and its workers, most of them holding no CPU) against the node's CPU count: "
        "on a 2-CPU node 4 trials make it 11x; nothing is blocked (its raylet.out keeps it)",
    ),
)


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
    for name, quiet in QUIET_LEVELS.items():
        logging.getLogger(name).setLevel(logging.INFO if verbose else quiet)
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "__file__", None):
        package = os.path.dirname(ray.__file__)
        for name, logger in list(logging.root.manager.loggerDict.items()):
            if name.startswith(package + os.sep) and isinstance(logger, logging.Logger):
                logger.setLevel(logging.INFO if verbose else logging.WARNING)


def ray_data_console_handlers() -> list[logging.Handler]:
    """The console handler Ray Data's logging config put on the ``ray.data`` logger (class
    ``PlainRayHandler``), and no other: a non-propagating logger also carries handlers of
    others (pytest attaches its capture handlers to every such logger, a user's app may add its
    own), whose levels are not ours to change."""
    from ray._private.log import PlainRayHandler

    return [h for h in logging.getLogger("ray.data").handlers if type(h) is PlainRayHandler]


def quiet_ray_data(verbose: bool = False) -> None:
    """Ray Data's ``DataContext`` of this process: the execution plan printed at start, the
    progress bars (a block of log lines every 10 s where stdout is not a terminal) and verbose
    stats only when ``verbose``; the bars also where stdout is a terminal."""
    from ray.data import DataContext

    verbose = verbose or verbose_requested()
    for handler in ray_data_console_handlers():  # its file handler keeps DEBUG
        handler.setLevel(logging.INFO if verbose else logging.WARNING)
    context = DataContext.get_current()
    context.enable_progress_bars = verbose or sys.stdout.isatty()
    context.print_on_execution_start = verbose
    context.verbose_stats_logs = verbose


def configure_worker() -> None:
    """Ray's ``worker_process_setup_hook`` of every job :func:`init_ray` starts: log levels as
    on the driver (Ray Data's too where the worker has imported it: the hook imports nothing
    heavy, it runs in every worker), and ``RAY_ADDRESS`` (this worker's cluster) for Ray code
    that looks the cluster up by address (Ray Train's ``PlacementGroupCleaner``). The datasets
    the jobs run are built on the driver and carry its ``DataContext``."""
    import ray

    if not os.environ.get("RAY_ADDRESS"):
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    set_log_level()
    if "ray.data" in sys.modules:
        quiet_ray_data()


def train_logging_config():
    """``ray.train.LoggingConfig`` of every run we start: Ray Train's console at WARNING,
    INFO when verbose (read in the process that builds the trainer)."""
    import ray.train

    return ray.train.LoggingConfig(log_level="INFO" if verbose_requested() else "WARNING")


def is_harmless(line: str) -> bool:
    return any(pattern.search(line) for pattern, _ in HARMLESS_RAY_LINES)


def filtered(handler: Callable[..., None]) -> Callable[..., None]:
    """``handler`` (Ray's printer of a batch of forwarded lines: a dict with ``lines``,
    ``is_err``, ``pid``, ``actor_name``..., and whatever else it takes) without the harmless
    lines; a batch left empty is not printed."""

    def print_batch(data: dict, *args: Any, **kwargs: Any) -> None:
        lines = data.get("lines")
        if lines:
            kept = [line for line in lines if not is_harmless(line)]
            if not kept:
                return
            if len(kept) != len(lines):
                data = {**data, "lines": kept}
        handler(data, *args, **kwargs)

    print_batch.unfiltered = handler
    return print_batch


def install_console_filter() -> bool:
    """Wrap Ray's console printers with :func:`filtered` (once each): the handler its log
    thread prints the workers' lines with, and ``print_to_stdstream``, which its error thread
    (``listen_error_messages``) calls directly for the raylet's and the GCS's warnings. False
    where this Ray has no such printer (not connected with ``log_to_driver``, or a Ray that
    moved them)."""
    try:
        import ray._private.worker as worker
        from ray._private.worker import global_worker_stdstream_dispatcher as dispatcher

        if not hasattr(worker.print_to_stdstream, "unfiltered"):
            worker.print_to_stdstream = filtered(worker.print_to_stdstream)
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


def worker_env(verbose: bool, terminal: bool = False) -> dict | None:
    """``ray.init``'s ``runtime_env``: :func:`configure_worker` as every worker's setup hook,
    ``RAYCOMPAT_VERBOSE=1`` when verbose and ``RAYCOMPAT_CONSOLE=terminal`` when the
    driver's console is a terminal (the workers may run on a cluster started before this
    process; their own stderr is a log file, :func:`raycompat.progress.on_terminal`), with
    Ray Train's print patch off for the bars (:data:`TRAIN_PRINT_PATCH_ENV`). What the
    job was submitted with already (``ray job submit --runtime-env-json``) is not set again:
    Ray refuses a second value of either. None when nothing is left to set."""
    submitted = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    runtime_env = submitted.get("runtime_env") or {}
    env_vars = runtime_env.get("env_vars") or {}
    ours: dict = {}
    if "worker_process_setup_hook" not in runtime_env:
        ours["worker_process_setup_hook"] = SETUP_HOOK
    wanted = {VERBOSE_ENV: "1" if verbose else None, CONSOLE_ENV: TERMINAL if terminal else None}
    if terminal:  # Ray Train's print patch sends each bar message twice, with an empty line
        wanted[TRAIN_PRINT_PATCH_ENV] = "0"
    ours_vars = {k: v for k, v in wanted.items() if v is not None and k not in env_vars}
    if ours_vars:
        ours["env_vars"] = ours_vars
    return ours or None


class StripColour(logging.Filter):
    """Drops the colour codes from a record's message (Ray's "View the dashboard at ...")."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "\x1b[" in message:
            record.msg, record.args = ANSI_COLOUR.sub("", message), None
        return True


def plain_prefixes() -> None:
    """No colour codes where stdout or stderr is not a terminal (a log redirected to a file,
    a ``ray job logs`` stream): Ray's ``(pid=..., actor)`` prefixes of its workers' lines
    (``RAY_COLOR_PREFIX=0``, unless set already; Ray reads it at every print) and its own log
    lines (:class:`StripColour` on the ``ray`` logger's handlers)."""
    if sys.stdout.isatty() and sys.stderr.isatty():
        return
    os.environ.setdefault(COLOR_ENV, "0")
    for handler in logging.getLogger("ray").handlers:
        if not any(isinstance(f, StripColour) for f in handler.filters):
            handler.addFilter(StripColour())


def init_ray(address: str | None, verbose: bool = False) -> None:
    """What the jobs call instead of ``ray.init``: log levels set (``--verbose``, or
    ``RAYCOMPAT_VERBOSE=1``), Ray started or joined as :mod:`raycompat.cluster.which_ray`'s rule
    says for ``address`` (a private local Ray unless an address or ``RAY_ADDRESS`` names a
    cluster) with the workers' output on this console and one line naming it, each library
    quieted by its configuration (module docstring) and harmless lines filtered unless verbose.
    An already initialised Ray (a test session) is used as it is (levels and Ray Data's context
    set on this driver only).

    A private local Ray runs without Ray's dashboard: a job's progress is its own lines, and the
    dashboard's start-up was the largest fixed cost of a small job (``ray.init`` 13.4 s with it
    and 8.7 s without, docs/scale.md, "Issue 53"); Ray Train's placement-group cleaner, the
    one user of its state API, has a replacement that needs none (:mod:`.tune.reaper`). For
    the dashboard, start a cluster (``ray start --head``) and pass its address."""
    import ray

    verbose = verbose or verbose_requested()
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # this process's trainers, and a local Ray's workers
    terminal = on_terminal()
    if terminal:  # the workers' progress bars (their stderr is a log file): Ray draws them here
        os.environ[CONSOLE_ENV] = TERMINAL
    set_log_level(verbose)
    quiet_ray_data(verbose)
    plain_prefixes()
    if ray.is_initialized():
        return
    from raycompat.cluster.which_ray import announce, resolve_address

    address = resolve_address(address)
    ray.init(
        address=address,
        log_to_driver=True,
        runtime_env=worker_env(verbose, terminal),
        # Ray's own "Started a local Ray instance ..." line: ours names the Ray instead
        logging_level=logging.INFO if verbose else logging.WARNING,
        include_dashboard=False,  # a cluster keeps its own
    )
    if not verbose:
        install_console_filter()
    announce(address)
