"""The upgrade report's files (``raycompat/upgrade/report.py``): every one is private, mode
0600, the PNGs as the text files, since they name the store's models and runs (README.md,
"report files are private")."""

from __future__ import annotations

import os
import stat

import numpy as np

from raycompat.config.fct import PartialBackfillSpec
from raycompat.metrics.compatibility import CompatibilityMatrix
from raycompat.upgrade.backfill_eval import backfill_evaluation
from raycompat.upgrade.report import Outcome, Report, write_report
from tests.upgrade.test_backfill_eval import hand_made


def backfill_curves() -> dict:
    """The partial-backfill curves of ``tests/upgrade/test_backfill_eval.py``'s toy gallery."""
    new, transformed, uncertainty, labels = hand_made()
    spec = PartialBackfillSpec(budget=0.25)
    return backfill_evaluation(new, transformed, uncertainty, labels, spec)


def test_every_report_file_is_written_0600_even_under_an_open_umask(tmp_path):
    backfill = backfill_curves()
    outcomes = [
        Outcome("m1", "independent", 3, "initial", "first"),
        Outcome("m3", "fct", 7, "partial_backfill", "asked", "m1", "v3", backfill=backfill),
    ]
    matrix = CompatibilityMatrix.from_array(np.array([[0.6, 0], [0.5, 0.9]]), ["m1", "m3"])
    report = Report("toy", "identification", matrix, outcomes, [])
    features = {"m1": (np.random.default_rng(0).normal(size=(20, 2)), np.arange(20) % 3)}
    old = os.umask(0o022)  # what makes savefig's own files 0644
    try:
        files = write_report(tmp_path, report, {"name": "toy"}, features_2d=features)
    finally:
        os.umask(old)
    assert {"matrix.png", "backfill_m3.png", "features_m1.png"} <= set(files.values())
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(files.values())  # no temporary file left beside them
    modes = {name: stat.S_IMODE((tmp_path / name).stat().st_mode) for name in written}
    assert modes == dict.fromkeys(written, 0o600)
    assert (tmp_path / "matrix.png").read_bytes().startswith(b"\x89PNG")
