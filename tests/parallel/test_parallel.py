"""Distributed strategies over 2 gloo processes (torch.multiprocessing.spawn, no Ray).

One spawn trains every strategy for a few SGD steps and saves; the per-rank checkpoint
directories are merged by copying, as Ray does; a second spawn (a new process group) loads each
merged checkpoint into a differently initialised model and takes the next step. The results
are compared here, in the parent, with a single-process batch-8 reference.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from raycompat.nn.models import create_model
from raycompat.parallel import create_strategy, list_strategies

WORLD = 2
BATCH = 4  # per rank
STEPS = 3
FROZEN = "backbone.features.0.0.bias"
# case id -> (strategy name, options)
CASES = {
    "ddp": ("ddp", {}),
    "fsdp": ("fsdp", {}),
    "zero2": ("deepspeed", {"zero_stage": 2, "train_micro_batch_size_per_gpu": BATCH}),
    "zero3": ("deepspeed", {"zero_stage": 3, "train_micro_batch_size_per_gpu": BATCH}),
}
SHARDED = ["fsdp", "zero2", "zero3"]


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    """``(STEPS+1, WORLD*BATCH, 1, 28, 28)`` images and ``(STEPS+1, WORLD*BATCH)`` targets."""
    g = torch.Generator().manual_seed(123)
    images = torch.randn(STEPS + 1, WORLD * BATCH, 1, 28, 28, generator=g)
    return images, torch.randint(0, 5, (STEPS + 1, WORLD * BATCH), generator=g)


def _model(seed: int):
    torch.manual_seed(seed)
    model = create_model("lenetpp", "linear", num_classes=5, embed_dim=8)
    model.get_parameter(FROZEN).requires_grad_(False)
    return model


def _sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=5e-4)


def _step(prepared, step: int, rows: slice) -> float:
    images, targets = _data()
    x = prepared.prepare_inputs(images[step, rows])
    with prepared.autocast():
        _, logits = prepared.module(x, output="both")
        loss = F.cross_entropy(logits.float(), targets[step, rows])
    prepared.backward_step(loss)
    return float(loss.detach())


def _rank_rows(rank: int) -> slice:
    return slice(rank * BATCH, (rank + 1) * BATCH)


def _init(rank: int, port: int, world: int = WORLD) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )


def _finish() -> None:
    """Leave without interpreter finalisation: the results are on disk, and the groups DeepSpeed
    creates keep gloo threads whose destructors can abort the process at exit ("terminate called
    without an active exception", SIGABRT), which spawn reports as a failed rank."""
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _setup(case: str, seed: int):
    name, options = CASES[case]
    model = _model(seed)
    return model, create_strategy(name, **options).setup(model, _sgd, torch.device("cpu"))


def _train_worker(rank: int, port: int, root: str) -> None:
    _init(rank, port)
    for case in CASES:
        # Ranks start from different weights: every strategy must start from rank 0's.
        model, prepared = _setup(case, seed=rank)
        prepared.train()
        losses = [_step(prepared, s, _rank_rows(rank)) for s in range(STEPS)]
        full = prepared.full_state_dict()
        local = {k: v.detach().clone() for k, v in model.state_dict().items()}
        state = {"epoch": 1, "step": STEPS, "case": case}
        prepared.save(os.path.join(root, case, f"rank{rank}"), state)
        next_loss = _step(prepared, STEPS, _rank_rows(rank))
        result = {"losses": losses, "full": full, "next_loss": next_loss}
        result.update(full_next=prepared.full_state_dict(), local=local if case == "ddp" else None)
        torch.save(result, os.path.join(root, f"train_{case}_rank{rank}.pt"))
    _finish()


def _load_worker(rank: int, port: int, root: str) -> None:
    _init(rank, port)
    for case in CASES:
        _, prepared = _setup(case, seed=100 + rank)
        prepared.train()
        state = prepared.load(os.path.join(root, case, "merged"))
        result = {"state": state, "full": prepared.full_state_dict()}
        result["next_loss"] = _step(prepared, STEPS, _rank_rows(rank))
        result["full_next"] = prepared.full_state_dict()
        prepared.set_lr(0.0)
        _step(prepared, 0, _rank_rows(rank))
        result["full_lr0"] = prepared.full_state_dict()
        torch.save(result, os.path.join(root, f"load_{case}_rank{rank}.pt"))
    _, fsdp = _setup("fsdp", seed=0)
    try:
        fsdp.load(os.path.join(root, "ddp", "merged"))
        message = None
    except ValueError as err:
        message = str(err)
    torch.save(message, os.path.join(root, f"mismatch_rank{rank}.pt"))
    _finish()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _merge(sources: list[str], target: str) -> None:
    """Copy every rank's directory into one folder, as Ray merges a checkpoint's shards."""
    seen: dict[str, str] = {}
    for source in sources:
        for folder, _, files in os.walk(source):
            for name in files:
                rel = os.path.relpath(os.path.join(folder, name), source)
                assert rel not in seen, f"{rel} written by both {seen[rel]} and {source}"
                seen[rel] = source
        shutil.copytree(source, target, dirs_exist_ok=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("parallel"))
    mp.spawn(_train_worker, args=(_free_port(), root), nprocs=WORLD)
    for case in CASES:
        ranks = [os.path.join(root, case, f"rank{r}") for r in range(WORLD)]
        _merge(ranks, os.path.join(root, case, "merged"))
    mp.spawn(_load_worker, args=(_free_port(), root), nprocs=WORLD)

    def read(kind: str, case: str) -> list[dict]:
        return [torch.load(os.path.join(root, f"{kind}_{case}_rank{r}.pt")) for r in range(WORLD)]

    return {
        "root": root,
        "train": {case: read("train", case) for case in CASES},
        "load": {case: read("load", case) for case in CASES},
        "mismatch": [torch.load(os.path.join(root, f"mismatch_rank{r}.pt")) for r in range(WORLD)],
    }


def _assert_states_close(actual: dict, expected: dict, atol=1e-5, rtol=1e-4) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=atol, rtol=rtol, msg=key)


def _single_process_batch8():
    """The reference: one process, the two ranks' slices as one batch of 8, rank 0's init."""
    _, prepared = _setup("ddp", seed=0)
    losses = [_step(prepared, s, slice(0, WORLD * BATCH)) for s in range(STEPS)]
    return losses, prepared.full_state_dict()


# ---- fast, single process ---------------------------------------------------------------


def test_unknown_strategy_lists_valid_names():
    assert list_strategies() == ["ddp", "deepspeed", "fsdp"]
    with pytest.raises(KeyError, match="'horovod'.*ddp, deepspeed, fsdp"):
        create_strategy("horovod")


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="zero_stage"):
        create_strategy("deepspeed", zero_stage=4)
    with pytest.raises(ValueError, match="precision.*'fp16'"):
        create_strategy("ddp").setup(_model(0), _sgd, torch.device("cpu"), precision="fp16")


@pytest.mark.parametrize("name", ["fsdp", "deepspeed"])
def test_sharded_strategies_need_a_process_group(name):
    with pytest.raises(RuntimeError, match="process group"):
        create_strategy(name).setup(_model(0), _sgd, torch.device("cpu"))


def test_single_process_ddp_round_trip_channels_last(tmp_path):
    model = _model(0)
    prepared = create_strategy().setup(model, _sgd, torch.device("cpu"), channels_last=True)
    assert prepared.module is model  # no process group: no DDP wrapper
    x = prepared.prepare_inputs(torch.randn(2, 1, 28, 28))
    assert x.is_contiguous(memory_format=torch.channels_last)
    _step(prepared, 0, slice(0, 4))
    prepared.save(str(tmp_path), {"epoch": 3})
    assert sorted(os.listdir(tmp_path)) == [
        "model.safetensors",
        "optimizer.pt",
        "state.json",
        "strategy.json",
    ]
    restored = create_strategy().setup(_model(1), _sgd, torch.device("cpu"))
    assert restored.load(str(tmp_path)) == {"epoch": 3}
    _assert_states_close(restored.full_state_dict(), prepared.full_state_dict(), atol=0, rtol=0)
    assert _step(restored, 1, slice(0, 4)) == _step(prepared, 1, slice(0, 4))


def test_uint8_inputs_are_widened_to_the_readers_floats():
    """The ``ray_data`` loader hands uint8 images over; the step widens them on its device to
    exactly what the readers' float path gives (``x / 255``), channels-last kept."""
    from raycompat.data.base import uint8_to_tensor

    prepared = create_strategy().setup(_model(0), _sgd, torch.device("cpu"), channels_last=True)
    pixels = torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8, generator=torch.Generator())
    x = prepared.prepare_inputs(pixels)
    expected = torch.stack([uint8_to_tensor(p.permute(1, 2, 0).numpy()) for p in pixels])
    assert x.dtype == torch.float32 and torch.equal(x, expected)
    assert x.is_contiguous(memory_format=torch.channels_last)


def test_load_without_header_names_the_directory(tmp_path):
    prepared = create_strategy().setup(_model(0), _sgd, torch.device("cpu"))
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}.*strategy.json"):
        prepared.load(str(tmp_path))


# ---- two gloo processes -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_steps_are_finite_and_synchronised(runs, case):
    ranks = runs["train"][case]
    for result in ranks:
        assert all(math.isfinite(loss) for loss in result["losses"])
    assert ranks[1]["full"] is None  # full_state_dict lives on rank 0 only
    if case == "ddp":
        _assert_states_close(ranks[1]["local"], ranks[0]["local"], atol=0, rtol=0)
    # The frozen parameter keeps rank 0's initial value under every strategy.
    torch.testing.assert_close(ranks[0]["full"][FROZEN], _model(0).state_dict()[FROZEN])


@pytest.mark.slow
def test_ddp_two_ranks_of_4_equal_one_process_of_8(runs):
    ranks = runs["train"]["ddp"]
    losses, state = _single_process_batch8()
    for step, loss in enumerate(losses):
        # Mean over 8 samples = mean of the two ranks' means over 4.
        assert loss == pytest.approx((ranks[0]["losses"][step] + ranks[1]["losses"][step]) / 2)
    _assert_states_close(ranks[0]["full"], state)


@pytest.mark.slow
@pytest.mark.parametrize("case", SHARDED)
def test_sharded_strategies_match_ddp(runs, case):
    ddp, sharded = runs["train"]["ddp"][0], runs["train"][case][0]
    assert sharded["losses"] == pytest.approx(ddp["losses"], rel=1e-5)
    _assert_states_close(sharded["full"], ddp["full"])
    assert sharded["full"][FROZEN].sum() != 0  # a real comparison, not of two empty states


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_merged_checkpoint_resumes_in_a_new_process_group(runs, case):
    trained, loaded = runs["train"][case], runs["load"][case]
    assert loaded[0]["state"] == loaded[1]["state"] == {"epoch": 1, "step": STEPS, "case": case}
    _assert_states_close(loaded[0]["full"], trained[0]["full"], atol=0, rtol=0)
    for rank in range(WORLD):
        # The next step needs the optimizer's momentum too: its loss and update must match.
        assert loaded[rank]["next_loss"] == pytest.approx(trained[rank]["next_loss"], rel=1e-6)
    _assert_states_close(loaded[0]["full_next"], trained[0]["full_next"], atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_set_lr_reaches_the_stepping_optimizer(runs, case):
    loaded = runs["load"][case][0]
    _assert_states_close(loaded["full_lr0"], loaded["full_next"], atol=0, rtol=0)


@pytest.mark.slow
def test_loading_under_another_strategy_or_world_size_fails(runs):
    directory = os.path.join(runs["root"], "ddp", "merged")
    for message in runs["mismatch"]:
        assert directory in message and "'ddp'" in message and "'fsdp'" in message
    single = create_strategy("ddp").setup(_model(0), _sgd, torch.device("cpu"))
    with pytest.raises(ValueError, match="world_size=2.*world_size=1"):
        single.load(directory)
