"""A warning that repeats every poll, logged once per minute or when it changes.

The watcher retries every ``poll_s`` (1 s by default) what it could not read or load, so a
store with a corrupt file would log the same line every second for as long as it stays
corrupt. :class:`Throttle` lets a line through when its key has not logged it before, when its
message differs from the last one let through, or when ``every_s`` has passed since; a key that
recovers is forgotten (:meth:`forget`), so its next failure is logged at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

EVERY_S = 60.0


class Throttle:
    """Which repeated messages to log (see the module docstring); thread-safe."""

    def __init__(self, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.every_s, self.clock = every_s, clock
        self._last: dict[Hashable, tuple[str, float]] = {}  # key -> (message, when let through)
        self._lock = threading.Lock()

    def due(self, key: Hashable, message: str) -> bool:
        """Whether to log ``message`` for ``key`` now (and, if so, remember it)."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and last[0] == message and now - last[1] < self.every_s:
                return False
            self._last[key] = (message, now)
            return True

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._last.pop(key, None)
