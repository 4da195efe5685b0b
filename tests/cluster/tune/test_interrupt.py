"""Ctrl-C during a sweep (``raycompat/cluster/tune/interrupt.py``): the tuning loop stops as
Tune's own handler stops it (state saved), then the job gets a ``KeyboardInterrupt`` (one line,
exit 130) instead of Tune's results and exit 0; the driver's handlers are put back afterwards.
A fake tuner stands in for ``Tuner`` (its ``fit`` sets up Tune's signal catching as
``tune.run`` does and polls the event as its loop does), so no Ray runs. The real sweep
interrupted by SIGINT is a case of ``tests/cli/test_errors.py``."""

from __future__ import annotations

import inspect
import os
import signal
import time

import pytest

from raycompat.cluster.tune import interrupt


class Tuner:
    """``fit`` as ``tune.run`` runs it: catch the signals, loop until the event is set (here:
    a SIGINT it sends itself, ``ctrl_c`` times) or the trials are done, return the results."""

    def __init__(self, ctrl_c: int) -> None:
        self.ctrl_c, self.stopped = ctrl_c, False

    def fit(self):
        event = interrupt.TUNE_RUN._setup_signal_catching()
        interrupt.TUNE_RUN.logger.warning("Stop signal received ...")  # Tune's own lines
        for _ in range(self.ctrl_c):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        self.stopped = event.is_set()  # the loop ends, the state is saved, fit returns
        return "results"


def test_ctrl_c_stops_the_loop_then_raises_keyboard_interrupt():
    before = signal.getsignal(signal.SIGINT)
    tuner = Tuner(ctrl_c=1)
    with pytest.raises(KeyboardInterrupt):
        interrupt.fit(tuner)
    assert tuner.stopped  # Tune's loop saw the stop: its state is saved as Tune's would be
    assert signal.getsignal(signal.SIGINT) is before
    assert interrupt.TUNE_RUN._setup_signal_catching.__module__ == "ray.tune.tune"
    assert not interrupt.TUNE_RUN.logger.filters


def test_a_second_ctrl_c_interrupts_at_once():
    tuner = Tuner(ctrl_c=2)
    with pytest.raises(KeyboardInterrupt):
        interrupt.fit(tuner)
    assert not tuner.stopped  # raised in the loop, before it could end


def test_a_sweep_that_ends_returns_its_results_and_puts_the_handlers_back():
    before = {s: signal.getsignal(s) for s in interrupt.STOP_SIGNALS}
    assert interrupt.fit(Tuner(ctrl_c=0)) == "results"
    assert {s: signal.getsignal(s) for s in interrupt.STOP_SIGNALS} == before


def test_ray_tune_catches_signals_where_this_replaces_it():
    """Fails if a Ray upgrade moves Tune's SIGINT handling (then revisit interrupt.py)."""
    from ray.tune.tune import run

    source = inspect.getsource(run)
    assert "experiment_interrupted_event = _setup_signal_catching()" in source
    assert "not experiment_interrupted_event.is_set()" in source
