"""Stage announcements (raycompat/progress.py): the line, its numbering and its ETA; a loop's
steps (Ticker): a bar on a terminal, a line per every_s elsewhere."""

from __future__ import annotations

import logging

import pytest

from raycompat.progress import Stages, Ticker, plural, stage_line


def test_stage_line_format():
    assert stage_line(2, 3, "m2", "training dsimplex_hoc against m1", None) == (
        "[2/3] m2: training dsimplex_hoc against m1"
    )
    assert (
        stage_line(1, 9, "ift step 1", "training", 409.6) == "[1/9] ift step 1: training | ETA 410s"
    )
    assert stage_line(1, 2, "m1", "x", -3.0).endswith("| ETA 0s")  # never a negative ETA
    assert (plural(1, "epoch"), plural(4, "epoch")) == ("1 epoch", "4 epochs")


def test_stages_are_announced_in_order_and_the_eta_follows_the_finished_ones(caplog):
    stages = Stages(3)
    with caplog.at_level(logging.INFO, logger="raycompat.progress"):
        stages.begin(1)
        assert stages.announce("m1", "training") == "[1/3] m1: training"  # no ETA yet
        stages._began -= 10.0  # stage 1 took 10 s
        stages.begin(2)
        line = stages.announce("m2", "training")
        stages._began -= 4.0  # 4 s into stage 2
        assert stages.eta_s() == pytest.approx(10.0 * 2 - 4.0, abs=0.5)
        stages.end()
        stages.end()  # no stage running: nothing counted twice
    assert line == "[2/3] m2: training | ETA 20s"
    assert [r.getMessage() for r in caplog.records] == ["[1/3] m1: training", line]
    assert stages.finished == 2 and stages.eta_s() == pytest.approx(7.0, abs=0.5)


class FakeBar:
    """A tqdm-like bar that records what it was told."""

    def __init__(self, total: int, desc: str, unit: str) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n, self.closed = 0, False

    def update(self, n: int) -> None:
        self.n += n

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def clock(monkeypatch):
    """``raycompat.progress``'s clock, moved by hand: ``clock.now`` seconds."""
    from types import SimpleNamespace

    import raycompat.progress as progress

    state = SimpleNamespace(now=100.0)
    monkeypatch.setattr(progress.time, "perf_counter", lambda: state.now)
    return state


def test_a_ticker_off_a_terminal_logs_the_first_line_one_per_every_s_and_the_last(caplog, clock):
    logger = logging.getLogger("raycompat.test.ticker")
    with caplog.at_level(logging.INFO, logger=logger.name):
        ticker = Ticker(logger, 30, "h", every_s=10.0, bar=FakeBar, terminal=False)
        assert ticker.bar is None  # no bar off a terminal, whatever the factory
        logged = []
        for epoch in range(30):  # 30 epochs of 0.5 s: 15 s in all
            clock.now += 0.5
            logged.append(ticker.step(f"epoch {epoch + 1}/30", last=epoch == 29))
    assert [r.getMessage() for r in caplog.records] == ["epoch 1/30", "epoch 21/30", "epoch 30/30"]
    assert sum(logged) == 3


def test_a_ticker_on_a_terminal_draws_a_bar_and_logs_the_last_line_below_it(caplog, clock):
    logger = logging.getLogger("raycompat.test.ticker")
    with caplog.at_level(logging.INFO, logger=logger.name):
        with Ticker(logger, 3, "run", "epoch", bar=FakeBar, terminal=True) as ticker:
            bar = ticker.bar
            for epoch in range(3):
                clock.now += 60.0  # slow epochs: the bar stands for their lines
                ticker.step(f"epoch {epoch + 1}/3", last=epoch == 2, status=f"run e{epoch}")
    assert (bar.n, bar.desc, bar.unit, bar.closed) == (3, "run e2", "epoch", True)
    assert [r.getMessage() for r in caplog.records] == ["epoch 3/3"]
    with Ticker(logger, 5, "stopped early", bar=FakeBar, terminal=True) as ticker:
        bar = ticker.bar
    assert bar.closed and ticker.bar is None  # a loop that ends early closes its bar
    assert Ticker(logger, 0, "nothing to do", bar=FakeBar, terminal=True).bar is None
    with caplog.at_level(logging.INFO, logger=logger.name):
        caplog.clear()
        trials = Ticker(logger, 2, "sweep", every_step=True, bar=FakeBar, terminal=True)
        trials.step("[1/2] trial a")
        trials.step("[2/2] trial b", last=True)
    assert [r.getMessage() for r in caplog.records] == ["[1/2] trial a", "[2/2] trial b"]


def test_the_console_is_a_terminal_by_stderr_or_by_what_the_driver_said(monkeypatch):
    import sys

    from raycompat.progress import CONSOLE_ENV, TERMINAL, on_terminal

    monkeypatch.delenv(CONSOLE_ENV, raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert not on_terminal()
    monkeypatch.setenv(CONSOLE_ENV, TERMINAL)  # a Ray worker of a job run from a terminal
    assert on_terminal()
    monkeypatch.setenv(CONSOLE_ENV, "lines")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert not on_terminal()
