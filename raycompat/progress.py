"""Progress lines of long work: stage announcements, one line before each stage of a long job
with an ETA once known, row counts of a pipeline run (:class:`Progress`), and the steps of a
loop (:class:`Ticker`: a run's epochs, a sweep's trials) as a progress bar on a terminal and a
line every :data:`LINE_EVERY_S` seconds elsewhere.

    [2/3] m2: training dsimplex_hoc against m1 (4 epochs)
    [2/3] m2: scoring against m1
    [5/9] bct step 2: training on 7 digits (2800 images), 4 epochs | ETA 410s

The upgrade job (``raycompat.cluster.upgrade.job``) and the pure-PyTorch demo
(``raycompat.cli.demo``) announce their stages through :class:`Stages`; the line is logged
before the work starts, so the console says what is running, not what has finished. Plain
log lines whatever the terminal: one line per stage in a file, a CI log or a ``ray job logs``
stream alike. Ray-free (docs/architecture.md).

Whether the console is a terminal is :func:`on_terminal`: this process's stderr, or what a
job's driver said in ``RAYCOMPAT_CONSOLE`` for the Ray workers it starts, whose own stderr
is a log file that Ray forwards to the driver's console.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

log = logging.getLogger("raycompat.progress")
rows_log = logging.getLogger("raycompat.progress.rows")  # a pipeline's row counts

LINE_EVERY_S = 10.0  # where the console is no terminal: at most one line of a loop per 10 s
CONSOLE_ENV = "RAYCOMPAT_CONSOLE"  # "terminal": the job's console is one (its workers' view)
TERMINAL = "terminal"


def plural(count: int, noun: str) -> str:
    """``"1 epoch"``, ``"4 epochs"``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def stage_line(position: int, total: int, subject: str, what: str, eta_s: float | None) -> str:
    """``"[position/total] subject: what"``, with ``" | ETA <s>s"`` when ``eta_s`` is known.
    ``position`` counts from 1."""
    eta = "" if eta_s is None else f" | ETA {max(eta_s, 0.0):.0f}s"
    return f"[{position}/{total}] {subject}: {what}{eta}"


class Stages:
    """``total`` numbered stages of equal expected cost (a job's models, a demo's steps).

    :meth:`begin` starts a stage, :meth:`announce` logs a line of the running one (each step
    within it). The ETA is the mean time of the finished stages times the count of those left
    (the running one included), less the running one's time so far: unknown, and not shown,
    until one has finished.
    """

    def __init__(self, total: int, logger: logging.Logger = log) -> None:
        self.total, self.log = total, logger
        self.position, self.finished, self.spent = 0, 0, 0.0
        self._began: float | None = None

    def eta_s(self) -> float | None:
        if not self.finished:
            return None
        running = 0.0 if self._began is None else time.perf_counter() - self._began
        return max(self.spent / self.finished * (self.total - self.finished) - running, 0.0)

    def begin(self, position: int) -> None:
        """Stage ``position`` (from 1) starts: the previous one, if running, is finished."""
        self.end()
        self.position, self._began = position, time.perf_counter()

    def announce(self, subject: str, what: str) -> str:
        """Log (INFO) and return one line of the running stage, before the work it names."""
        line = stage_line(max(self.position, 1), self.total, subject, what, self.eta_s())
        self.log.info("%s", line)
        return line

    def end(self) -> None:
        """The running stage finished (counts towards the ETA); a no-op when none runs."""
        if self._began is not None:
            self.spent += time.perf_counter() - self._began
            self.finished += 1
            self._began = None


class Progress:
    """Count finished rows; ``skipped`` rows (done by an earlier run) count as done, not as speed.

    Args:
        total: rows of the whole job; skipped: rows already done before this run.
        every_s: minimum seconds between two log lines (the last update always logs).
    """

    def __init__(self, name: str, total: int, skipped: int = 0, every_s: float = 10.0) -> None:
        self.name, self.total, self.skipped, self.every_s = name, total, skipped, every_s
        self.done, self.start = 0, time.perf_counter()
        self._last = self.start

    @property
    def rows_per_s(self) -> float:
        return self.done / max(time.perf_counter() - self.start, 1e-9)

    def update(self, rows: int) -> None:
        self.done += rows
        now = time.perf_counter()
        if now - self._last >= self.every_s or self.skipped + self.done >= self.total:
            self._last = now
            left = self.total - self.skipped - self.done
            eta = left / self.rows_per_s if self.done else float("nan")
            rows_log.info(
                "%s: %d / %d rows (%.1f%%, %d from an earlier run), %.0f rows/s, ETA %.0f s",
                self.name,
                self.skipped + self.done,
                self.total,
                100.0 * (self.skipped + self.done) / max(self.total, 1),
                self.skipped,
                self.rows_per_s,
                eta,
            )

    def summary(self) -> dict:
        return {
            "rows_total": self.total,
            "rows_skipped": self.skipped,
            "rows_written": self.done,
            "seconds": time.perf_counter() - self.start,
            "rows_per_s": self.rows_per_s,
        }


def on_terminal() -> bool:
    """Whether this process's console lines reach a terminal: ``RAYCOMPAT_CONSOLE`` where set
    (a job's driver sets it for its Ray workers), else whether stderr is a terminal."""
    said = os.environ.get(CONSOLE_ENV)
    if said is not None:
        return said == TERMINAL
    return sys.stderr.isatty()


class Ticker:
    """The steps of one loop of ``total`` steps (a run's epochs, a sweep's trials) on the
    console: on a terminal, a progress bar (``bar``, a tqdm-like factory) and the last step's
    line; elsewhere, the first step's line (the loop is running, at this pace), then a step's
    line when ``every_s`` seconds have passed since the last line, and always the last step's
    line. Thirty epochs of a few seconds in all are two lines, not thirty. With
    ``every_step``, every step's line is logged (a sweep's trials: each line is a result), the
    bar below them where there is one.

    Args:
        logger: where the lines go (INFO).
        total: steps of the loop; desc: the bar's label; unit: what a step is.
        bar: ``bar(total=..., desc=..., unit=...)`` returning an object with ``update(n)``,
            ``set_description(text)`` and ``close()`` (``tqdm.tqdm``, or Ray's
            ``tqdm_ray.tqdm``, whose bars the job's driver draws); None: lines whatever the
            console.
        terminal: whether the console is a terminal (default :func:`on_terminal`).
    """

    def __init__(
        self,
        logger: logging.Logger,
        total: int,
        desc: str,
        unit: str = "it",
        every_s: float = LINE_EVERY_S,
        every_step: bool = False,
        bar: Callable | None = None,
        terminal: bool | None = None,
    ) -> None:
        self.log, self.every_s, self.every_step = logger, every_s, every_step
        terminal = on_terminal() if terminal is None else terminal
        shown = bar is not None and terminal and total > 0
        self.bar = bar(total=total, desc=desc, unit=unit) if shown else None
        self._last: float | None = None  # when the last line was logged

    def step(self, line: str, last: bool = False, status: str | None = None) -> bool:
        """One step done, ``line`` its console line, ``last`` whether the loop ends with it;
        ``status`` the bar's label from here on (default: unchanged). Returns whether
        ``line`` was logged."""
        now = time.perf_counter()
        if self.bar is not None:
            if status is not None:
                self.bar.set_description(status)
            self.bar.update(1)
            logged = last or self.every_step  # the bar shows the others
        else:
            due = self._last is None or now - self._last >= self.every_s
            logged = last or self.every_step or due
        if logged:
            self._last = now
            self._log(line)
        if last:
            self.close()
        return logged

    def _log(self, line: str) -> None:
        if self.bar is None:
            self.log.info("%s", line)
            return
        from tqdm import tqdm  # imported by the bar's maker already

        with tqdm.external_write_mode():  # this process's bars cleared around the line
            self.log.info("%s", line)

    def close(self) -> None:
        """End the bar (also of a loop that stops early, or fails); a no-op without one."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Ticker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
