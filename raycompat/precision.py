"""Mixed precision: the one rule that training, extraction and the transform follow.

bf16 autocast runs on CUDA only. On a CPU every precision setting runs fp32: CPU bf16 kernels
are slower than fp32 ones on most CPUs, and a test run on a laptop computes the same numbers as
the CPU reference. So ``"bf16"`` (training's default) reads "bf16 where it pays", and ``"auto"``
(the pipelines' default) is the same rule under a name that says so.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def autocast_dtype(precision: str, device: torch.device | str) -> torch.dtype | None:
    """The dtype to autocast to for ``precision`` on ``device``; None: plain fp32.

    Raises:
        ValueError: ``precision`` is not one of :data:`PRECISIONS`.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision != "fp32" and torch.device(device).type == "cuda":
        return torch.bfloat16
    return None


def autocast(precision: str, device: torch.device | str) -> AbstractContextManager:
    """An autocast context for ``precision`` on ``device`` (a no-op where it runs fp32)."""
    dtype = autocast_dtype(precision, device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)
