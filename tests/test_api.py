"""docs/api.md is the public API: one row per package, listing exactly the package's ``__all__``.

Each row of the API tables is ``| `raycompat.<package>` | `name`, `name`, ... | what |``; the
names must equal the package's ``__all__`` as sets (a name added to a package without its row, or
a row naming something the package does not export, fails), and every name in ``__all__`` must
resolve, lazy exports included.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text()
ROW = re.compile(r"^\| `(raycompat[\w.]*)` \| ([^|]*) \| [^|]* \|$", flags=re.M)


def api_rows(text: str = API) -> dict[str, set[str]]:
    """Package -> the names its row lists; a package listed twice is an error."""
    rows: dict[str, set[str]] = {}
    for package, names in ROW.findall(text):
        assert package not in rows, f"{package} has two rows in docs/api.md"
        rows[package] = set(re.findall(r"`([A-Za-z_]\w*)`", names))
    return rows


ROWS = api_rows()


def test_the_tables_list_a_row_per_package():
    assert len(ROWS) >= 12, sorted(ROWS)
    assert all(ROWS.values()), [p for p, names in ROWS.items() if not names]


@pytest.mark.parametrize("package", sorted(ROWS))
def test_a_row_lists_exactly_its_packages_all(package):
    module = importlib.import_module(package)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{package} has no __all__"
    assert len(exported) == len(set(exported)), f"{package}.__all__ repeats a name"
    listed = ROWS[package]
    assert listed == set(exported), (
        f"docs/api.md vs {package}.__all__: only in the docs {sorted(listed - set(exported))}, "
        f"only in __all__ {sorted(set(exported) - listed)}"
    )


@pytest.mark.parametrize("package", sorted(ROWS))
def test_every_exported_name_resolves(package):
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{package}.__all__ names what it lacks: {missing}"


def test_the_check_fails_on_a_name_missing_from_all(monkeypatch):
    """Not vacuous: a name dropped from an ``__all__`` (or a docs row gaining one) fails."""
    store = importlib.import_module("raycompat.store")
    monkeypatch.setattr(store, "__all__", [n for n in store.__all__ if n != "GalleryStore"])
    with pytest.raises(AssertionError, match="only in the docs \\['GalleryStore'\\]"):
        test_a_row_lists_exactly_its_packages_all("raycompat.store")
    monkeypatch.setattr(store, "__all__", [*store.__all__, "NoSuchName"])
    with pytest.raises(AssertionError, match="NoSuchName"):
        test_every_exported_name_resolves("raycompat.store")
