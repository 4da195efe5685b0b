"""``ddp``: every rank holds the whole model; gradients are averaged by DistributedDataParallel.

The default, and the right choice whenever the model and its optimizer state fit on one device.
With one process (or no process group) the model is used unwrapped.

Checkpoint (rank 0 only, every rank holds the same values): ``model.safetensors`` (the
``CompatModel`` state dict) and ``optimizer.pt`` (the optimizer state dict, read back with
``torch.load(weights_only=True)``, which refuses pickles that would run code).
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file, save_file
from torch.nn.parallel import DistributedDataParallel

from raycompat.parallel.base import (
    STRATEGIES,
    Prepared,
    Strategy,
    cpu_copy,
    rank,
    trainable,
    world_size,
)

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"


class DDPPrepared(Prepared):
    strategy_name = "ddp"

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        if rank() != 0:
            return None
        return cpu_copy(self.model.state_dict())

    def _save_shards(self, directory: str) -> None:
        if rank() != 0:
            return
        # safetensors refuses non-contiguous tensors (channels-last convolution weights).
        weights = {k: v.contiguous() for k, v in self.full_state_dict().items()}
        save_file(weights, os.path.join(directory, MODEL_FILE))
        torch.save(self.optimizer.state_dict(), os.path.join(directory, OPTIMIZER_FILE))

    def _load_shards(self, directory: str) -> None:
        weights = load_file(os.path.join(directory, MODEL_FILE), device="cpu")
        # load_state_dict copies into the existing parameters, so memory format and DDP's
        # references to them are kept.
        self.model.load_state_dict(weights, strict=True)
        optimizer_state = torch.load(
            os.path.join(directory, OPTIMIZER_FILE), map_location=self.device, weights_only=True
        )
        self.optimizer.load_state_dict(optimizer_state)


@STRATEGIES.register("ddp")
class DDPStrategy(Strategy):
    """Args:
    find_unused_parameters: passed to DDP; needed only when some trainable parameters get no
        gradient in a step (it costs an extra graph traversal).
    """

    name = "ddp"

    def __init__(self, find_unused_parameters: bool = False) -> None:
        self.find_unused_parameters = find_unused_parameters

    def _wrap(self, model, make_optimizer, device, precision, channels_last) -> Prepared:
        module = model
        if world_size() > 1:
            module = DistributedDataParallel(
                model,
                device_ids=[device] if device.type == "cuda" else None,
                find_unused_parameters=self.find_unused_parameters,
            )
        optimizer = make_optimizer(trainable(model))
        return DDPPrepared(module, model, optimizer, device, precision, channels_last)
