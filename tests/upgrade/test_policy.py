"""Which decisions the policy allows a run to end with (``raycompat/upgrade/policy.py``,
``allowed_by``), and ``--fail-on-refuse``'s exit status built on it (issue 40, item 7): the
shipped history's m2, refused under ``on_incompatible=refuse`` by design, ends with exit 0."""

from __future__ import annotations

import pytest

from raycompat.cli.job_exit import JobExit, exit_of
from raycompat.cli.jobs.upgrade import REFUSED_EXIT, fail_on_refuse
from raycompat.config.upgrade import PolicySpec
from raycompat.upgrade.policy import allowed_by

DEFAULT_HISTORY = {"m1": "initial", "m2": "refuse", "m3": "partial_backfill"}


@pytest.mark.parametrize("action", ["initial", "compatible", "transform", "partial_backfill"])
@pytest.mark.parametrize("on_incompatible", ["refuse", "backfill", "partial_backfill"])
def test_every_publishing_action_is_allowed(action, on_incompatible):
    assert allowed_by(action, PolicySpec(on_incompatible=on_incompatible))
    assert allowed_by("backfill", PolicySpec(on_incompatible=on_incompatible))


def test_a_refusal_is_allowed_only_where_the_policy_refuses_and_a_failure_never():
    assert allowed_by("refuse", PolicySpec(on_incompatible="refuse"))
    assert allowed_by("refuse", PolicySpec(on_incompatible="refuse", max_negative_flip_rate=0.05))
    assert not allowed_by("refuse", PolicySpec(on_incompatible="backfill"))
    assert not allowed_by("refuse", PolicySpec(on_incompatible="partial_backfill"))
    assert not allowed_by("failed", PolicySpec(on_incompatible="refuse"))


def test_fail_on_refuse_exits_0_for_the_default_history():
    fail_on_refuse(DEFAULT_HISTORY, PolicySpec())  # no JobExit: the job returns, exit 0


def test_fail_on_refuse_exits_3_naming_what_the_policy_does_not_allow():
    with pytest.raises(JobExit) as refused:
        fail_on_refuse(DEFAULT_HISTORY, PolicySpec(on_incompatible="backfill"))
    assert exit_of(refused.value) == (
        REFUSED_EXIT,
        "m2 refused (policy.on_incompatible=backfill; --fail-on-refuse)",
    )
    with pytest.raises(JobExit) as failed:
        fail_on_refuse({**DEFAULT_HISTORY, "m3": "failed"}, PolicySpec())
    assert exit_of(failed.value) == (
        REFUSED_EXIT,
        "m3 failed (policy.on_incompatible=refuse; --fail-on-refuse)",
    )
