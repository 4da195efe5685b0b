"""Ctrl-C during a sweep ends the job as Ctrl-C does anywhere else: ``KeyboardInterrupt``.

Ray Tune 2.58's ``Tuner.fit()`` replaces the driver's SIGINT handler
(``ray.tune.tune._setup_signal_catching``) with one that makes the tuning loop stop: the trials
are stopped, the experiment state is saved one last time, and ``fit()`` returns the results as if
the sweep had finished. The job then wrote ``results/`` for the trials so far and exited 0, and
Tune's handler, never put back, swallowed the next Ctrl-C as well (issue 52). :func:`fit` runs
``fit()`` with a handler of ours in its place that stops the loop the same way (so the state is
saved and a rerun restores the sweep: finished trials kept, the others resumed), and then
raises ``KeyboardInterrupt``, which the job's ``run_main`` prints as one line with exit status
130 (``raycompat/cli/errors.py``). Tune's own lines about the interrupt (its ``Tuner.restore``
hint names the Python API, not the command to rerun) are left out in favour of that line. A
second Ctrl-C while the loop stops interrupts at once. When ``fit`` returns or raises, the
handlers in place before it are restored. ``tests/cluster/tune/test_interrupt.py`` fails if a
Ray upgrade moves the function this replaces.
"""

from __future__ import annotations

import importlib
import logging
import signal
import threading

# The module of ``tune.run`` (``ray.tune.tune``; ``ray.tune.tune`` as an attribute may be the
# function's package re-export, so it is looked up by name).
TUNE_RUN = importlib.import_module("ray.tune.tune")
STOP_SIGNALS = (signal.SIGINT, signal.SIGUSR1)  # what Tune's own handler stops the loop on


class _AfterInterrupt(logging.Filter):
    """Drops the ``ray.tune.tune`` lines logged once ``interrupted`` is set."""

    def __init__(self, interrupted: threading.Event) -> None:
        super().__init__()
        self.interrupted = interrupted

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.interrupted.is_set()


def stop_then_interrupt(interrupted: threading.Event):
    """A replacement for ``_setup_signal_catching``: SIGINT (or SIGUSR1, as Tune's) sets
    ``interrupted``, the event the tuning loop polls; a second Ctrl-C raises at once."""

    def setup() -> threading.Event:
        def handler(signum, frame) -> None:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            interrupted.set()

        for signum in STOP_SIGNALS:
            signal.signal(signum, handler)
        return interrupted

    return setup


def fit(tuner):
    """``tuner.fit()``; a Ctrl-C in it stops the sweep (state saved) and raises
    ``KeyboardInterrupt``. Off the main thread Tune installs no handler and neither does this."""
    if threading.current_thread() is not threading.main_thread():
        return tuner.fit()
    interrupted = threading.Event()
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    quiet = _AfterInterrupt(interrupted)
    original = TUNE_RUN._setup_signal_catching
    TUNE_RUN._setup_signal_catching = stop_then_interrupt(interrupted)
    TUNE_RUN.logger.addFilter(quiet)
    try:
        results = tuner.fit()
    finally:
        TUNE_RUN._setup_signal_catching = original
        TUNE_RUN.logger.removeFilter(quiet)
        for signum, handler in before.items():
            if handler is not None:
                signal.signal(signum, handler)
    if interrupted.is_set():
        raise KeyboardInterrupt
    return results
