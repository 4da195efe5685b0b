"""docs/api.md is the public API: every module it lists imports and has every name it lists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text()


def test_every_public_name_in_the_api_tables_exists():
    checked = 0
    for module_cell, names_cell in re.findall(
        r"^\| (`raycompat[^|]*) \| ([^|]*) \|$", API, flags=re.M
    ):
        modules = re.findall(r"`(raycompat[\w.]*|\.\w+)`", module_cell)
        base = modules[0].rsplit(".", 1)[0]
        modules = [base + m if m.startswith(".") else m for m in modules]
        for name in modules:
            module = importlib.import_module(name)
            checked += 1
            if len(modules) == 1:
                for attribute in re.findall(r"`([A-Za-z_]\w*)`(?!\()", names_cell):
                    assert hasattr(module, attribute), f"{name}.{attribute} (docs/api.md)"
    assert checked >= 20
