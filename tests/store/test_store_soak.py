"""A short seeded run of the store soak (benchmarks/store_soak.py; issue 37): real writer
processes stopped at the store's commit steps past their lease, killed and aborting, with gc
running and paused in its own process, on local disk and on the moto S3 server. After every
trial no listed file may be missing or changed, no user file inside the store root touched,
and every error one line from a RaycompatError. The longer soak is the benchmark's CLI."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 20  # ~4 s each (stalls of 0.5-5 s): about 80 s per backend on 2 cores


@pytest.fixture(scope="module")
def soak():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        yield importlib.import_module("store_soak")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


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
