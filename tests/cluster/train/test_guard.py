"""Driver side of a non-finite step (no cluster): Ray Train's wrappers are unwrapped into the
worker's one-line NonFiniteError; the callback stops the run only for that error."""

from __future__ import annotations

import pytest
import ray.train

from raycompat.cluster.train import guard
from raycompat.engine import NonFiniteError

MESSAGE = "step_1: non-finite loss term 'ce' (nan) at epoch 1, step 0 (global 4); lower optim.lr"


class Raises:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def fit(self):
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        ray.train.ControllerError(NonFiniteError(MESSAGE)),
        ray.train.WorkerGroupError(
            "rank 0 ... rank 1 ...",
            {1: RuntimeError("gloo: connection reset"), 0: NonFiniteError(MESSAGE)},
        ),
    ],
    ids=["controller", "worker_group"],
)
def test_fit_raises_the_workers_message_alone(error):
    with pytest.raises(NonFiniteError) as caught:
        guard.fit(Raises(error))
    assert str(caught.value) == MESSAGE
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_other_training_errors_are_left_to_ray():
    error = ray.train.WorkerGroupError("died", {0: RuntimeError("worker died")})
    with pytest.raises(ray.train.WorkerGroupError):
        guard.fit(Raises(error))


def test_callback_raises_only_for_a_non_finite_step():
    callback = guard.StopOnNonFinite()
    callback.after_exception(None, {0: RuntimeError("a dead worker: retry")})
    with pytest.raises(NonFiniteError, match="global 4"):
        callback.after_exception(None, {1: NonFiniteError(MESSAGE), 0: ValueError("collateral")})


def test_clip_grad_norm_is_refused_where_the_strategy_clips_itself():
    from raycompat.cluster.train.driver import check_clipping
    from raycompat.config import load_config
    from raycompat.config.train import TrainConfig
    from raycompat.errors import ConfigError

    clip = ["optim.clip_grad_norm=1.0"]
    check_clipping(load_config(TrainConfig, None, [*clip, "scaling.strategy=fsdp"]))
    check_clipping(load_config(TrainConfig, None, ["scaling.strategy=deepspeed"]))
    with pytest.raises(ConfigError, match="strategy_options.gradient_clipping"):
        check_clipping(load_config(TrainConfig, None, [*clip, "scaling.strategy=deepspeed"]))
