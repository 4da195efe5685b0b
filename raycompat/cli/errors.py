"""One-line errors for the ``raycompat`` CLI and the jobs' entry points.

An expected error (a config key that is unknown or of the wrong type, an unknown registered
name, a missing store, a corrupt or missing record) is the user's to fix, and its message names
what to fix; a Python traceback around it only hides that line. So it is printed as
``<prog>: error: <message>`` (scrubbed of credentials) with the exit status of its type
(``raycompat/errors.py``): 2 for a :class:`~raycompat.errors.UsageError`, 1 for any other
:class:`~raycompat.errors.RaycompatError` (a :class:`~raycompat.errors.DataError`). The
traceback is shown with ``--debug`` or ``RAYCOMPAT_DEBUG=1``; any other exception is a bug and
keeps its traceback.

Ctrl-C (a ``KeyboardInterrupt`` raised anywhere in the job: Ray raises it in the driver's
``ray.get`` and Ray Data's iterators, and :mod:`raycompat.cluster.train.interrupt` and
:mod:`raycompat.cluster.tune.interrupt` make Ray Train's and Ray Tune's own handlers end that
way too) is one line, ``<prog>: interrupted; <what a rerun does>``, and exit status 130
(128 + SIGINT, as a shell reports it), also while the job's Ray shuts down
(:func:`ray_ends_here`). The ``raycompat`` command does the same (``cli/app.py``, each
command's ``resumes``). README.md, "Exit status", lists every status.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from raycompat.errors import RaycompatError, UsageError, exit_status
from raycompat.io.credentials import scrub

USAGE_ERRORS = (UsageError,)  # exit 2; kept for code that catches this tuple
DEBUG_FLAG, DEBUG_ENV = "--debug", "RAYCOMPAT_DEBUG"
INTERRUPTED_EXIT = 130  # 128 + SIGINT
# What a rerun does after Ctrl-C, for a job that stores no progress (each job names its own).
RESTARTS = "rerunning starts it again"


def debug_requested(argv: Sequence[str] = ()) -> bool:
    """``--debug`` in ``argv``, or ``RAYCOMPAT_DEBUG=1`` in the environment."""
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV) == "1"


def error_line(prog: str, error: BaseException | str) -> str:
    """``prog: error: message`` on one line, scrubbed of registered credentials."""
    return f"{prog}: error: {scrub(error)}"


def interrupted_line(prog: str, resumes: str) -> str:
    """``prog: interrupted; <resumes>``: the one line Ctrl-C prints, in a job and a command."""
    return f"{prog}: interrupted; {resumes}"


def _config_path(argv: list[str]) -> str | None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config")
    known, _ = parser.parse_known_args(argv)
    return known.config


def run_main(
    main: Callable[[list[str]], object],
    argv: list[str] | None = None,
    *,
    resumes: str = RESTARTS,
) -> None:
    """Run a job's ``main(argv)`` from its ``__main__`` block: a usage error (a config error)
    is one line on stderr naming the config file and the key, and exit status 2; a data error
    (a training run stopped by a non-finite loss, gradient or feature: epoch, step and term) is
    one line, exit 1; Ctrl-C is one line, ``<prog>: interrupted; <resumes>`` (``resumes``: what
    rerunning the job does, e.g. resume from what it stored), exit 130. Any other exception
    keeps its traceback, except a requirement this Python cannot import (the job run by
    another Python than the venv's: ``raycompat/cli/interpreter.py``): one line, exit 2.

    ``--debug`` is taken out of ``argv`` (the jobs' parsers do not know it) and, like
    ``RAYCOMPAT_DEBUG=1``, lets the error raise with its traceback. Under ``ray job submit``
    the job's log ends with its exit status and why (``raycompat/cli/job_exit.py``).
    """
    from raycompat.cli.job_exit import reported_exit

    with reported_exit():
        _run_main(main, argv, resumes)


def interruptible() -> None:
    """Make SIGINT raise ``KeyboardInterrupt`` in this process, as Python's own handler does.

    A process started with SIGINT ignored keeps it ignored: a shell without job control (a
    script's ``job &``, many CI runners and process managers) starts background commands so,
    and Python then installs no handler. The job would ignore SIGINT wherever it runs our code,
    and stop on it only inside a library that installs a handler of its own (Ray Train's, Ray
    Data's deferral): one Ctrl-C ended some stages and not others (issue 52). Every job and
    command stops on SIGINT instead, in every stage; a handler a caller installed (a test, an
    embedding program) is left as it is. Main thread only (elsewhere signals are not ours)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextmanager
def ray_ends_here() -> Iterator[None]:
    """A Ray the block starts is shut down when the block ends, however it ends: here, where a
    Ctrl-C is still the job's one line. Left to Ray's own exit hook, a Ctrl-C while Ray shuts
    down printed a traceback, and the workers' last lines came after the job's one line. A Ray
    running before the block (a test session's, a notebook's) is left running."""
    from raycompat.cli.job_exit import ray_running

    ours = not ray_running()
    try:
        yield
    finally:
        if ours and "ray" in sys.modules:  # not started too: its slow first import is here
            sys.modules["ray"].shutdown()


def _run_main(main: Callable[[list[str]], object], argv: list[str] | None, resumes: str) -> None:
    interruptible()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(argv)
    argv = [a for a in argv if a != DEBUG_FLAG]
    prog = os.path.basename(sys.argv[0]) or "raycompat"
    config = _config_path(argv)
    if config is not None and not Path(config).is_file() and not debug:
        from raycompat.config import missing_config_file

        print(error_line(prog, missing_config_file(config)), file=sys.stderr)
        raise SystemExit(2)
    try:
        with ray_ends_here():
            main(argv)
    except RaycompatError as error:
        if debug:
            raise
        status, message = exit_status(error), str(error)
        # load_config names the file; checks made after loading name only the key.
        if isinstance(error, UsageError) and config is not None and config not in message:
            message = f"{config}: {message}"
        print(error_line(prog, message), file=sys.stderr)
        raise SystemExit(status) from None
    except ModuleNotFoundError as error:  # a Python without Ray, torch...: which, and the fix
        from raycompat.cli.interpreter import exit_if_missing

        if not debug:
            exit_if_missing(error, prog)
        raise
    except KeyboardInterrupt:
        if debug:
            raise
        from raycompat.cli.job_exit import JobExit

        print(interrupted_line(prog, resumes), file=sys.stderr, flush=True)
        raise JobExit(INTERRUPTED_EXIT, "interrupted") from None
