"""Query images embedded with a model the store holds: the one part of a search that runs it.

:func:`embed_as` fetches the store's model (its files copied out first from an S3 store) and
:func:`embed_images` runs the exported model (``train/export.py``) on the image files, read as
its backbone was built (channels and size); an image of another size is resized, with a note. A
model registered without weights (adopted) cannot embed: ``NoWeightsError``. torch loads inside
:func:`embed_images`, so a search with vectors never imports it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from raycompat.store import GalleryStore
from raycompat.store.catalog.models import Catalog


def embed_as(
    store: GalleryStore, model: str, images: list[str], on_note: Callable[[str], None] | None
) -> np.ndarray:
    """``(len(images), d)`` features of the image files with the store's ``model``
    (:func:`embed_images`; its files copied out first from an S3 store).

    Raises:
        NoWeightsError: the model was registered without weights (adopted).
    """
    catalog = Catalog(store)
    catalog.weights_of(model, "embed query images")
    uri = catalog.model_uri(model)  # a store-relative uri resolves against the store's root
    if Path(uri).is_dir():
        return embed_images(uri, images, on_note)
    with tempfile.TemporaryDirectory() as local:  # files in an S3 store: copy them out first
        return embed_images(catalog.fetch_model_files(model, local), images, on_note)


def embed_images(
    model_uri: str, paths: list[str], on_note: Callable[[str], None] | None = None
) -> np.ndarray:
    """``(len(paths), d)`` features of the images with the exported model at ``model_uri``,
    read as the model's backbone was built (channels and size), unnormalised. An image of
    another size is resized (bilinear), and ``on_note`` gets one line naming those resized."""
    import torch

    from raycompat.data.image_folder import read_image
    from raycompat.engine import embed
    from raycompat.train.export import load_exported_model

    model, _ = load_exported_model(model_uri)
    # Backbones record the input they were built for; others take RGB at the stored size.
    channels = getattr(model.backbone, "in_chans", 3)
    size = getattr(model.backbone, "image_size", None)
    hw = (size, size) if isinstance(size, int) else size
    if hw is not None and on_note is not None:
        note = _resized_note(paths, tuple(hw))
        if note:
            on_note(note)
    images = torch.stack(
        [read_image(p, mode="L" if channels == 1 else "RGB", size=hw) for p in paths]
    )
    return embed(model.forward_features, images, normalize=False).numpy()


def _resized_note(paths: list[str], hw: tuple[int, int]) -> str | None:
    """One line naming the images whose stored size is not ``hw`` (H, W), or None. Only the
    headers are read."""
    from PIL import Image

    other = []
    for path in paths:
        try:
            with Image.open(path) as image:
                w, h = image.size
        except OSError:
            continue  # read_image names an unreadable file
        if (h, w) != tuple(hw):
            other.append(f"{path} ({h} x {w})")
    if not other:
        return None
    return (
        f"resized {len(other)} of {len(paths)} query image(s) to {hw[0]} x {hw[1]} (H x W), "
        f"the model's input size: {', '.join(other)}"
    )
