"""The thread that follows the store: :meth:`Served.refresh` (every route of a service) or
:meth:`Served.poll` of one route (a gallery handle, ``gallery.py``) every ``poll_s`` seconds.

A poll reads only serving records (galleries, grants, alias-log listings, tombstones) and
loads an index only for a pair whose records changed. A failed poll is logged (once a minute,
or when its error changes: ``throttle.py``) and the next one tries again; what was served
stays served.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from raycompat.service.throttle import Throttle

logger = logging.getLogger(__name__)


class Watcher:
    """Calls ``poll`` every ``poll_s`` seconds between :meth:`start` and :meth:`stop`."""

    def __init__(self, poll: Callable[[], None], poll_s: float) -> None:
        self.poll, self.poll_s = poll, poll_s
        self._stop = threading.Event()
        self._warned = Throttle()
        self._thread = threading.Thread(target=self._run, name="raycompat-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop polling; waits for a poll under way, unless called from the poll itself."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=max(10.0, 2 * self.poll_s))

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as error:  # a poll must never end the watcher: the next one retries
                if self._warned.due("poll", repr(error)):
                    logger.exception("polling the serving records failed; retried each poll")
            else:
                self._warned.forget("poll")
