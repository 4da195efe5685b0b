"""The strategy interface: how one training process wraps, steps and checkpoints its model.

A :class:`Strategy` is a small, picklable description (name + options). Inside each worker,
after the default process group exists, ``strategy.setup(model, make_optimizer, device)`` returns
a :class:`Prepared` run: the module to call, the optimizer that really steps, and collective
``save`` / ``load`` / ``full_state_dict``. The training loop is the same for every strategy.

Checkpoint layout shared by all strategies: rank 0 writes ``strategy.json`` (name, world size)
and ``state.json`` (the loop's small state); each strategy adds its own files, named so that the
per-rank directories of one save can be merged into one folder without collisions.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist
from torch import nn

from raycompat.data.base import as_float_images
from raycompat.precision import autocast as precision_autocast
from raycompat.precision import autocast_dtype
from raycompat.registry import Registry

log = logging.getLogger(__name__)

STRATEGIES: Registry = Registry("distributed strategy")
STRATEGY_FILE = "strategy.json"
STATE_FILE = "state.json"

MakeOptimizer = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def world_size() -> int:
    """Processes in the default group; 1 when no process group is initialised."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """Parameters the optimizer may see; frozen ones (``requires_grad=False``) are left out."""
    return [p for p in model.parameters() if p.requires_grad]


def cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached CPU copies, so that an exported state dict never aliases training memory."""
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


class Prepared:
    """A model set up by a strategy in this process.

    Attributes:
        module: call as ``module(images, output="both") -> (features, logits)``.
        model: the inner :class:`~raycompat.nn.models.CompatModel` (``.head``, ``.embed_dim``).
        optimizer: the optimizer that actually steps.
    """

    strategy_name = "base"

    def __init__(self, module, model, optimizer, device, precision, channels_last) -> None:
        self.module = module
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.precision = precision
        self.channels_last = channels_last

    def prepare_inputs(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` images onto the device (non-blocking), channels-last if enabled;
        uint8 images (the ``ray_data`` loader's) are widened to [0, 1] there, after the copy."""
        images = as_float_images(images.to(self.device, non_blocking=True))
        if self.channels_last and images.ndim == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def autocast(self) -> AbstractContextManager:
        """The step's autocast (``raycompat.precision``: bf16 on CUDA only)."""
        return precision_autocast(self.precision, self.device)

    def backward_step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of every parameter group (the loop owns the schedule)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()

    def save(self, directory: str, state: dict) -> None:
        """COLLECTIVE. Write this rank's share of the checkpoint into its local ``directory``."""
        os.makedirs(directory, exist_ok=True)
        if rank() == 0:
            header = {"strategy": self.strategy_name, "world_size": world_size()}
            _write_json(os.path.join(directory, STRATEGY_FILE), header)
            _write_json(os.path.join(directory, STATE_FILE), state)
        self._save_shards(directory)
        barrier()

    def load(self, directory: str) -> dict:
        """COLLECTIVE. Restore model and optimizer from a merged checkpoint; returns its state."""
        self._check_header(directory)
        self._load_shards(directory)
        with open(os.path.join(directory, STATE_FILE)) as f:
            return json.load(f)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """COLLECTIVE. Unsharded CPU ``CompatModel.state_dict()`` on rank 0, None elsewhere."""
        raise NotImplementedError

    def _save_shards(self, directory: str) -> None:
        raise NotImplementedError

    def _load_shards(self, directory: str) -> None:
        raise NotImplementedError

    def _check_header(self, directory: str) -> None:
        path = os.path.join(directory, STRATEGY_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{directory}: no {STRATEGY_FILE}; not a checkpoint written by Prepared.save"
            )
        with open(path) as f:
            header = json.load(f)
        expected = {"strategy": self.strategy_name, "world_size": world_size()}
        for key, value in expected.items():
            if header.get(key) != value:
                raise ValueError(
                    f"{directory}: checkpoint was saved with {key}={header.get(key)!r} but this "
                    f"run uses {key}={value!r}; resume with the same strategy and world size"
                )


class Strategy:
    """Base class: validates the common arguments, places the model, then wraps it.

    With ``channels_last=True`` the inputs are always made channels-last (``prepare_inputs``);
    the parameters too unless ``channels_last_parameters`` is False. A convolution whose input
    is channels-last runs channels-last (cuDNN and oneDNN pick the layout from input or weight),
    so keeping the weights contiguous costs at most a small per-call copy of each weight.
    """

    name = "base"
    channels_last_parameters = True

    def setup(
        self,
        model: nn.Module,
        make_optimizer: MakeOptimizer,
        device: torch.device,
        precision: str = "fp32",
        channels_last: bool = False,
    ) -> Prepared:
        autocast_dtype(precision, device)  # rejects an unknown precision before any work
        device = torch.device(device)
        model.to(device)
        if channels_last and self.channels_last_parameters:
            model.to(memory_format=torch.channels_last)
        return self._wrap(model, make_optimizer, device, precision, channels_last)

    def _wrap(self, model, make_optimizer, device, precision, channels_last) -> Prepared:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def create_strategy(name: str = "ddp", **options) -> Strategy:
    """Build a registered strategy (``ddp``, ``fsdp``, ``deepspeed``) with its options."""
    return STRATEGIES.create(name, **options)


def list_strategies() -> list[str]:
    return STRATEGIES.names()


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
