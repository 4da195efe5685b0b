"""pyproject.toml as setuptools reads it on install: no deprecation warning of our own (issue 52,
item 7: ``project.license`` as a TOML table printed setuptools' deprecation warning twice)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_project_metadata_applies_without_a_setuptools_warning(monkeypatch):
    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration

    monkeypatch.chdir(ROOT)  # readme = "README.md" is relative to the project
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SetuptoolsDeprecationWarning included
        dist = apply_configuration(setuptools.Distribution(), os.path.join(ROOT, "pyproject.toml"))
    assert dist.metadata.license_expression == "Apache-2.0"  # the SPDX string form
