"""Progress lines of long work: stage announcements, one line before each stage of a long job
with an ETA once known, and row counts of a pipeline run (:class:`Progress`).

    [2/3] m2: training dsimplex_hoc against m1 (4 epochs)
    [2/3] m2: scoring against m1
    [5/9] bct step 2: training on 7 digits (2800 images), 4 epochs | ETA 410s

The upgrade job (``raycompat.cluster.upgrade.job``) and the pure-PyTorch demo
(``raycompat.cli.demo``) announce their stages through :class:`Stages`; the line is logged
before the work starts, so the console says what is running, not what has finished. Plain
log lines whatever the terminal: one line per stage in a file, a CI log or a ``ray job logs``
stream alike. Ray-free (docs/architecture.md).
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("raycompat.progress")
rows_log = logging.getLogger("raycompat.progress.rows")  # a pipeline's row counts


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
