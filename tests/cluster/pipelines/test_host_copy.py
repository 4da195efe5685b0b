"""host_copy.py: a batch's outputs back on the host, waited for only when they are written."""

from __future__ import annotations

import pytest
import torch

from raycompat.cluster.pipelines.host_copy import copy_to_host


def test_on_the_cpu_the_outputs_are_the_tensors_themselves():
    h, g = torch.arange(6.0).view(2, 3), torch.arange(4.0).view(2, 2)
    pending = copy_to_host([h, g])
    assert pending.done is None
    out = pending.wait()
    assert out[0] is h and out[1] is g  # nothing copied, nothing to wait for


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the asynchronous copy needs CUDA")
def test_on_cuda_both_outputs_come_back_in_one_pinned_buffer():
    h = torch.randn(5, 3, device="cuda")
    g = torch.randn(5, 2, device="cuda")
    pending = copy_to_host([h, g])
    out = pending.wait()
    assert pending.done is not None and pending.done.query()
    assert torch.equal(out[0], h.cpu()) and torch.equal(out[1], g.cpu())
    assert all(t.is_pinned() and t.is_contiguous() for t in out)
    assert out[0].untyped_storage().data_ptr() == out[1].untyped_storage().data_ptr()
