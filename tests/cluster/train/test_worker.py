"""The worker skeleton's driver-side piece (no cluster): ``report_polling`` hands
``run.report_poll_s`` to the controller Ray Train starts, and leaves the driver as it was."""

from __future__ import annotations

import os

import pytest
from ray.train.v2._internal.constants import get_env_vars_to_propagate

from raycompat.cluster.train.worker import REPORT_POLL_ENV, report_polling
from raycompat.config import apply_overrides
from raycompat.config.train import RunSpec, TrainConfig
from raycompat.errors import ConfigError


@pytest.mark.parametrize("before", [None, "3.0"], ids=["unset", "set_by_the_user"])
def test_the_poll_interval_reaches_the_controller_for_the_run_only(monkeypatch, before):
    if before is None:
        monkeypatch.delenv(REPORT_POLL_ENV, raising=False)
    else:
        monkeypatch.setenv(REPORT_POLL_ENV, before)
    with report_polling(RunSpec(report_poll_s=0.4)):
        # what TorchTrainer.fit passes to its controller actor's environment
        assert get_env_vars_to_propagate()[REPORT_POLL_ENV] == "0.4"
    assert os.environ.get(REPORT_POLL_ENV) == before


def test_the_environment_is_restored_when_the_run_raises(monkeypatch):
    monkeypatch.delenv(REPORT_POLL_ENV, raising=False)
    with pytest.raises(RuntimeError, match="worker died"), report_polling(RunSpec()):
        assert os.environ[REPORT_POLL_ENV] == "0.25"  # the default
        raise RuntimeError("worker died")
    assert REPORT_POLL_ENV not in os.environ


@pytest.mark.parametrize("value", ["0", "-1", "61"])
def test_a_poll_interval_out_of_range_is_refused_by_name(value):
    with pytest.raises(ConfigError, match="run.report_poll_s"):
        apply_overrides(TrainConfig(), [f"run.report_poll_s={value}"])


def test_the_stopping_record_names_the_plateau_before_the_cap_and_the_cap_at_it():
    from types import SimpleNamespace

    from raycompat.cluster.train.worker import stopping
    from raycompat.train.stopping import Plateau

    task = SimpleNamespace(epochs=4, plateau=Plateau(patience=1))
    records = [stopping(task, e, {"selection_score": s}) for e, s in enumerate([0.5, 0.6, 0.6])]
    assert records == [False, False, True]  # no gain at epoch 3 (1-based) of a 4-epoch cap
    at_cap = SimpleNamespace(epochs=3, plateau=Plateau(patience=1))
    metrics = [{"selection_score": s} for s in (0.5, 0.6, 0.6)]
    assert [stopping(at_cap, e, m) for e, m in enumerate(metrics)] == [False, False, False]
    assert metrics[-1]["stopped"] == "cap" and "stopped" not in metrics[1]
    assert metrics[-1] | {"selection_score": 0} == {
        "selection_score": 0, "epochs_cap": 3, "epochs_run": 3, "best_epoch": 1,
        "best_score": 0.6, "stopped": "cap",
    }  # fmt: skip
