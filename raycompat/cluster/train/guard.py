"""Stop a Ray Train run at its first non-finite step instead of retrying it.

A :class:`~raycompat.engine.NonFiniteError` raised in a worker (a loss term, the features or the
gradient norm turned NaN/inf) is deterministic: resuming from the last checkpoint replays the
same steps into the same error. Ray Train V2 (2.58) cannot be told so. Its
``DefaultFailurePolicy`` charges every ``WorkerGroupError`` to ``FailureConfig.max_failures``,
whether a worker process died or the train function raised, and the policy is not pluggable
(``create_failure_policy`` always builds the default one). What it never retries is a
``ControllerError`` other than a worker-group start-up failure, and an exception raised by a
``ray.train.UserCallback`` becomes one: :class:`StopOnNonFinite` re-raises the worker's error
from ``after_exception`` on the controller, which then shuts the worker group down once.

The worker reports nothing for the failing epoch, so the last good checkpoint stays the latest
(and is never deleted). :func:`fit` turns the ``TrainingFailedError`` that ``trainer.fit()``
raises back into the worker's one-line ``NonFiniteError``; a Tune trial that runs the driver
ends as ERROR with that message. Other worker errors keep Ray's retries (``run.max_failures``).
"""

from __future__ import annotations

import ray.train

from raycompat.cluster.train import interrupt
from raycompat.engine import NonFiniteError


def non_finite_in(errors: dict[int, BaseException]) -> NonFiniteError | None:
    """The lowest rank's :class:`NonFiniteError` among ``{rank: error}``; None if there is none
    (the other ranks often fail with collateral errors, such as a broken collective)."""
    found = [errors[rank] for rank in sorted(errors) if isinstance(errors[rank], NonFiniteError)]
    return found[0] if found else None


class StopOnNonFinite(ray.train.UserCallback):
    """Ray Train callback (runs on the controller): fail the run, without a retry, as soon as a
    worker raised :class:`NonFiniteError`."""

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        error = non_finite_in(worker_exceptions)
        if error is not None:
            raise error


def cause(error: BaseException) -> NonFiniteError | None:
    """The :class:`NonFiniteError` inside a Ray Train ``TrainingFailedError``, if any."""
    if isinstance(error, NonFiniteError):
        return error
    if isinstance(error, ray.train.ControllerError):
        return cause(error.controller_failure)
    if isinstance(error, ray.train.WorkerGroupError):
        return non_finite_in(error.worker_failures)
    return None


def fit(trainer) -> ray.train.Result:
    """``trainer.fit()`` (the trainer built with :class:`StopOnNonFinite` among its callbacks);
    a non-finite step raises as the worker's :class:`NonFiniteError`, its message alone."""
    try:
        return interrupt.fit(trainer)  # Ctrl-C: KeyboardInterrupt, not Ray Train's exit 0
    except ray.train.TrainingFailedError as error:
        found = cause(error)
        if found is None:
            raise
        raise NonFiniteError(str(found)) from None
