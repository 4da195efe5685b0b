"""``benchmarks/serve_bench.py``'s judge of answers under swaps (issue 42, item 7): the
versions a request may be answered from, hand-built; and a short swap run that finds no wrong
answer from the service as it is, and finds them when the service only polls."""

from __future__ import annotations

import pytest

from tests.benchmarks import benchmark_modules


@pytest.fixture(scope="module")
def bench():
    yield from benchmark_modules("serve_bench")


def test_allowed_is_what_was_served_at_sending_or_written_while_it_ran(bench):
    Change = bench.Change
    changes = [Change(1.0, 1.1, "v2"), Change(2.0, 2.1, None), Change(3.0, 3.1, "v1")]
    assert bench.allowed(changes, "v1", 0.5, 0.9) == {"v1"}
    assert bench.allowed(changes, "v1", 1.2, 1.9) == {"v2"}
    assert bench.allowed(changes, "v1", 1.05, 1.2) == {"v1", "v2"}  # sent mid-write
    assert bench.allowed(changes, "v1", 1.5, 3.05) == {"v2", None, "v1"}


def test_a_wrong_version_a_mixed_answer_and_a_404_while_served_are_problems(bench):
    answer = {"version": "v2", "hits": [[{"id": bench.OFFSET + 3}, {"id": 4}]]}
    assert bench.answer_problem(answer, 200, {"v2"}).startswith("a mixed answer")
    assert bench.answer_problem(answer, 200, {"v1"}).startswith("version v2")
    assert bench.answer_problem({}, 404, {"v1"}) == "404 while the model was served"
    assert bench.answer_problem({}, 404, {"v1", None}) is None
    good = {"version": "v1", "hits": [[{"id": 3}]]}
    assert bench.answer_problem(good, 200, {"v1"}) is None


ARGS = ["--rows", "500", "--width", "8", "--skip-throughput", "--swap-s", "2.5",
        "--swap-every", "0.25", "--clients", "2"]  # fmt: skip
# Ten changes when the machine is idle; at least one whole cycle (promote or set, rollback,
# revoke, rollback: every kind of change) however busy it is (5 on a loaded 2-core machine).
CYCLE = 4


def test_under_swaps_every_answer_names_what_the_records_served(bench):
    swaps = bench.main(ARGS)["swaps"]
    assert swaps["changes"] >= CYCLE and swaps["answered"] > 0 and swaps["revoked_404"] > 0
    assert (swaps["failed"], swaps["wrong_version"], swaps["mixed"]) == (0, 0, 0), swaps


def test_through_a_named_alias_every_answer_names_what_the_alias_served(bench):
    swaps = bench.main([*ARGS, "--via", "alias"])["swaps"]
    assert swaps["changes"] >= CYCLE and swaps["answered"] > 0 and swaps["revoked_404"] > 0
    assert (swaps["failed"], swaps["wrong_version"], swaps["mixed"]) == (0, 0, 0), swaps


def test_a_service_that_only_polls_answers_from_versions_the_records_left(bench):
    swaps = bench.main([*ARGS, "--poll-only"])["swaps"]
    assert swaps["wrong_version"] > 0 and swaps["failed"] == 0, swaps
