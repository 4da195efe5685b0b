"""A batch's outputs brought back to the host without waiting for them (the GPU actors' habit).

    pending = copy_to_host([features])   # queued after the forward; the CPU goes on
    ...                                  # write the previous batch, launch the next one
    features, = pending.wait()           # on CUDA the batch's one host sync

On CUDA the outputs go into one pinned host buffer in one asynchronous copy, each output a
contiguous slice of it (so Arrow and NumPy take them without a copy), and an event recorded
after the copy is the one thing :meth:`HostCopy.wait` waits on. On the CPU the outputs are the
tensors themselves: nothing is copied and nothing waits. Used by the transform's and the
extraction's actors, which write batch k while the device computes batch k + 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class HostCopy:
    """Outputs on their way to the host: :meth:`wait` returns them once they are there."""

    tensors: list[torch.Tensor]
    done: torch.cuda.Event | None = None  # recorded after the copy (CUDA only)

    def wait(self) -> list[torch.Tensor]:
        if self.done is not None:
            self.done.synchronize()
        return self.tensors


def copy_to_host(outputs: Sequence[torch.Tensor]) -> HostCopy:
    """Queue ``outputs`` (same dtype, same device) to the host: one copy into a pinned buffer on
    CUDA, the tensors themselves elsewhere."""
    if outputs[0].device.type != "cuda":
        return HostCopy(list(outputs))
    with torch.inference_mode():
        flat = torch.cat([o.reshape(-1) for o in outputs])
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    tensors, start = [], 0
    for o in outputs:
        tensors.append(host[start : start + o.numel()].view(o.shape))
        start += o.numel()
    return HostCopy(tensors, done)
