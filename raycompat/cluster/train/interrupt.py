"""Ctrl-C during a Ray Train run ends the job as Ctrl-C does anywhere else: ``KeyboardInterrupt``.

Ray Train 2.58's ``trainer.fit()`` replaces the driver's SIGINT handler
(``DataParallelTrainer._register_sigint_handler``) with one that aborts the run's controller and
then calls ``sys.exit(0)``: a Ctrl-C that exits 0, as if the job had succeeded. It never puts the
previous handler back, so every later Ctrl-C of the job (while Ray Data extracts the gallery, say)
runs it again, for a controller long gone, and exits 0 there too. :func:`fit` runs
``trainer.fit()`` with a handler of ours in its place: it aborts the run as Ray Train's does (the
controller stops the workers; the checkpoints reported so far stay, and a rerun resumes from the
latest), then raises ``KeyboardInterrupt``, which the job's ``run_main`` prints as one line with
exit status 130 (``raycompat/cli/errors.py``). When ``fit`` returns or raises, the handler in
place before it is restored. ``tests/cluster/train/test_interrupt.py`` fails if a Ray upgrade
moves the method this replaces.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import ray

ABORT_TIMEOUT_S = 30.0  # how long a Ctrl-C waits for the controller to stop the workers


def abort_then_interrupt(abort: Callable[[], object]) -> Callable:
    """A SIGINT handler: ``abort()`` (its errors ignored: the controller may be gone), then
    ``KeyboardInterrupt``. A second Ctrl-C while it waits interrupts at once."""

    def handler(signum, frame) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            abort()
        except Exception:  # the actor exits as it aborts (RayActorError), or is gone already
            pass
        raise KeyboardInterrupt

    return handler


def fit(trainer) -> ray.train.Result:
    """``trainer.fit()``, a Ctrl-C in it aborting the run and raising ``KeyboardInterrupt``.
    Off the main thread (a Tune trial) Ray Train installs no handler and neither does this."""
    if threading.current_thread() is not threading.main_thread():
        return trainer.fit()

    def register(controller) -> None:
        def abort() -> None:
            ray.get(controller.abort.remote(), timeout=ABORT_TIMEOUT_S)

        signal.signal(signal.SIGINT, abort_then_interrupt(abort))

    before = signal.getsignal(signal.SIGINT)
    trainer._register_sigint_handler = register  # Ray Train's own: see the module docstring
    try:
        return trainer.fit()
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)
