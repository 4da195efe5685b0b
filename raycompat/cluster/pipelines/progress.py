"""Progress of a pipeline run: rows done / total, rows/s and ETA, logged at most every N s."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)


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
            logger.info(
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
