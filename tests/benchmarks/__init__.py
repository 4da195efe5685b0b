"""Tests of the scripts under ``benchmarks/``, and :func:`benchmark_modules` for any test that
imports one (the scripts are not a package: they import each other by name)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark_modules(*names: str) -> Iterator:
    """A fixture body: the named ``benchmarks/`` scripts as modules (one, or a tuple), with
    the folder on ``sys.path`` while the fixture lives."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        modules = tuple(importlib.import_module(name) for name in names)
        yield modules[0] if len(modules) == 1 else modules
    finally:
        sys.path.remove(str(BENCHMARKS))
