"""What our entry points print (``raycompat/console.py``, issue 40 item 6): stderr of a
``raycompat`` command holds only our lines (faiss' loader and other libraries' INFO lines only
with ``--verbose``), a small IVF-PQ build says its few training rows once in our words instead of
faiss' k-means warning per sub-quantizer, and a job's summary is one short line."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

from raycompat.cli.job_entry import log_summary, summary_line
from raycompat.console import set_console_levels
from tests.cli.test_search_output import served


def cli(*argv: str) -> subprocess.CompletedProcess:
    """``raycompat ARGV`` in a fresh process, its output not a terminal."""
    command = [sys.executable, "-m", "raycompat.cli.app", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture
def small(tmp_path):
    """``(store root, queries.npy)``: 40 rows, no published index."""
    store, x = served(tmp_path / "store", 40, 1)
    np.save(tmp_path / "q.npy", x[:2])
    return store.uri(), str(tmp_path / "q.npy")


def test_search_stderr_holds_only_our_lines_and_verbose_restores_the_libraries(small):
    root, queries = small
    args = ("search", "g", "--vectors", queries, "--model", "m1", "--store", root)
    quiet = cli(*args)
    assert quiet.returncode == 0, quiet.stderr
    lines = quiet.stderr.splitlines()
    # The one note: no index is published, so the version was searched exactly.
    assert len(lines) == 1 and lines[0].startswith("raycompat: note: "), quiet.stderr
    assert "\x1b[" not in quiet.stderr + quiet.stdout  # a pipe, not a terminal: no colour
    verbose = cli(*args, "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    assert "faiss.loader: " in verbose.stderr  # "Loading faiss with AVX2 support." ...


def test_an_error_is_one_line_without_library_noise(small):
    root, queries = small
    out = cli("search", "g", "--vectors", queries, "--model", "nope", "--store", root)
    assert out.returncode != 0
    assert out.stderr.splitlines() == [out.stderr.strip()], out.stderr
    assert out.stderr.startswith("raycompat: error: "), out.stderr


def test_a_small_ivfpq_build_warns_once_in_our_words(tmp_path):
    store, _ = served(tmp_path / "store", 1000, 1)
    out = cli("index", "build", "g", "--version", "v1", "--store", store.uri(), "--kind", "ivfpq",
              "--nlist", "16")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "please provide at least" not in out.stderr  # faiss' k-means, once per sub-quantizer
    warnings = [line for line in out.stderr.splitlines() if "training vectors" in line]
    assert len(warnings) == 1 and "index verify" in warnings[0], out.stderr
    assert len(out.stderr.splitlines()) == 2, out.stderr  # the warning, and "indexed g/v1"


def test_console_levels_keep_our_info_and_the_libraries_warnings(caplog):
    root = logging.getLogger()
    before = root.level, logging.getLogger("raycompat").level
    try:
        set_console_levels(verbose=False)
        assert not logging.getLogger("faiss.loader").isEnabledFor(logging.INFO)
        assert logging.getLogger("pyiceberg.io").isEnabledFor(logging.WARNING)
        assert logging.getLogger("raycompat.progress").isEnabledFor(logging.INFO)
        assert not logging.getLogger("raycompat.progress").isEnabledFor(logging.DEBUG)
        set_console_levels(verbose=True)
        assert logging.getLogger("pyiceberg.io").isEnabledFor(logging.INFO)
        assert logging.getLogger("raycompat.progress").isEnabledFor(logging.DEBUG)
    finally:
        root.setLevel(before[0])
        logging.getLogger("raycompat").setLevel(before[1])


def test_the_summary_is_one_short_line_and_the_json_at_debug(caplog):
    summary = {
        "name": "mnist-history",
        "split": "open set: " + "digits 7-9 are never trained on; " * 4,
        "matrix": [[0.5, None, None], [0.4, 0.6, None], [0.3, 0.5, 0.7]],
        "names": ["m1", "m2", "m3"],
        "decisions": {"m1": "initial", "m2": "refuse", "m3": "partial_backfill"},
        "negative_flips": {"m3": {"negative_flip_rate": 0.01}},
        "AC": 0.6666666,
        "report": "outputs/upgrade/report/mnist-history/report.md",
    }
    assert summary_line(summary) == (
        "name=mnist-history names=[m1, m2, m3] "
        "decisions={m1: initial, m2: refuse, m3: partial_backfill} AC=0.6667 "
        "report=outputs/upgrade/report/mnist-history/report.md"
    )
    logger = logging.getLogger("raycompat.test_console")
    with caplog.at_level(logging.DEBUG, logger="raycompat.test_console"):
        assert log_summary(logger, summary) is summary
    info, debug = caplog.records
    assert (info.levelno, debug.levelno) == (logging.INFO, logging.DEBUG)
    assert "[[0.5" not in info.getMessage() and "[[0.5" in debug.getMessage()
