"""``deepspeed``: a DeepSpeed engine with ZeRO stage 1, 2 (default) or 3 on the existing group.

ZeRO shards optimizer state (stage 1), plus gradients (2), plus parameters (3). Pick it for
DeepSpeed-specific features or to compare with FSDP; on CPU it runs over gloo (ZeRO-3 included).
DeepSpeed is imported only when this strategy is set up.

Channels-last: the parameters stay contiguous; only the inputs are converted (the convolutions
still run channels-last). ``deepspeed.initialize`` broadcasts each parameter through
``p.data.view(torch.uint8)``, which fails on a channels-last weight (every stage, even on one
rank), and ZeRO re-points each parameter at a contiguous view of its flat (ZeRO-1/2) or
gathered (ZeRO-3) buffer anyway. Converting after ``initialize`` is no way out: it would detach
the parameters from those buffers, and ZeRO-2 fails on ``grad.view(-1)`` (DeepSpeed 0.19).

Checkpoint (``engine.save_checkpoint(directory, tag="zero")``, collective): rank 0 writes
``latest``, DeepSpeed's ``zero_to_fp32.py`` and ``zero/mp_rank_00_model_states.pt`` (ZeRO-3: every
rank writes ``zero/zero_pp_rank_<r>_mp_rank_00_model_states.pt``); every rank writes its
optimizer shard ``zero/zero_pp_rank_<r>_mp_rank_00_optim_states.pt``. Names never collide, so the
per-rank directories merge into one folder. DeepSpeed reads these files with
``torch.load(weights_only=False)``: load only checkpoints this project wrote.
"""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist

from raycompat.parallel.base import STRATEGIES, Prepared, Strategy, cpu_copy, rank, trainable
from raycompat.precision import autocast_dtype

TAG = "zero"
ZERO_STAGES = (1, 2, 3)
_NEVER_PRINT = 2**62  # DeepSpeed logs every `steps_per_print` steps; the loop does its own logging


def _import_deepspeed(device: torch.device):
    """Import DeepSpeed with the accelerator matching ``device`` and attach it to the group."""
    if device.type == "cpu":
        # Read once, at DeepSpeed's first accelerator lookup.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator().device_name()
    if accelerator != device.type:
        raise RuntimeError(
            f"DeepSpeed's accelerator is {accelerator!r} but the model is on {device}; set "
            f"DS_ACCELERATOR={device.type} before deepspeed is first imported"
        )
    if device.type == "cpu":
        # On CPU DeepSpeed JIT-compiles a shared-memory op (tens of seconds, needs a C++
        # compiler) that only serves inference all-reduce. Its availability table is computed
        # lazily and cached in deepspeed.ops; marking the op unavailable skips the build.
        table = deepspeed.ops.__dict__.get("__compatible_ops__")
        if table is None:
            table = deepspeed.ops.__compatible_ops__ = {}
        table["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(
        dist_backend=dist.get_backend(), auto_mpi_discovery=False, dist_init_required=False
    )
    return deepspeed


class DeepSpeedPrepared(Prepared):
    strategy_name = "deepspeed"

    def __init__(self, engine, device, precision, channels_last) -> None:
        super().__init__(engine, engine.module, engine.optimizer, device, precision, channels_last)
        self.engine = engine
        self.input_dtype = torch.bfloat16 if engine.bfloat16_enabled() else None

    def prepare_inputs(self, images: torch.Tensor) -> torch.Tensor:
        images = super().prepare_inputs(images)
        # Under DeepSpeed bf16 the module's weights themselves are bf16; inputs must match.
        if self.input_dtype is not None and images.is_floating_point():
            images = images.to(self.input_dtype)
        return images

    def autocast(self):
        return contextlib.nullcontext()  # precision is the engine's (its bf16 config)

    def backward_step(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)
        self.engine.step()  # steps the optimizer and zeroes the gradients

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        from deepspeed.runtime.zero import GatheredParameters

        state = None
        # ZeRO-3 keeps only a slice of each parameter; gather them for the copy (no-op for 1/2).
        with GatheredParameters(list(self.model.parameters()), modifier_rank=None):
            if rank() == 0:
                state = cpu_copy(self.model.state_dict())
        return state

    def _save_shards(self, directory: str) -> None:
        self.engine.save_checkpoint(directory, tag=TAG)

    def _load_shards(self, directory: str) -> None:
        path, _ = self.engine.load_checkpoint(
            directory, tag=TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if path is None:
            raise FileNotFoundError(f"{directory}: no DeepSpeed checkpoint with tag {TAG!r}")


@STRATEGIES.register("deepspeed")
class DeepSpeedStrategy(Strategy):
    """Args:
    zero_stage: 1, 2 or 3.
    train_micro_batch_size_per_gpu: the per-rank batch size; DeepSpeed only uses it for its own
        bookkeeping here (the loop feeds batches itself and steps after every backward).
    gradient_clipping: global gradient-norm clip; 0 disables it.
    """

    name = "deepspeed"
    channels_last_parameters = False  # see the module docstring

    def __init__(
        self, zero_stage: int = 2, train_micro_batch_size_per_gpu: int = 1, gradient_clipping=0.0
    ) -> None:
        if zero_stage not in ZERO_STAGES:
            raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {zero_stage!r}")
        if train_micro_batch_size_per_gpu < 1:
            raise ValueError(
                f"train_micro_batch_size_per_gpu must be >= 1, got {train_micro_batch_size_per_gpu}"
            )
        if gradient_clipping < 0:
            raise ValueError(f"gradient_clipping must be >= 0, got {gradient_clipping}")
        self.zero_stage = zero_stage
        self.train_micro_batch_size_per_gpu = train_micro_batch_size_per_gpu
        self.gradient_clipping = float(gradient_clipping)

    def config(self, precision: str, device: torch.device) -> dict:
        """The DeepSpeed config this strategy passes to ``deepspeed.initialize``."""
        return {
            "train_micro_batch_size_per_gpu": self.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": self.gradient_clipping,
            "zero_optimization": {"stage": self.zero_stage},
            # ZeRO only vouches for DeepSpeed's own optimizers; plain torch SGD works fine.
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": autocast_dtype(precision, device) == torch.bfloat16},
            "steps_per_print": _NEVER_PRINT,
        }

    def _wrap(self, model, make_optimizer, device, precision, channels_last) -> Prepared:
        if not dist.is_initialized():
            raise RuntimeError(
                "the deepspeed strategy needs an initialised default process group "
                "(Ray Train creates it); use strategy 'ddp' for a single process"
            )
        device_rank = 0 if device.type == "cpu" else device.index
        if device_rank is None:
            device_rank = torch.cuda.current_device()
        # DeepSpeed insists on LOCAL_RANK (Ray Train and torchrun set it); the device itself is
        # passed as device_rank so that DeepSpeed selects the device Ray assigned.
        os.environ.setdefault("LOCAL_RANK", str(device_rank))
        deepspeed = _import_deepspeed(device)
        engine, _, _, _ = deepspeed.initialize(
            args=SimpleNamespace(device_rank=device_rank),
            model=model,
            optimizer=make_optimizer(trainable(model)),
            config=self.config(precision, device),
            dist_init_required=False,
        )
        return DeepSpeedPrepared(engine, device, precision, channels_last)
