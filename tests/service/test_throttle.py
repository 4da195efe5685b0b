"""A warning repeated each poll is let through once a minute or when it changes (issue 42,
item 5: a corrupt store logged the same line every second)."""

from __future__ import annotations

from raycompat.service.throttle import Throttle


def test_a_repeated_message_is_let_through_on_a_change_after_a_minute_or_once_forgotten():
    now = [0.0]
    throttle = Throttle(every_s=60, clock=lambda: now[0])
    assert throttle.due("g/m1", "corrupt") and not throttle.due("g/m1", "corrupt")
    assert throttle.due("g/m2", "corrupt")  # another key
    now[0] = 59.0
    assert not throttle.due("g/m1", "corrupt")
    assert throttle.due("g/m1", "missing")  # a change
    now[0] = 119.5
    assert throttle.due("g/m1", "missing") and not throttle.due("g/m1", "missing")
    throttle.forget("g/m1")  # it recovered: its next failure is news
    assert throttle.due("g/m1", "missing")
