"""A store whose serving records the tests change under a running service: gallery g with v1
(m1), v2 and v3 (m2), v4 (m1), 20 rows of width 4 each (l2); m1, m2 and m3 query v1 by their
grants, and m2 may be promoted to v2 or v3 (tests/store/test_aliases.py)."""

from __future__ import annotations

import pytest

from raycompat.store import GalleryStore
from tests.store import test_aliases
from tests.store.test_aliases import served_copy

served_template = test_aliases.served_template  # the session's template store, a fixture


@pytest.fixture
def store(served_template, tmp_path) -> GalleryStore:
    return GalleryStore(served_copy(served_template, tmp_path))
