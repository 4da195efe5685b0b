"""Seeded augmentations keep shapes and values, and repeat under the same seed."""

import pytest
import torch

from raycompat.data.augment import AUGMENTATIONS


@pytest.mark.parametrize("name", AUGMENTATIONS.names())
def test_augmentations_keep_the_shape_and_repeat_under_a_seed(name):
    image = torch.rand(3, 32, 32)
    fn = AUGMENTATIONS.get(name)
    a = [fn(image, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert a[0].shape == image.shape
    torch.testing.assert_close(a[0], a[1])


def test_flip_mirrors_or_keeps_the_image():
    image = torch.arange(12.0).reshape(1, 3, 4)
    outs = {
        tuple(AUGMENTATIONS.get("flip")(image, torch.Generator().manual_seed(s)).flatten().tolist())
        for s in range(20)
    }
    assert outs == {tuple(image.flatten().tolist()), tuple(image.flip(-1).flatten().tolist())}


def test_crop_flip_shifts_by_at_most_the_padding():
    image = torch.zeros(1, 8, 8)
    image[0, 4, 4] = 1.0
    for seed in range(30):
        out = AUGMENTATIONS.get("crop_flip")(image, torch.Generator().manual_seed(seed))
        if out.sum() == 1:  # the bright pixel stayed inside the crop
            r, c = (int(v) for v in torch.nonzero(out[0])[0])
            assert abs(r - 4) <= 4 and (abs(c - 4) <= 4 or abs(c - 3) <= 4)
        else:
            assert out.sum() == 0
