"""docs/api.md is the public API: one row per package, listing exactly the package's ``__all__``.

Each row of the API tables is ``| `raycompat.<package>` | `name`, `name`, ... | what |``; the
names must equal the package's ``__all__`` as sets (a name added to a package without its row, or
a row naming something the package does not export, fails), and every name in ``__all__`` must
resolve, lazy exports included, to the kind its case gives it (class, function, constant).

A public name is one object whatever was imported before it: no package, under ``raycompat/``,
exports the name of one of its own submodules (``raycompat.index.search`` the function once was
also ``raycompat/index/search.py``, which replaced it in the package once any module imported
it), and every exported name resolves to the same object in a fresh interpreter and after every
module under ``raycompat/`` was imported.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text()
ROW = re.compile(r"^\| `(raycompat[\w.]*)` \| ([^|]*) \| [^|]* \|$", flags=re.M)
# The classes docs/api.md names as written in capitals (CIFAR10), not in CamelCase.
CAPITALISED_CLASSES = set(
    re.findall(r"`(\w+)`", re.search(r"classes written in capitals: ([^(.]*)", API).group(1))
)
PACKAGES = sorted(
    ".".join(path.parent.relative_to(ROOT).parts)
    for path in (ROOT / "raycompat").rglob("__init__.py")
)


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


def kind(name: str) -> str:
    """The kind docs/api.md gives a name by its case: ``class``, ``function`` or ``constant``."""
    if name in CAPITALISED_CLASSES or (name[0].isupper() and not name.isupper()):
        return "class"
    return "constant" if name.isupper() else "function"


def kind_of(value: object) -> str:
    if inspect.isclass(value):
        return "class"
    if inspect.isfunction(value):
        return "function"
    return "module" if inspect.ismodule(value) else "constant"


@pytest.mark.parametrize("package", sorted(ROWS))
def test_every_documented_name_imports_as_its_kind(package):
    """``from <package> import <name>`` gives what its case says (``GalleryStore`` a class,
    ``search`` a function, ``METHODS`` a constant), never a module."""
    wrong = {}
    for name in sorted(ROWS[package]):
        value = getattr(__import__(package, fromlist=[name]), name)
        if kind_of(value) != kind(name):
            wrong[name] = f"a {kind_of(value)}, documented as a {kind(name)}"
    assert not wrong, f"{package}: {wrong}"


def test_the_capitalised_classes_are_found_in_the_docs():
    assert {"CIFAR10", "CIFAR100"} <= CAPITALISED_CLASSES


def colliding_names(package: str) -> list[str]:
    """The names ``package`` exports that are also the names of its submodules."""
    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    return sorted(submodules & set(getattr(module, "__all__", ())))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_exported_name_is_also_a_submodule(package):
    assert not colliding_names(package), (
        f"{package} exports {colliding_names(package)}, which are also its submodules: once "
        "anything imports the submodule the name is the module; rename the module"
    )


def test_the_collision_check_fails_on_a_name_that_is_a_submodule(monkeypatch):
    """Not vacuous: ``raycompat.serving`` exporting ``query_path`` (its module
    ``query_path.py``) fails."""
    serving = importlib.import_module("raycompat.serving")
    monkeypatch.setattr(serving, "__all__", [*serving.__all__, "query_path"])
    with pytest.raises(AssertionError, match=r"exports \['query_path'\]"):
        test_no_exported_name_is_also_a_submodule("raycompat.serving")


# Run in a fresh interpreter, so that the first resolution of each name sees only the imports
# that resolving the names before it made: for each package, every name in its __all__ and every
# lazy name it offers but has not loaded, each described with the id of its object; then every
# module under the root is imported and the names are described again.
RESOLVE = textwrap.dedent(
    """
    import importlib, inspect, json, pkgutil, sys

    root, packages = sys.argv[1], json.loads(sys.argv[2])

    def describe(value):
        if inspect.ismodule(value):
            return f"the module {value.__name__}"
        where = getattr(value, "__qualname__", type(value).__qualname__)
        return f"{getattr(value, '__module__', '?')}.{where} (id {id(value)})"

    def resolve():
        found = {}
        for package in packages:
            module = importlib.import_module(package)
            lazy = set(dir(module)) - set(vars(module))
            for name in sorted({*getattr(module, "__all__", ()), *lazy}):
                value = getattr(__import__(package, fromlist=[name]), name)
                found[f"{package}.{name}"] = describe(value)
        return found

    before = resolve()
    for info in pkgutil.walk_packages(importlib.import_module(root).__path__, f"{root}."):
        importlib.import_module(info.name)
    print(json.dumps({"before": before, "after": resolve()}))
    """
)


def resolve_before_and_after(root: str, packages: list[str], cwd: Path) -> dict[str, dict]:
    """``{"before": {name: object}, "after": ...}`` from :data:`RESOLVE` run in ``cwd``."""
    out = subprocess.run(
        [sys.executable, "-c", RESOLVE, root, json.dumps(packages)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def assert_one_object_per_name(resolved: dict[str, dict]) -> None:
    """No name is a module, before or after, and each is the same object before and after."""
    before, after = resolved["before"], resolved["after"]
    modules = sorted(
        name for name, value in [*before.items(), *after.items()] if value.startswith("the module")
    )
    assert not modules, f"these public names are modules: {sorted(set(modules))}"
    changed = {name: (value, after.get(name)) for name, value in before.items()}
    changed = {name: pair for name, pair in changed.items() if pair[0] != pair[1]}
    assert not changed, f"these names changed once every module was imported: {changed}"


def test_every_exported_name_is_one_object_whatever_was_imported_first():
    resolved = resolve_before_and_after("raycompat", PACKAGES, ROOT)
    assert {"raycompat.serving.search", "raycompat.index.SearchIndex"} <= set(resolved["before"])
    found = resolved["before"]["raycompat.serving.search"]
    assert found.startswith("raycompat.serving.query_path.search")
    assert_one_object_per_name(resolved)


def test_the_import_order_check_fails_on_a_name_shadowed_by_its_submodule(tmp_path):
    """Not vacuous: the bug as it was, in a package of its own; ``search`` is the function on a
    fresh import and the module ``search.py`` once another module (resolving ``stored_index``,
    after ``search``) imported that."""
    package = tmp_path / "shadowed"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from raycompat._lazy import lazy_exports\n"
        "__getattr__, __dir__, __all__ = lazy_exports(__name__, {'query': ('search',),"
        " 'index': ('stored_index',)})\n"
    )
    (package / "query.py").write_text("def search():\n    pass\n")
    (package / "search.py").write_text("class SearchIndex:\n    pass\n")
    (package / "index.py").write_text("import shadowed.search\n\ndef stored_index():\n    pass\n")
    resolved = resolve_before_and_after("shadowed", ["shadowed"], tmp_path)
    assert resolved["before"]["shadowed.search"].startswith("shadowed.query.search")
    assert resolved["after"]["shadowed.search"] == "the module shadowed.search"
    with pytest.raises(AssertionError, match="shadowed.search"):
        assert_one_object_per_name(resolved)
