"""Ctrl-C during a Ray Train run (``raycompat/cluster/train/interrupt.py``): the run is aborted
and the job gets a ``KeyboardInterrupt`` (then one line, exit 130), not Ray Train's
``sys.exit(0)``; the driver's SIGINT handler is put back afterwards. A fake trainer stands in
for ``TorchTrainer`` (its ``fit`` registers the handler as Ray Train's does), so no Ray runs."""

from __future__ import annotations

import inspect
import os
import signal
import time

import pytest

from raycompat.cluster.train import interrupt


class Controller:
    def __init__(self) -> None:
        self.aborted = 0

    @property
    def abort(self):
        controller = self

        class Method:
            @staticmethod
            def remote():
                controller.aborted += 1
                return "ref"

        return Method


class Trainer:
    """Registers the SIGINT handler with its controller, as Ray Train's ``fit`` does, then
    waits for the run (here: a Ctrl-C)."""

    def __init__(self, interrupt_it: bool) -> None:
        self.controller, self.interrupt_it = Controller(), interrupt_it

    def _register_sigint_handler(self, controller) -> None:  # Ray Train's: exits 0
        signal.signal(signal.SIGINT, lambda *_: os._exit(0))

    def fit(self):
        self._register_sigint_handler(self.controller)
        if self.interrupt_it:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises before this ends
        return "result"


@pytest.fixture
def fake_ray_get(monkeypatch):
    got = []
    monkeypatch.setattr(interrupt.ray, "get", lambda ref, timeout=None: got.append(ref))
    return got


def test_ctrl_c_aborts_the_run_and_raises_keyboard_interrupt(fake_ray_get):
    before = signal.getsignal(signal.SIGINT)
    trainer = Trainer(interrupt_it=True)
    with pytest.raises(KeyboardInterrupt):
        interrupt.fit(trainer)
    assert trainer.controller.aborted == 1 and fake_ray_get == ["ref"]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_run_that_ends_puts_the_previous_handler_back(fake_ray_get):
    before = signal.getsignal(signal.SIGINT)
    assert interrupt.fit(Trainer(interrupt_it=False)) == "result"
    assert signal.getsignal(signal.SIGINT) is before and not fake_ray_get


def test_ray_train_registers_its_handler_where_this_replaces_it():
    """Fails if a Ray upgrade moves Ray Train's SIGINT handler (then revisit interrupt.py)."""
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    assert hasattr(DataParallelTrainer, "_register_sigint_handler")
    source = inspect.getsource(DataParallelTrainer._initialize_and_run_controller)
    assert "self._register_sigint_handler(controller)" in source


def test_a_resumed_run_knows_which_candidates_an_earlier_run_trained(tmp_path):
    """``trained_already``: True only when state.json holds every planned step, so a resumed
    upgrade job says it reads the model back instead of announcing the training (issue 40, 7)."""
    import json

    from raycompat.cluster.train.driver import trained_already
    from raycompat.config import load_config
    from raycompat.config.train import TrainConfig
    from raycompat.train.scenarios import plan_steps

    cfg = load_config(
        TrainConfig,
        None,
        ["method=cores", "scenario.tasks=[4,7]", f"run.storage_path={tmp_path}", "run.name=r"],
    )
    names = [plan.name for plan in plan_steps(cfg)]
    assert len(names) == 2 and not trained_already(cfg)  # a new run
    state = tmp_path / "r" / "state.json"
    state.parent.mkdir()
    state.write_text(json.dumps({"steps": {names[0]: {}}}))
    assert not trained_already(cfg)  # interrupted after the first step
    state.write_text(json.dumps({"steps": {name: {} for name in names}}))
    assert trained_already(cfg)
