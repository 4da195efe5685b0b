"""Pairs from a seeded sample of a stored version, re-embedded on Ray tasks, against an
in-process reference: the same rows, the same statistics, whatever the chunking.

Gallery: 300 MNIST-5k digits; v1 holds LeNet++ m1's unit features (computed in process), the
new model m2 another LeNet++ of another width. 3 files of 50-row groups.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F

from raycompat.cluster.pipelines import RunOptions, SourceSpec
from raycompat.cluster.pipelines.pairs import sample_fraction, sample_pair_statistics
from raycompat.cluster.pipelines.selection import random_keys
from raycompat.data import create_dataset
from raycompat.store import GalleryStore, VersionInfo, embedding_table
from raycompat.train.export import load_exported_model
from raycompat.transformations import PairsError, PairStatistics, fit_procrustes
from tests.cluster.pipelines.test_partial_backfill import lenet

D_OLD, D_NEW, ROWS = 8, 6, 300
IMAGES = SourceSpec(kind="dataset", name="mnist5k", options={"per_class": 30})
RUN = RunOptions(rows_per_file=50, batch_size=32, actors=2, progress_every_s=1)


def raw_features(model_dir: str, images: torch.Tensor) -> np.ndarray:
    model = load_exported_model(model_dir)[0]
    with torch.no_grad():
        return model.forward_features(images).numpy()


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pairs")
    dataset = create_dataset(IMAGES.name, **IMAGES.options)
    images = dataset.batch(np.arange(len(dataset)))
    m1, m2 = lenet(tmp / "m1", D_OLD, 1), lenet(tmp / "m2", D_NEW, 2)
    old = F.normalize(torch.from_numpy(raw_features(m1, images)), dim=1).numpy()
    store = GalleryStore(str(tmp / "store"))
    staging = store.begin("g", VersionInfo("v1", "m1", D_OLD, True, "v1 = extract(m1)"), "init")
    for k, rows in enumerate(np.array_split(np.arange(ROWS), 3)):
        staging.write_table(embedding_table(rows, old[rows]), f"in-{k}.parquet", row_group_size=50)
    staging.commit(expected_rows=ROWS)
    return {"store": store, "m2": m2, "old": old, "new": raw_features(m2, images)}


def test_the_sample_is_a_function_of_the_id_and_the_seed_alone():
    """A row is sampled when its seeded key (the partial backfill's ``random_keys``) is below
    ``pairs / rows``: the same for a slice of the ids, about ``pairs`` rows, another sample for
    another seed, every row from ``pairs >= rows`` on."""
    ids = pa.array(np.arange(20_000, dtype=np.int64))
    keys = random_keys(ids, seed=3)
    assert keys.dtype == np.float64 and 0 <= keys.min() and keys.max() < 1
    assert np.array_equal(keys[5000:6000], random_keys(ids.slice(5000, 1000), seed=3))
    kept = keys < sample_fraction(1000, len(ids))
    assert 850 <= kept.sum() <= 1150  # 1000 expected, binomial sd ~31
    other = random_keys(ids, seed=4) < sample_fraction(1000, len(ids))
    assert (kept & other).sum() < 150  # another seed, another sample (~50 shared by chance)
    assert sample_fraction(20_000, 20_000) == sample_fraction(50_000, 20_000) == 1.0
    assert (keys < 1.0).all()  # so a fraction of 1.0 keeps every row
    with pytest.raises(ValueError, match="pairs must be >= 1"):
        sample_fraction(0, 10)


def reference(gallery, pairs: int | None, seed: int, exclude=(), fraction=None) -> np.ndarray:
    ids = np.arange(ROWS, dtype=np.int64)
    fraction = fraction or sample_fraction(pairs, ROWS - len(exclude))
    chosen = random_keys(pa.array(ids), seed) < fraction
    return ids[chosen & ~np.isin(ids, exclude)]


def test_ray_tasks_give_the_statistics_of_the_sampled_pairs(gallery, ray_local):
    rows = reference(gallery, 120, seed=0)
    stats, x, y = sample_pair_statistics(
        gallery["store"], "g", "v1", IMAGES, gallery["m2"], pairs=120, keep_rows=True, run=RUN
    )
    expected = PairStatistics.of(gallery["new"][rows], gallery["old"][rows])
    assert stats.count == len(rows) and 80 <= len(rows) <= 160
    np.testing.assert_allclose(stats.cross, expected.cross, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.gram, expected.gram, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x, gallery["new"][rows], rtol=1e-5, atol=1e-6)  # part order
    np.testing.assert_allclose(y, gallery["old"][rows], rtol=1e-6)
    assert fit_procrustes(stats).pairs == len(rows)


def test_the_gallery_direction_and_other_chunks_excluding_rows(gallery, ray_local):
    """Chunks of another size sample the same rows; excluded ids are never sampled; the gallery
    direction swaps the sides; without ``keep_rows`` only the statistics come back."""
    exclude = np.arange(0, ROWS, 3)
    rows = reference(gallery, 150, seed=7, exclude=exclude)
    run = dataclasses.replace(RUN, rows_per_file=100, actors=1)
    stats, x, y = sample_pair_statistics(
        gallery["store"], "g", "v1", IMAGES, gallery["m2"], pairs=150, seed=7,
        direction="gallery", gram=False, exclude=exclude, run=run,
    )  # fmt: skip
    expected = PairStatistics.of(gallery["old"][rows], gallery["new"][rows], gram=False)
    assert (x, y, stats.gram) == (None, None, None) and stats.count == len(rows)
    np.testing.assert_allclose(stats.cross, expected.cross, rtol=1e-5, atol=1e-6)


def test_a_fraction_samples_that_share_of_the_rows(gallery, ray_local):
    """``map.pairs_fraction``: a row is kept when its key is below the fraction itself."""
    rows = reference(gallery, None, seed=2, fraction=0.25)
    stats, _, _ = sample_pair_statistics(
        gallery["store"], "g", "v1", IMAGES, gallery["m2"], fraction=0.25, seed=2, run=RUN
    )
    expected = PairStatistics.of(gallery["new"][rows], gallery["old"][rows])
    assert stats.count == len(rows) and 50 <= len(rows) <= 100  # 75 expected
    np.testing.assert_allclose(stats.cross, expected.cross, rtol=1e-5, atol=1e-6)
    for budget, message in [
        ({"pairs": 10, "fraction": 0.5}, "give pairs or fraction, not both or neither"),
        ({}, "give pairs or fraction, not both or neither"),
        ({"fraction": 1.5}, r"fraction must be in \(0, 1\], got 1.5"),
    ]:
        with pytest.raises(ValueError, match=message):
            sample_pair_statistics(gallery["store"], "g", "v1", IMAGES, gallery["m2"], **budget)


def test_a_sample_with_no_row_is_one_error(gallery, ray_local):
    with pytest.raises(PairsError, match="the sample of version v1 holds no row"):
        sample_pair_statistics(
            gallery["store"], "g", "v1", IMAGES, gallery["m2"], pairs=ROWS,
            exclude=np.arange(ROWS), run=RUN,
        )  # fmt: skip
    with pytest.raises(ValueError, match="direction must be one of query, gallery"):
        sample_pair_statistics(
            gallery["store"], "g", "v1", IMAGES, gallery["m2"], pairs=10, direction="up"
        )


def test_the_join_on_ray_tasks_finds_the_rows_the_scan_in_process_finds(ray_local, gallery):
    """``raycompat adapt --runner ray``'s join: one task per chunk of the version (one per
    file here, three), each keeping only its matches, gives the scan's rows; the ids no row
    holds are missing alike."""
    from raycompat.cluster.pipelines.pairs import stored_matches
    from raycompat.serving.stored_rows import embeddings_of

    store, ids = gallery["store"], [299, 3, 150, 49, 50]
    local, missing = embeddings_of(store, "g", "v1", ids)
    on_ray, missing_ray = embeddings_of(store, "g", "v1", ids, stored_matches)
    assert missing == missing_ray == []
    np.testing.assert_array_equal(on_ray, local)
    np.testing.assert_allclose(on_ray, gallery["old"][ids], atol=1e-6)
    assert embeddings_of(store, "g", "v1", [3, 999, 1000], stored_matches) == (None, [999, 1000])
