"""The one mixed-precision rule (raycompat/precision.py): bf16 autocast on CUDA only."""

from __future__ import annotations

import pytest
import torch

from raycompat.precision import autocast, autocast_dtype


@pytest.mark.parametrize(
    "precision, device, want",
    [
        ("auto", "cuda", torch.bfloat16),
        ("bf16", "cuda", torch.bfloat16),
        ("fp32", "cuda", None),
        ("auto", "cpu", None),
        ("bf16", "cpu", None),  # training's default: fp32 on a CPU, as the CPU reference
        ("fp32", "cpu", None),
    ],
)
def test_bf16_autocast_runs_on_cuda_only(precision, device, want):
    assert autocast_dtype(precision, torch.device(device)) is want


def test_an_unknown_precision_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"one of auto, fp32, bf16, got 'fp16'"):
        autocast_dtype("fp16", "cpu")


def test_on_cpu_the_autocast_context_leaves_fp32_matmuls_fp32():
    a = torch.randn(4, 4)
    with autocast("bf16", "cpu"):
        assert (a @ a).dtype == torch.float32
