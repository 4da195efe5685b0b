"""raycompat/upgrade/feature_cache.py: the matrix's rows in the order the models joined, and a
published model's features kept once, whole, for reruns."""

from __future__ import annotations

import numpy as np

from raycompat.upgrade.feature_cache import FeatureCache


def test_rows_keep_their_place_and_a_kept_file_is_written_once(tmp_path):
    cache = FeatureCache(str(tmp_path / "features"))
    first, second = np.zeros((3, 2), np.float32), np.ones((3, 4), np.float32)
    cache.add("m1", first)
    cache.add("m2", second)
    cache.add("m1", first + 1)  # a known model keeps its place
    assert cache.order == list(cache) == ["m1", "m2"] and len(cache) == 2
    assert "m1" in cache and "m3" not in cache and cache["m1"][0, 0] == 1
    assert cache.cached("m1") is None and not cache.is_cached("m1")
    cache.keep("m1", first)
    cache.keep("m1", second)  # kept already: the first numbers stay
    np.testing.assert_array_equal(cache.cached("m1"), first)
    assert sorted(p.name for p in (tmp_path / "features").iterdir()) == ["m1.npy"]
    planar = cache.planar([0, 1, 1])
    assert list(planar) == ["m1"] and planar["m1"][1].tolist() == [0, 1, 1]
