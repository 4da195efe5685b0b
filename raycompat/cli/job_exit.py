"""A submitted job's own exit status, where the submitter sees it.

``ray job submit`` reports a job as SUCCEEDED or FAILED, and itself exits 1 for any failure: the
job's own status (3: ``--fail-on-refuse`` and an upgrade was refused; 2: a usage error; 1: a
data error) and its reason were lost in the middle of the log. Under ``ray job submit`` (Ray's
job supervisor sets ``RAY_JOB_CONFIG_JSON_ENV_VAR`` for the entrypoint) the job's log now ends
with one line::

    raycompat: exit 3 (refused: m2)

so ``ray job logs ID | tail -1`` shows it. Ray records the code itself as the job's
``driver_exit_code`` (``ray job list``, ``JobSubmissionClient.get_job_info``) and puts the
log's tail, this line last, in the job's status message (``ray job status ID``). Run directly, a
job prints nothing extra: its status is the shell's ``$?``.

This module imports neither torch nor Ray (it shuts down a Ray the job itself started, so that
Ray's own exit lines come before this one; a Ray that was running before the job, as in a test
session or a notebook, is left running).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from raycompat.io.credentials import scrub

JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for the entrypoint
EXIT_LINE = "raycompat: exit {code} ({reason})"
# The reason of a status whose exit gave none (``SystemExit(3)``).
STATUS_REASONS = {0: "ok", 1: "error", 2: "usage error", 3: "refused", 130: "interrupted"}


class JobExit(SystemExit):
    """Exit with ``code``, naming ``reason`` in the exit line (``SystemExit(3)`` names only the
    status's generic reason)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code)
        self.reason = reason


def submitted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is the entrypoint of a job submitted with ``ray job submit``."""
    return bool((os.environ if environ is None else environ).get(JOB_CONFIG_ENV))


def _first_line(text: object) -> str:
    lines = [line.strip() for line in str(scrub(text)).splitlines() if line.strip()]
    return lines[0] if lines else ""


def exit_of(error: BaseException | None) -> tuple[int, str]:
    """``(status, one-line reason)`` of a job that returned (``error`` None) or raised ``error``.

    A ``SystemExit`` raised after ``run_main`` printed an error's line carries that error as
    its context (``raise SystemExit(status) from None`` keeps ``__context__``): its message is
    the reason.
    """
    if error is None:
        return 0, STATUS_REASONS[0]
    if isinstance(error, JobExit):
        return int(error.code), error.reason
    if isinstance(error, SystemExit):
        if error.code is None or isinstance(error.code, int):
            code = error.code or 0
            cause = error.__context__
            reason = _first_line(cause) if cause is not None and code else ""
            return code, reason or STATUS_REASONS.get(code, "error")
        return 1, _first_line(error.code).split(": error: ", 1)[-1]
    if isinstance(error, KeyboardInterrupt):
        return 130, STATUS_REASONS[130]
    return 1, f"{type(error).__name__}: {_first_line(error)}"


def ray_running() -> bool:
    """Whether this process is connected to Ray (never importing it)."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(getattr(ray, "is_initialized", lambda: False)())


def print_exit_line(code: int, reason: str, *, stop_ray: bool = True) -> None:
    """The job log's last line (stdout, after every buffered line of both streams).

    ``stop_ray``: first shut down this process's Ray connection, so that its exit lines come
    before this one (only for a Ray the job started: :func:`reported_exit`)."""
    if stop_ray and ray_running():
        sys.modules["ray"].shutdown()
    sys.stderr.flush()
    sys.stdout.flush()
    print(EXIT_LINE.format(code=code, reason=reason), flush=True)


@contextmanager
def reported_exit(environ: Mapping[str, str] | None = None) -> Iterator[None]:
    """Run the job's body; under ``ray job submit``, end its log with :data:`EXIT_LINE`.

    What Python would print at exit (a traceback, a ``SystemExit`` message) is printed first,
    then the line, then the process exits with the same status.
    """
    if not submitted(environ):
        yield
        return
    ours = not ray_running()  # a Ray running before the job is not the job's to stop
    try:
        yield
    except BaseException as error:
        code, reason = exit_of(error)
        if isinstance(error, SystemExit) and isinstance(error.code, str):
            print(error.code, file=sys.stderr)
        elif not isinstance(error, SystemExit):
            traceback.print_exc()
        print_exit_line(code, reason, stop_ray=ours)
        raise SystemExit(code) from None
    print_exit_line(0, STATUS_REASONS[0], stop_ray=ours)
