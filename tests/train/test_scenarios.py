"""Scenario plans and data splits (pure Python; no Ray)."""

import numpy as np
import pytest

from raycompat.config import load_config
from raycompat.config.train import ModelSpec, ReplacementSpec, TrainConfig
from raycompat.errors import ConfigError
from raycompat.train.data import make_splits, rank_share, step_rows, targets_for
from raycompat.train.scenarios import plan_steps


def _cfg(*overrides):
    return load_config(TrainConfig, None, list(overrides))


def test_cores_plans_grow_the_union_from_the_same_seed():
    plans = plan_steps(_cfg("method=cores", "scenario.tasks=[4,7,10]"))
    assert [p.classes for p in plans] == [list(range(4)), list(range(7)), list(range(10))]
    assert [p.method for p in plans] == ["independent", "cores", "cores"]
    assert [p.init for p in plans] == ["random", "same_seed", "same_seed"]
    assert [p.parent for p in plans] == [None, 0, 1]
    assert all(p.replay_classes == [] and p.allocation == "ltr" for p in plans)


def test_cl2r_plans_fine_tune_new_classes_with_replay_of_the_earlier_ones():
    plans = plan_steps(_cfg("method=dsimplex_hoc", "scenario.kind=cl2r", "scenario.tasks=[4,3,3]"))
    assert [p.classes for p in plans] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [p.replay_classes for p in plans] == [[], [0, 1, 2, 3], list(range(7))]
    assert [p.init for p in plans] == ["random", "previous", "previous"]
    assert plans[2].seen_classes == list(range(10))


def test_iam_cl2r_allocates_fine_tuning_classes_right_to_left_and_inserts_replacements():
    cfg = _cfg(
        "method=dsimplex_hoc",
        "scenario.kind=iam_cl2r",
        "scenario.tasks=[4,3,3]",
        "model.num_classes=20",
    )
    cfg.scenario.replacements = [
        ReplacementSpec(
            at_task=2,
            model=ModelSpec(backbone="cifar_resnet20", num_classes=20),
            pretrain_classes=list(range(7)),
        )
    ]
    plans = plan_steps(cfg)
    assert [p.name for p in plans] == ["step_1", "step_2", "replacement_3", "step_3"]
    assert [p.allocation for p in plans] == ["ltr", "rtl", "ltr", "rtl"]
    assert plans[1].seen_outputs == [0, 1, 2, 3, 13, 14, 15]  # y = 4, 5, 6 -> 19 - y
    assert not plans[2].in_matrix and plans[2].method == "independent"
    assert plans[3].parent == 2 and plans[3].init == "previous"
    assert plans[3].model.backbone == "cifar_resnet20"


def test_replayed_classes_keep_the_output_they_were_first_trained_on():
    plans = plan_steps(
        _cfg(
            "method=dsimplex_hoc",
            "scenario.kind=iam_cl2r",
            "scenario.tasks=[2,2,2]",
            "model.num_classes=10",
        )
    )
    # task 1 left-to-right, tasks 2 and 3 right-to-left (9 - y); replay keeps old outputs.
    assert plans[2].label_map == {0: 0, 1: 1, 2: 7, 3: 6, 4: 5, 5: 4}
    targets = targets_for(plans[2], np.array([0, 3, 5, 1]))
    assert targets.tolist() == [0, 6, 4, 1]


def test_a_pretrained_initial_model_makes_every_task_right_to_left():
    plans = plan_steps(
        _cfg(
            "method=dsimplex_hoc",
            "scenario.kind=iam_cl2r",
            "scenario.tasks=[2,2]",
            "model.num_classes=10",
            "model.weights=/models/pretrained.safetensors",
        )
    )
    assert plans[1].label_map == {0: 9, 1: 8, 2: 7, 3: 6}


def test_replacement_with_another_head_is_rejected_before_training():
    cfg = _cfg("method=dsimplex_hoc", "scenario.kind=iam_cl2r", "scenario.tasks=[4,3]")
    cfg.scenario.replacements = [
        ReplacementSpec(
            at_task=1, model=ModelSpec(head="linear", embed_dim=9), pretrain_classes=[0, 1]
        )
    ]
    with pytest.raises(ValueError, match="same fixed head"):
        plan_steps(cfg)


def test_right_to_left_labels_colliding_with_left_to_right_ones_are_rejected():
    # K=6: fine-tuning classes 3, 4, 5 map to outputs 2, 1, 0, already taken by classes 0-2.
    with pytest.raises(ValueError, match="6 classes share 3 head outputs"):
        plan_steps(
            _cfg(
                "method=dsimplex_hoc",
                "scenario.kind=iam_cl2r",
                "scenario.tasks=[3,3]",
                "model.num_classes=6",
            )
        )


def test_more_classes_than_outputs_is_rejected():
    with pytest.raises(ValueError, match="do not fit in K=5"):
        plan_steps(_cfg("scenario.tasks=[4,7]", "model.num_classes=5"))


def test_unknown_scenario_and_keys_are_config_errors():
    with pytest.raises(ConfigError, match="scenario.kind"):
        _cfg("scenario.kind=sequential")
    with pytest.raises(ConfigError, match="unknown config key"):
        _cfg("scaling.gpus=2")


def test_splits_are_disjoint_seeded_and_cover_the_data():
    labels = np.repeat(np.arange(5), 40)
    cfg = _cfg()
    a, b = make_splits(cfg, labels), make_splits(cfg, labels)
    np.testing.assert_array_equal(a.train, b.train)
    allrows = np.concatenate([a.train, a.val, a.test])
    assert sorted(allrows.tolist()) == list(range(200))
    assert len(a.test) == 40 and len(a.val) == 15  # 5 classes x round(0.1 * 32)


def test_step_rows_and_replay_come_from_the_training_split():
    labels = np.repeat(np.arange(10), 30)
    cfg = _cfg(
        "method=dsimplex_hoc",
        "scenario.kind=cl2r",
        "scenario.tasks=[4,3,3]",
        "scenario.replay_per_class=5",
    )
    plans = plan_steps(cfg)
    splits = make_splits(cfg, labels)
    new, replay = step_rows(plans[1], labels, splits, cfg)
    assert set(labels[new]) == {4, 5, 6} and set(new) <= set(splits.train)
    assert np.bincount(labels[replay], minlength=10)[:4].tolist() == [5, 5, 5, 5]
    assert set(replay) <= set(splits.train)


def test_rank_shares_are_disjoint_equal_and_cover_every_row():
    rows = np.arange(101)
    shares = [rank_share(rows, epoch=3, seed=0, rank=r, world=2) for r in range(2)]
    assert len(shares[0]) == len(shares[1]) == 51
    assert set(shares[0]) | set(shares[1]) == set(rows)
    assert len(set(shares[0]) & set(shares[1])) <= 1  # one padded repeat at most
    again = rank_share(rows, epoch=3, seed=0, rank=0, world=2)
    np.testing.assert_array_equal(shares[0], again)
    assert not np.array_equal(shares[0], rank_share(rows, epoch=4, seed=0, rank=0, world=2))
