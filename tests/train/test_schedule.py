"""One learning-rate schedule (raycompat/train/schedule.py) for model and FCT training."""

from __future__ import annotations

import math

import pytest

from raycompat.config import load_config
from raycompat.config.fct import FCTOptimSpec, TransformationTrainConfig
from raycompat.config.train import OptimSpec
from raycompat.errors import ConfigError
from raycompat.train.schedule import lr_at, warmup_cosine


def test_per_epoch_schedules_of_model_training():
    step = OptimSpec(lr=0.1, schedule="step", milestones=[2, 4], gamma=0.1)
    assert [lr_at(step, e, 6) for e in range(6)] == pytest.approx(
        [0.1, 0.1, 0.01, 0.01, 0.001, 0.001]
    )
    warm = OptimSpec(lr=0.1, schedule="constant", warmup_epochs=1)
    assert lr_at(warm, 0, 4) == pytest.approx(0.05) and lr_at(warm, 1, 4) == 0.1


def test_fct_per_step_schedule_is_warmup_cosine_times_lr():
    spec = FCTOptimSpec(lr=5e-4, warmup_epochs=5)
    for epoch in (0.0, 2.5, 5.0, 17.25, 79.9):
        assert lr_at(spec, epoch, 80) == pytest.approx(5e-4 * warmup_cosine(epoch, 80, 5))
    assert lr_at(spec, 80, 80) == pytest.approx(0.0, abs=1e-15)  # not back up past the end
    assert lr_at(spec, 90, 80) == pytest.approx(0.0, abs=1e-15)
    assert warmup_cosine(42.5, 80, 5) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_fct_configs_take_both_key_sets_as_one_type():
    assert isinstance(FCTOptimSpec(), OptimSpec)  # one type; FCT's defaults
    cfg = load_config(
        TransformationTrainConfig,
        None,
        ["triples=t", "h={d_old: 2, d_side: 0, d_new: 2}", "optim.momentum=0.5"],
    )
    assert isinstance(cfg.optim, OptimSpec)
    assert (cfg.optim.name, cfg.optim.schedule, cfg.optim.momentum) == ("adam", "cosine", 0.5)
    assert cfg.optim.weight_decay == 2**-15
    with pytest.raises(ConfigError, match="optim.lr must be > 0.0"):
        load_config(
            TransformationTrainConfig,
            None,
            ["triples=t", "h={d_old: 2, d_side: 0, d_new: 2}", "optim.lr=0"],
        )
