"""``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``); parameters, gradients and optimizer
state are sharded across ranks, and each block is all-gathered just for its forward/backward.

Pick it when the model plus optimizer state no longer fits on one device. Every backbone child
that owns parameters becomes one FSDP unit (children of a ``ModuleList``/``ModuleDict``, which
have no ``forward`` for FSDP to hook, become units themselves), then the whole model is the root
unit (it holds the head).

Channels-last: the parameters stay contiguous; only the inputs are converted, which is enough
for the convolutions to run channels-last. ``fully_shard`` refuses non-contiguous parameters
(``NotImplementedError: FSDP does not support non-contiguous parameters``), and converting after
sharding breaks FSDP's flat views of its shards at the first forward (``view size is not
compatible``, torch 2.14). Nor would channels-last weights survive: a forward computes with
views of FSDP's all-gather buffer, which are contiguous.

Checkpoint: a ``torch.distributed.checkpoint`` (DCP) folder. Each rank writes only its shards,
to ``__<rank>_<n>.distcp``; rank 0 also writes ``.metadata``. The per-rank directories of one
save therefore merge into one folder that DCP loads as is (same world size).

``torch.distributed.checkpoint``, ``device_mesh`` and ``fsdp`` are imported inside the methods:
registering the strategy must not cost every Ray Train worker their import (seconds each), and
only an FSDP run uses them.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from torch import nn

from raycompat.parallel.base import (
    STRATEGIES,
    Prepared,
    Strategy,
    cpu_copy,
    rank,
    trainable,
    world_size,
)


def shard_units(backbone: nn.Module) -> list[nn.Module]:
    """The backbone blocks that become FSDP units (see the module docstring)."""
    units = []
    for child in backbone.children():
        blocks = child.children() if isinstance(child, nn.ModuleList | nn.ModuleDict) else [child]
        units.extend(b for b in blocks if any(True for _ in b.parameters()))
    return units


def _broadcast_from_rank0(model: nn.Module) -> None:
    """Make every rank start from rank 0's weights (fully_shard keeps each rank's own slice)."""
    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            dist.broadcast(tensor.data, src=0)


class FSDPPrepared(Prepared):
    strategy_name = "fsdp"

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)
        if rank() != 0:
            return None
        # On CPU, with nothing to gather (one rank), "offloading" hands back the parameters
        # themselves; copy them so that the export does not change as training goes on.
        return cpu_copy(state) if self.device.type == "cpu" else state

    def _save_shards(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optim": optimizer_state}, checkpoint_id=directory)

    def _load_shards(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        # get_state_dict gives the sharded layout (and creates empty optimizer state) for DCP
        # to fill in place.
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optim": optimizer_state}
        dcp.load(state, checkpoint_id=directory)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )


@STRATEGIES.register("fsdp")
class FSDPStrategy(Strategy):
    """Args:
    reshard_after_forward: free gathered parameters after forward (saves memory, costs a
        second all-gather in backward); passed to ``fully_shard``.
    """

    name = "fsdp"
    channels_last_parameters = False  # see the module docstring

    def __init__(self, reshard_after_forward: bool = True) -> None:
        self.reshard_after_forward = reshard_after_forward

    def _wrap(self, model, make_optimizer, device, precision, channels_last) -> Prepared:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if not dist.is_initialized():
            raise RuntimeError(
                "the fsdp strategy needs an initialised default process group "
                "(Ray Train creates it); use strategy 'ddp' for a single process"
            )
        if world_size() > 1:
            _broadcast_from_rank0(model)
        if device.type == "cuda" and device.index is not None:
            # FSDP2 places shards on the *current* CUDA device, whatever the mesh says.
            torch.cuda.set_device(device)
        # An explicit mesh: the default would pick CUDA whenever one is visible, even for a
        # CPU run over gloo.
        mesh = init_device_mesh(device.type, (world_size(),))
        options = {"mesh": mesh, "reshard_after_forward": self.reshard_after_forward}
        for unit in shard_units(model.backbone):
            fully_shard(unit, **options)
        fully_shard(model, **options)
        optimizer = make_optimizer(trainable(model))
        return FSDPPrepared(model, model, optimizer, device, precision, channels_last)
