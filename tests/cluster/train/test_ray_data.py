"""Ray Data training input (raycompat/cluster/train/ray_data.py): what a worker trains on does not
depend on the order in which Ray delivers blocks, nor on which actor decoded a row."""

from __future__ import annotations

import numpy as np
import torch

from raycompat.cluster.train.ray_data import (
    decode_pool_size,
    id_ordered_batches,
    in_id_order,
    rows_dataset,
)
from raycompat.config.train import DataSpec


def _parts(rows: np.ndarray, sizes: list[int]) -> list[dict[str, torch.Tensor]]:
    """``rows`` cut into consecutive batches of ``sizes``; image = row id, target = row % 3."""
    out, start = [], 0
    for size in sizes:
        chunk = torch.from_numpy(rows[start : start + size])
        out.append({"image": chunk.float()[:, None] * 10, "target": chunk % 3, "row": chunk})
        start += size
    return out


def _epoch(parts, seed: int = 7) -> list[dict[str, torch.Tensor]]:
    return list(id_ordered_batches(parts, 4, torch.Generator().manual_seed(seed)))


def _assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for key in ("image", "target", "row"):
            torch.testing.assert_close(x[key], y[key], rtol=0, atol=0)


def test_batches_do_not_depend_on_block_order_or_sizes():
    rows = np.arange(11, dtype=np.int64)
    shuffled = np.random.default_rng(0).permutation(rows)
    first = _epoch(_parts(rows, [11]))
    second = _epoch(_parts(shuffled, [3, 5, 2, 1]))
    _assert_same(first, second)
    assert [len(b["row"]) for b in first] == [4, 4, 3]  # the short last batch is kept
    assert sorted(torch.cat([b["row"] for b in first]).tolist()) == rows.tolist()
    # Rows stay with their own image and target.
    for batch in first:
        torch.testing.assert_close(batch["image"][:, 0], batch["row"].float() * 10)
    # The seed, not the arrival order, decides the batch order.
    assert torch.cat([b["row"] for b in _epoch(_parts(rows, [11]), seed=8)]).tolist() != (
        torch.cat([b["row"] for b in first]).tolist()
    )
    assert len(in_id_order([])["row"]) == 0


def test_decoded_rows_are_the_same_whatever_the_block_order_and_actors(ray_local):
    """Two Ray Data pipelines over the same rows, one in id order through one actor in batches
    of 16, one in a shuffled order through two actors in batches of 5: after the worker's id
    ordering the images (randomly flipped per row), targets and rows are identical."""
    spec = DataSpec(name="mnist5k", augment="flip")
    rows = np.arange(0, 400, 10, dtype=np.int64)
    targets = np.arange(5000, dtype=np.int64) % 7
    shuffled = np.random.default_rng(1).permutation(rows)
    streams = []
    for order, actors, batch in ((rows, 1, 16), (shuffled, 2, 5)):
        dataset = rows_dataset(spec, order, targets, seed=3, actors=actors, batch_size=batch)
        streams.append(list(dataset.iter_torch_batches(batch_size=7)))
    arrived = [torch.cat([p["row"] for p in s]).tolist() for s in streams]
    assert arrived[0] != arrived[1]  # the inputs really came in different orders
    _assert_same(_epoch(streams[0]), _epoch(streams[1]))
    share = in_id_order(streams[1])
    assert share["row"].tolist() == rows.tolist()
    assert share["target"].tolist() == (rows % 7).tolist()
    # MNIST decodes to uint8 and is handed over so (a quarter of the bytes); widened, each row is
    # the per-image path's image, flipped with draws from (seed, row) alone.
    from raycompat.data import create_dataset
    from raycompat.data.augment import AUGMENTATIONS
    from raycompat.data.base import uint8_batch_to_tensor

    assert share["image"].dtype == torch.uint8
    images = uint8_batch_to_tensor(share["image"])
    dataset, flip = create_dataset("mnist5k"), AUGMENTATIONS.get("flip")
    expected = [
        flip(dataset[int(r)][0], torch.Generator().manual_seed(3 * 1_000_003 + int(r)))
        for r in rows
    ]
    assert torch.equal(images, torch.stack(expected))
    plain = torch.stack([dataset[int(r)][0] for r in rows])
    flipped = ~torch.isclose(images, plain).flatten(1).all(dim=1)
    assert 0 < int(flipped.sum()) < len(rows)  # the flips happened


def test_the_decode_pool_takes_every_cpu_the_training_workers_leave():
    assert decode_pool_size(16, 1, 1) == 15  # one GPU node, one training worker
    assert decode_pool_size(64, 4, 8) == 32
    assert decode_pool_size(2, 2, 1) == 1  # at least one
    assert decode_pool_size(4, 1, 2.5) == 1


def test_a_cluster_with_no_cpu_left_for_decoding_is_named_before_the_run_waits(
    ray_local, tmp_path, caplog
):
    """Training workers holding every CPU of the cluster leave the decode actors none: the run
    would wait for CPUs, so the driver says why first (the session's Ray has 4 CPUs)."""
    from raycompat.cluster.train.driver import ray_datasets
    from raycompat.config import load_config
    from raycompat.config.train import TrainConfig
    from raycompat.train.data import make_splits, open_dataset
    from raycompat.train.scenarios import plan_steps

    overrides = [
        "data.name=synthetic",
        "data.options={num_classes: 6, images_per_class: 5, image_size: 28, channels: 1}",
        "data.loader=ray_data",
        "model.num_classes=6",
        "scenario.tasks=[3,3]",
        f"run.storage_path={tmp_path}",
    ]
    for cpus, warned in [(2, True), (1, False)]:
        cfg = load_config(
            TrainConfig,
            None,
            [*overrides, "scaling.num_workers=2", f"scaling.cpus_per_worker={cpus}"],
        )
        labels = open_dataset(cfg.data).labels
        caplog.clear()
        with caplog.at_level("WARNING", logger="raycompat.cluster.train.driver"):
            datasets = ray_datasets(cfg, plan_steps(cfg)[0], labels, make_splits(cfg, labels))
        assert set(datasets) == {"train"}  # lazy: nothing ran
        assert ("training workers hold 4 of the cluster's 4 CPUs" in caplog.text) is warned
    # data.decode_actors sizes the pool; data.num_loader_workers (DataLoader processes) does not
    for sizes, actors in [(["data.num_loader_workers=5"], "2"), (["data.decode_actors=3"], "3")]:
        cfg = load_config(TrainConfig, None, [*overrides, "scaling.num_workers=2", *sizes])
        caplog.clear()
        with caplog.at_level("INFO", logger="raycompat.cluster.train.driver"):
            ray_datasets(cfg, plan_steps(cfg)[0], labels, make_splits(cfg, labels))
        assert f"up to {actors} Ray Data decode actor(s)" in caplog.text
