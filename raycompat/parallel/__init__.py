"""Distributed strategies (DDP, FSDP2, DeepSpeed ZeRO) on plain ``torch.distributed``.

The Ray Train worker loop calls ``create_strategy(name).setup(...)`` after Ray has initialised
the default process group; nothing here imports Ray. See ``docs/parallel.md``.
"""

from raycompat.parallel import ddp, deepspeed_zero, fsdp  # noqa: F401  (registration)
from raycompat.parallel.base import (
    STRATEGIES,
    Prepared,
    Strategy,
    create_strategy,
    list_strategies,
)

__all__ = ["STRATEGIES", "Prepared", "Strategy", "create_strategy", "list_strategies"]
