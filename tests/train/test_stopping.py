"""The validation plateau rule (``raycompat.train.stopping``) on hand-worked score sequences,
and its config's checks."""

from __future__ import annotations

import pytest

from raycompat.config import apply_overrides
from raycompat.config.train import StopSpec, TrainConfig
from raycompat.errors import ConfigError
from raycompat.train.stopping import Plateau


def stops_after(rule: Plateau, scores: list[float]) -> int | None:
    """The 1-based epoch after which ``rule`` stops on ``scores``, or None (the cap)."""
    for epoch, score in enumerate(scores):
        if rule.update(epoch, score):
            return epoch + 1
    return None


@pytest.mark.parametrize(
    "scores, patience, min_delta, min_epochs, stop, best_epoch",
    [
        ([0.5, 0.6, 0.7, 0.8], 2, 0.0, 1, None, 3),  # still improving: the cap ends it
        ([0.5, 0.6, 0.6, 0.6], 2, 0.0, 1, 4, 1),  # a tie is no improvement
        ([0.5, 0.6, 0.55, 0.58, 0.61], 2, 0.0, 1, 4, 1),  # 0.61 came too late
        ([0.5, 0.6, 0.55, 0.61, 0.6], 2, 0.0, 1, None, 3),  # 0.61 reset the count
        ([0.5, 0.6, 0.605, 0.61], 2, 0.01, 1, 4, 1),  # gains within min_delta do not count
        ([0.9, 0.1, 0.1, 0.1, 0.1], 1, 0.0, 4, 4, 0),  # min_epochs holds it to epoch 4
        ([0.3, 0.3], 1, 0.0, 1, 2, 0),  # constant from the first epoch
    ],
)
def test_plateau_by_hand(scores, patience, min_delta, min_epochs, stop, best_epoch):
    rule = Plateau(patience, min_delta, min_epochs)
    assert stops_after(rule, scores) == stop
    assert rule.best_epoch == best_epoch and rule.best == scores[best_epoch]


def test_a_restored_rule_stops_where_an_uninterrupted_one_does():
    scores = [0.5, 0.7, 0.6, 0.65, 0.66]
    whole = Plateau(3)
    assert stops_after(whole, scores) == 5
    first = Plateau(3)
    assert stops_after(first, scores[:2]) is None
    resumed = Plateau(3).restore({"best": first.best, "best_epoch": first.best_epoch})
    assert [resumed.update(e, s) for e, s in enumerate(scores) if e >= 2] == [False, False, True]
    assert (resumed.best, resumed.best_epoch) == (whole.best, whole.best_epoch)


def test_the_cap_rule_has_no_plateau():
    assert Plateau.of(StopSpec()) is None
    rule = Plateau.of(StopSpec(rule="plateau", patience=5, min_delta=0.1, min_epochs=2))
    assert (rule.patience, rule.min_delta, rule.min_epochs) == (5, 0.1, 2)


def test_a_plateau_without_a_validation_split_is_refused():
    with pytest.raises(ConfigError, match=r"stop.rule: plateau .*eval.val_fraction > 0"):
        apply_overrides(TrainConfig(), ["stop.rule=plateau", "eval.val_fraction=0"])
    with pytest.raises(ConfigError, match="stop.patience"):
        apply_overrides(TrainConfig(), ["stop.patience=0"])
