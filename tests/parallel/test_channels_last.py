"""Channels-last under the sharded strategies (FSDP2, DeepSpeed ZeRO), in a gloo group of one.

``fully_shard`` refuses channels-last (non-contiguous) parameters and DeepSpeed cannot broadcast
them, so these strategies keep the parameters contiguous and make only the inputs channels-last.
One spawned process (a fresh interpreter: DeepSpeed's global state and gloo threads stay out of
pytest) sets up each strategy with ``channels_last=True`` on CPU, which the training worker only
asks for on CUDA, takes two steps, saves, and loads the checkpoint into a new model.
"""

from __future__ import annotations

import math
import os
import traceback

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from raycompat.nn.models import create_model
from raycompat.parallel import create_strategy
from tests.parallel.test_parallel import (
    BATCH,
    CASES,
    SHARDED,
    _assert_states_close,
    _finish,
    _free_port,
    _init,
    _sgd,
)

CHANNELS = 3  # with one channel, channels-last and contiguous strides are the same
STEPS = 2
CPU = torch.device("cpu")


def _model(seed: int):
    torch.manual_seed(seed)
    return create_model(
        "lenetpp", "linear", num_classes=5, embed_dim=8, backbone_kwargs={"in_chans": CHANNELS}
    )


def _step(prepared, step: int) -> float:
    g = torch.Generator().manual_seed(step)
    images = torch.randn(BATCH, CHANNELS, 28, 28, generator=g)
    targets = torch.randint(0, 5, (BATCH,), generator=g)
    _, logits = prepared.module(prepared.prepare_inputs(images), output="both")
    loss = F.cross_entropy(logits.float(), targets)
    prepared.backward_step(loss)
    return float(loss.detach())


def _record_conv_layouts(model) -> list[bool]:
    """Whether each convolution's output is channels-last, appended at every forward."""
    layouts = []
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.register_forward_hook(
                lambda m, i, out: layouts.append(
                    out.is_contiguous(memory_format=torch.channels_last)
                )
            )
    return layouts


def _setup(case: str, seed: int):
    name, options = CASES[case]
    model = _model(seed)
    layouts = _record_conv_layouts(model)
    prepared = create_strategy(name, **options).setup(model, _sgd, CPU, channels_last=True)
    return prepared, layouts


def _train_save_load(case: str, directory: str) -> dict:
    prepared, layouts = _setup(case, seed=0)
    prepared.train()
    initial = prepared.full_state_dict()
    losses = [_step(prepared, s) for s in range(STEPS)]
    trained = prepared.full_state_dict()
    prepared.save(directory, {"step": STEPS})
    next_loss = _step(prepared, STEPS)
    restored, _ = _setup(case, seed=1)
    restored.train()
    state = restored.load(directory)
    return {
        "conv_channels_last": layouts,
        "losses": losses,
        "initial": initial,
        "trained": trained,
        "next_loss": next_loss,
        "state": state,
        "restored": restored.full_state_dict(),
        "restored_next_loss": _step(restored, STEPS),
    }


def _worker(rank: int, port: int, root: str) -> None:
    _init(rank, port, world=1)
    for case in SHARDED:
        try:
            result = _train_save_load(case, os.path.join(root, case))
        except Exception:  # reported by the case's own test, in the parent
            result = {"error": traceback.format_exc()}
        torch.save(result, os.path.join(root, f"{case}.pt"))
    _finish()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("channels_last"))
    mp.spawn(_worker, args=(_free_port(), root), nprocs=1)
    return {case: torch.load(os.path.join(root, f"{case}.pt")) for case in SHARDED}


@pytest.mark.slow
@pytest.mark.parametrize("case", SHARDED)
def test_sharded_strategy_trains_channels_last(runs, case):
    result = runs[case]
    assert "error" not in result, result.get("error")
    # Contiguous weights with channels-last inputs: every convolution still runs channels-last.
    assert result["conv_channels_last"] and all(result["conv_channels_last"])
    assert all(math.isfinite(loss) for loss in result["losses"])
    initial, trained = result["initial"], result["trained"]
    moved = [key for key in initial if not torch.equal(initial[key], trained[key])]
    assert moved == list(initial)


@pytest.mark.slow
@pytest.mark.parametrize("case", SHARDED)
def test_channels_last_checkpoint_round_trip(runs, case):
    result = runs[case]
    assert "error" not in result, result.get("error")
    assert result["state"] == {"step": STEPS}
    _assert_states_close(result["restored"], result["trained"], atol=0, rtol=0)
    assert result["restored_next_loss"] == pytest.approx(result["next_loss"], rel=1e-6)
