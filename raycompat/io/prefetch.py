"""Read ahead: run an iterator in a background thread, a bounded number of items ahead.

    for ids, images, labels in prefetch(source.batches(chunk, ...)):
        model(images)  # the next batch is read and decoded meanwhile

An extraction actor reads, decodes and resizes batch k+1 while the model runs on batch k:
decoders (libjpeg, Pillow) and torch ops release the GIL, so the two overlap on a node's cores
(on a GPU node, CPU decoding hides behind the forward pass); the Delta export reads and casts
the next batch while pyarrow's writer encodes this one. Memory: the consumer's item, at
most ``depth`` queued, and the one being produced. An error in the iterator is raised in the
consumer, at the item where it happened; a consumer that stops early (its own error, a
``break``) stops the thread and closes the iterator. No Ray here.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()
_POLL_S = 0.1


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def prefetch(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Yield ``items`` in order, produced by a daemon thread up to ``depth`` items ahead."""
    if depth < 1:
        raise ValueError(f"prefetch depth must be >= 1, got {depth}")
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as error:  # handed to the consumer, which raises it
            put(_Failed(error))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # e.g. a generator holding an open Parquet file

    thread = threading.Thread(target=produce, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = ready.get(timeout=_POLL_S)
            except queue.Empty:
                if not thread.is_alive() and ready.empty():
                    raise RuntimeError("prefetch thread ended without a result") from None
                continue
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()
