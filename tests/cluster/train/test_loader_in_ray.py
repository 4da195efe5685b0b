"""The training loader's processes inside a Ray worker (started as Ray Train workers start them)
decode exactly what the training process decodes alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raycompat.cluster.train.loop import START_METHOD
from raycompat.data.synthetic import SyntheticIdentities
from raycompat.train.data import sampler_batches


def batches(workers: int, start_method: str | None):
    from raycompat.train.loader import BatchLoader

    data = SyntheticIdentities(5, 6, image_size=10, seed=1)
    targets = torch.from_numpy(data.labels)
    loader = BatchLoader(data, "crop_flip", workers, torch.device("cpu"), start_method)
    out = []
    for epoch in (0, 1):
        new, replay = np.arange(6, 30), np.arange(6)
        for batch, rows in sampler_batches(
            data, targets, new, replay, 8, epoch, 2, 0, 1, "crop_flip", loader
        ):
            out.append((rows, batch.images))
    return out


@pytest.mark.ray
def test_loader_processes_in_a_ray_worker_decode_what_the_worker_would(ray_local):
    remote = ray_local.remote(num_cpus=1)(batches)
    got = ray_local.get(remote.remote(2, START_METHOD), timeout=300)
    want = batches(0, None)
    assert len(got) == len(want) == 12  # 24 rows, 4 new + 4 replay a batch, 2 epochs
    for (rows, images), (want_rows, want_images) in zip(got, want, strict=True):
        assert np.array_equal(rows, want_rows) and torch.equal(images, want_images)
