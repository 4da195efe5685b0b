"""The extraction actors' read-ahead thread: order, overlap, bounded lead, errors, early stop."""

from __future__ import annotations

import threading
import time
from contextlib import closing

import pytest

from raycompat.io.prefetch import prefetch

WAIT_S = 10  # generous: a hang fails the test instead of blocking the suite


def no_prefetch_threads() -> bool:
    deadline = time.monotonic() + WAIT_S
    while any(t.name == "prefetch" for t in threading.enumerate()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_items_come_in_order_and_the_thread_ends():
    assert list(prefetch(iter(range(100)), depth=3)) == list(range(100))
    assert list(prefetch(iter([]))) == []
    assert no_prefetch_threads()


def test_the_next_item_is_produced_while_the_consumer_holds_this_one():
    second_started = threading.Event()

    def items():
        yield 0
        second_started.set()
        yield 1

    for item in prefetch(items()):
        if item == 0:  # without overlap the producer would not start item 1 before we return
            assert second_started.wait(WAIT_S)


def test_the_producer_runs_at_most_depth_plus_one_items_ahead():
    produced = []

    def items():
        for i in range(50):
            produced.append(i)
            yield i

    ready = prefetch(items(), depth=2)
    assert next(ready) == 0
    time.sleep(0.3)
    # item 0 taken, items 1-2 queued, item 3 produced and waiting for room
    assert len(produced) == 4
    ready.close()
    assert no_prefetch_threads()


def test_an_error_in_the_producer_is_raised_in_the_consumer_after_the_good_items():
    def items():
        yield 1
        yield 2
        raise ValueError("cannot decode image gallery.parquet row 17")

    got = []
    with pytest.raises(ValueError, match="row 17"):
        for item in prefetch(items()):
            got.append(item)
    assert got == [1, 2]
    assert no_prefetch_threads()


def test_a_consumer_that_stops_early_stops_the_producer_and_closes_its_iterator():
    closed = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    with pytest.raises(RuntimeError, match="writer failed"):
        with closing(prefetch(endless(), depth=2)) as ready:
            for item in ready:
                if item == 5:
                    raise RuntimeError("writer failed")
    assert closed.wait(WAIT_S)
    assert no_prefetch_threads()


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        next(prefetch(iter([1]), depth=0))
