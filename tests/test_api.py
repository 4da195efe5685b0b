"""docs/api.md is the public API: every name it lists imports, and every moved path still works.

The moved paths are imported in one fresh interpreter (a module warns only on its first import),
each under ``warnings.catch_warnings(record=True)``: it must raise a ``DeprecationWarning`` that
names the new path and be the new module itself (or, for a package, carry its names).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text()


def _moved_table() -> dict[str, str]:
    section = API.split("## Moved paths", 1)[1]
    return dict(re.findall(r"^\| `([\w.]+)` \| `([\w.]+)` \|$", section, flags=re.M))


def _shim_files() -> dict[str, str]:
    found = {}
    for path in (ROOT / "raycompat").rglob("*.py"):
        text = path.read_text()
        if "from raycompat._moved import" in text:
            parts = path.relative_to(ROOT).with_suffix("").parts
            old = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[old] = re.search(r'"(raycompat[\w.]+)"\)', text).group(1)
    return found


def test_the_moved_table_lists_exactly_the_old_paths_left_in_the_tree():
    assert _moved_table() == _shim_files()
    assert {"raycompat.pipelines", "raycompat.pipelines.adopt", "raycompat.store.index",
            "raycompat.heads", "raycompat.models", "raycompat.fct.config",
            "raycompat.upgrade.config"} <= set(_moved_table())


_IMPORT_OLD_PATHS = r"""
import importlib, json, sys, warnings
results = {}
for old, new in json.loads(sys.argv[1]).items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    target = importlib.import_module(new)
    same = module is target or all(getattr(module, n, None) is v for n, v in vars(target).items()
                                   if not n.startswith("__"))
    results[old] = {"same": same, "warnings": [f"{w.category.__name__}: {w.message}"
                                               for w in caught if old in str(w.message)]}
print(json.dumps(results))
"""


def test_every_old_path_imports_warns_with_the_new_path_and_is_the_new_module():
    moved = _moved_table()
    result = subprocess.run([sys.executable, "-c", _IMPORT_OLD_PATHS, json.dumps(moved)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    for old, new in moved.items():
        assert results[old]["same"], f"{old} is not {new}"
        assert results[old]["warnings"] == [
            f"DeprecationWarning: {old} moved to {new}; import it from there (the old path is "
            "removed in the next release)"], old


def test_an_alias_is_one_module_under_two_names():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from raycompat.store import index as old
    from raycompat.index import version_index as new

    assert old is new
    assert sys.modules["raycompat.store.index"] is new


def test_every_public_name_in_the_api_tables_exists():
    import importlib

    public = API.split("## Moved paths", 1)[0]
    checked = 0
    for module_cell, names_cell in re.findall(r"^\| (`raycompat[^|]*) \| ([^|]*) \|$", public,
                                              flags=re.M):
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
