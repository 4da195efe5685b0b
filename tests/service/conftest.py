"""A store whose serving records the tests change under a running service: gallery g with v1
(m1), v2 and v3 (m2), v4 (m1), 20 rows of width 4 each (l2); m1, m2 and m3 query v1 by their
grants, and m2 may be promoted to v2 or v3 (tests/serving/test_served_log.py)."""

from __future__ import annotations

import glob

import pytest

from raycompat.store import GalleryStore
from tests.serving import test_served_log
from tests.serving.test_served_log import served_copy

served_template = test_served_log.served_template  # the session's template store, a fixture


@pytest.fixture
def store(served_template, tmp_path) -> GalleryStore:
    return GalleryStore(served_copy(served_template, tmp_path))


def corrupt(store: GalleryStore, version: str) -> None:
    """Overwrite the Parquet files of ``g/version``: the size its record names no longer
    matches, so it cannot be loaded (its records stay readable)."""
    parts = glob.glob(f"{store.root}/g/_data/{version}/**/*.parquet", recursive=True)
    assert parts
    for part in parts:
        with open(part, "wb") as out:
            out.write(b"not parquet")
