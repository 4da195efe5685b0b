"""Stage announcements (raycompat/progress.py): the line, its numbering and its ETA."""

from __future__ import annotations

import logging

import pytest

from raycompat.progress import Stages, plural, stage_line


def test_stage_line_format():
    assert stage_line(2, 3, "m2", "training dsimplex_hoc against m1", None) == (
        "[2/3] m2: training dsimplex_hoc against m1"
    )
    assert (
        stage_line(1, 9, "ift step 1", "training", 409.6) == "[1/9] ift step 1: training | ETA 410s"
    )
    assert stage_line(1, 2, "m1", "x", -3.0).endswith("| ETA 0s")  # never a negative ETA
    assert (plural(1, "epoch"), plural(4, "epoch")) == ("1 epoch", "4 epochs")


def test_stages_are_announced_in_order_and_the_eta_follows_the_finished_ones(caplog):
    stages = Stages(3)
    with caplog.at_level(logging.INFO, logger="raycompat.progress"):
        stages.begin(1)
        assert stages.announce("m1", "training") == "[1/3] m1: training"  # no ETA yet
        stages._began -= 10.0  # stage 1 took 10 s
        stages.begin(2)
        line = stages.announce("m2", "training")
        stages._began -= 4.0  # 4 s into stage 2
        assert stages.eta_s() == pytest.approx(10.0 * 2 - 4.0, abs=0.5)
        stages.end()
        stages.end()  # no stage running: nothing counted twice
    assert line == "[2/3] m2: training | ETA 20s"
    assert [r.getMessage() for r in caplog.records] == ["[1/3] m1: training", line]
    assert stages.finished == 2 and stages.eta_s() == pytest.approx(7.0, abs=0.5)
