"""Whether faiss works on a GPU here: ``use_gpu`` is ``True``, ``False`` or ``"auto"``.

``"auto"`` uses a GPU when faiss was built with GPU support (faiss-gpu) and one is visible;
``True`` demands one; ``False`` never uses one.
"""

from __future__ import annotations

import faiss


def gpu_available() -> bool:
    """True when this faiss build has GPU support and at least one GPU is visible."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def check_use_gpu(use_gpu: bool | str) -> None:
    if use_gpu not in (True, False, "auto"):
        raise ValueError(f"use_gpu must be True, False or 'auto', got {use_gpu!r}")


def resolve_gpu(use_gpu: bool | str) -> bool:
    """Whether faiss works on a GPU here: ``"auto"`` when one is visible; ``True`` demands one
    (``RuntimeError`` if faiss has none); ``False`` never."""
    check_use_gpu(use_gpu)
    if use_gpu == "auto":
        return gpu_available()
    if use_gpu and not gpu_available():
        raise RuntimeError("use_gpu=True but faiss has no GPU support or no GPU is visible")
    return bool(use_gpu)
