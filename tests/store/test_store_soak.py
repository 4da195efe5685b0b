"""A short seeded run of the store soak (benchmarks/store_soak.py; issue 37): real writer
processes stopped at the store's commit steps past their lease, killed and aborting, with gc
running and paused in its own process, on local disk. After every trial no listed file may be
missing or changed, no user file inside the store root touched, and every error one line from
a RaycompatError. The longer soak, on local disk and the moto S3 server, is the benchmark's CLI
(benchmarks/README.md: 100 trials each, 0 lost); S3 here would add two minutes to the suite."""

from __future__ import annotations

import pytest

from tests.benchmarks import benchmark_modules

TRIALS = 12  # ~3 s each (stalls of 0.5-5 s): half a minute on 2 cores; more: the benchmark


@pytest.fixture(scope="module")
def soak():
    yield from benchmark_modules("store_soak")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local"], indirect=True)  # S3: benchmarks/store_soak.py
def test_no_published_file_or_user_file_is_lost_and_every_error_is_one_line(soak, where, tmp_path):
    root, options = where
    result = soak.run_soak(root, options, trials=TRIALS, seed=37, logs=tmp_path / "logs")
    examples = result["examples"]
    assert result["trials"] == TRIALS
    assert result["lost"] == 0, examples["lost"]
    assert result["foreign_deleted"] == 0, examples["foreign_deleted"]
    assert result["bad_errors"] == 0, examples["bad_errors"]
    # it exercised something: versions were published and writers were refused
    assert result["published"] > 0 and sum(result["refused"].values()) > 0, result
