"""The thread that follows the store: :meth:`Served.refresh` every ``poll_s`` seconds.

A poll reads only serving records (galleries, grants, alias-log listings, tombstones) and
loads an index only for a pair whose records changed. A failed poll is logged (once a minute,
or when its error changes: ``throttle.py``) and the next one tries again; what was served
stays served.
"""

from __future__ import annotations

import logging
import threading

from raycompat.service.served import Served
from raycompat.service.throttle import Throttle

logger = logging.getLogger(__name__)


class Watcher:
    """Polls ``served`` every ``poll_s`` seconds between :meth:`start` and :meth:`stop`."""

    def __init__(self, served: Served, poll_s: float) -> None:
        self.served, self.poll_s = served, poll_s
        self._stop = threading.Event()
        self._warned = Throttle()
        self._thread = threading.Thread(target=self._run, name="raycompat-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=max(10.0, 2 * self.poll_s))

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.served.refresh()
            except Exception as error:  # a poll must never end the watcher: the next one retries
                if self._warned.due("poll", repr(error)):
                    logger.exception("polling the serving records failed; retried each poll")
            else:
                self._warned.forget("poll")
