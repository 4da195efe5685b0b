"""The folder is the layer (docs/architecture.md): nothing outside the Ray layer imports Ray.

Two checks. Statically, no module outside ``raycompat/cluster/`` (and the entry points under
``raycompat/cli/``, which import the Ray layer inside a command) has an ``import ray`` or an
import of ``raycompat.cluster`` anywhere in it, at module level or inside a function. Dynamically,
every such module is imported in a fresh interpreter whose import system refuses ``ray`` (a
meta-path finder placed first), so an import of Ray below any of them, direct or through
another module, is caught and named, even though Ray is installed here.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "raycompat"
RAY_LAYER = PACKAGE / "cluster"
ENTRY_POINTS = PACKAGE / "cli"
# A Ray-layer module, imported last: proves the finder really refuses Ray (no vacuous pass).
CONTROL = "raycompat.cluster.train.driver"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_files() -> list[Path]:
    """Every module outside the Ray layer and the entry points."""
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not p.is_relative_to(RAY_LAYER) and not p.is_relative_to(ENTRY_POINTS)
    ]


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
    return found


def test_no_module_outside_the_ray_layer_imports_ray_even_inside_a_function():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in core_files()
        for line, name in _imports(path)
        if name == "ray" or name.startswith(("ray.", "raycompat.cluster"))
    ]
    assert not offenders, offenders
    assert len(core_files()) > 100  # the walk found the core, not an empty folder


def test_every_module_that_imports_ray_lives_under_the_ray_layer():
    importers = {
        path
        for path in PACKAGE.rglob("*.py")
        for _, name in _imports(path)
        if name == "ray" or name.startswith("ray.")
    }
    assert importers, "no module imports Ray: the scan is broken"
    outside = [
        str(p.relative_to(ROOT))
        for p in importers
        if not p.is_relative_to(RAY_LAYER) and not p.is_relative_to(ENTRY_POINTS)
    ]
    assert not outside, outside


_IMPORT_WITHOUT_RAY = r"""
import importlib, json, pkgutil, sys

attempts = []


class RefuseRay:
    def find_spec(self, name, path=None, target=None):
        if name != "ray" and not name.startswith("ray."):
            return None
        frame = sys._getframe(1)
        while frame is not None and not frame.f_globals.get("__name__", "").startswith("raycompat"):
            frame = frame.f_back
        attempts.append([name, frame.f_globals["__name__"] if frame is not None else "?"])
        raise ImportError(f"ray is refused here ({name})")


sys.meta_path.insert(0, RefuseRay())
names, control = json.loads(sys.argv[1])
errors = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as error:
        errors[name] = f"{type(error).__name__}: {error}"
loaded = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
core_attempts = list(attempts)
try:
    importlib.import_module(control)
    control_refused = False
except ImportError:
    control_refused = True
print(json.dumps({"modules": names, "errors": errors, "attempts": core_attempts,
                  "ray_loaded": loaded, "control_refused": control_refused}))
"""


@pytest.fixture(scope="module")
def core_import():
    names = [_module_name(path) for path in core_files()]
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_WITHOUT_RAY, json.dumps([names, CONTROL])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_core_imports_without_ray(core_import):
    who = {module: name for name, module in core_import["attempts"]}
    assert not core_import["attempts"], f"core modules import Ray: {who}"
    assert not core_import["errors"], core_import["errors"]
    assert not core_import["ray_loaded"]
    assert "raycompat.data.verification_bin" in core_import["modules"]
    assert "raycompat.config.upgrade" in core_import["modules"]  # configs validate without Ray


def test_the_ray_refusal_is_real(core_import):
    assert core_import["control_refused"], f"{CONTROL} imported although Ray was refused"


@pytest.mark.parametrize("job", sorted(p.name for p in (ROOT / "jobs").glob("*.py")))
def test_job_defines_main_argv_none(job):
    spec = importlib.util.spec_from_file_location(f"_job_{Path(job).stem}", ROOT / "jobs" / job)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # jobs import Ray inside main, so this is cheap
    assert callable(getattr(module, "main", None)), f"jobs/{job} has no main"
    parameters = list(inspect.signature(module.main).parameters.values())
    assert [p.name for p in parameters] == ["argv"], f"jobs/{job}: main{parameters}"
    assert parameters[0].default is None, f"jobs/{job}: main(argv=None) expected"


def test_the_store_imports_no_faiss_even_inside_a_function():
    """faiss belongs to the index, the store's neighbour (issue 39): the store reads and widens
    vectors with NumPy and pyarrow only."""
    store = sorted((PACKAGE / "store").rglob("*.py"))
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in store
        for line, name in _imports(path)
        if name == "faiss" or name.startswith(("faiss.", "raycompat.index"))
    ]
    assert not offenders, offenders
    assert len(store) > 20


def _runtime_imports(path: Path) -> list[tuple[int, str]]:
    """:func:`_imports` less those under ``if TYPE_CHECKING:`` (types only, never run)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for child in block.body
        for node in ast.walk(child)
    }
    return [
        (line, name)
        for line, name in _imports(path)
        if not any(
            id(node) in typing_only and getattr(node, "lineno", None) == line
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
        )
    ]


def test_errors_sit_below_every_layer_and_io_imports_nothing_above_it():
    """One error module at the bottom (issue 39): ``raycompat.errors`` imports nothing, and
    ``raycompat.io`` (which the store and the config import) imports only itself, the errors,
    the registry and the lazy-export helper (``raycompat._lazy``, which imports nothing of
    raycompat), even inside a function, so no cycle needs a deferred import."""
    assert [name for _, name in _imports(PACKAGE / "errors.py") if name != "__future__"] == []
    io = sorted((PACKAGE / "io").rglob("*.py"))
    allowed = ("raycompat.io", "raycompat.errors", "raycompat.registry", "raycompat._lazy")
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in io
        for line, name in _runtime_imports(path)
        if name.startswith("raycompat") and not name.startswith(allowed)
    ]
    assert not offenders, offenders
    assert len(io) > 5



# Within the core, serving's control plane (raycompat/serving/: what each model serves, the
# aliases, the query path) sits between the data plane and the service (issue 53): the index is
# faiss only and never reaches up into serving or training, the store is told what is served by
# its caller instead of importing the layers above it, and the service's config keys do not
# import the service they configure.
UPWARD = {
    "raycompat/index": ("raycompat.train", "raycompat.serving"),
    "raycompat/store": ("raycompat.serving", "raycompat.service", "raycompat.cli"),
    "raycompat/config/serve.py": ("raycompat.service",),
}


def _imported(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """Every module the module at ``path`` imports (``source``: its text, default the file's),
    at module level or inside a function: ``from a import b`` counts as ``a`` and ``a.b`` (``b``
    may be a submodule), a relative import resolved against the module's package."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def upward_imports(path: Path, forbidden: tuple[str, ...], source: str | None = None) -> list:
    """``path:line: module`` for each import of ``path`` into one of the ``forbidden`` layers."""
    return [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for line, name in _imported(path, source)
        if any(name == layer or name.startswith(f"{layer}.") for layer in forbidden)
    ]


@pytest.mark.parametrize("where", sorted(UPWARD))
def test_no_import_points_up_from_the_data_plane_even_inside_a_function(where):
    target = ROOT / where
    files = [target] if target.is_file() else sorted(target.rglob("*.py"))
    assert files and all(path.is_file() for path in files), where  # the walk found the layer
    offenders = [line for path in files for line in upward_imports(path, UPWARD[where])]
    assert not offenders, offenders


def test_the_upward_check_sees_function_level_and_relative_imports():
    """Not vacuous: an import of the serving layer inside a function, ``from raycompat import
    serving`` and a relative import of training out of ``raycompat/index`` are each caught."""
    probe = PACKAGE / "index" / "_probe.py"  # never written: its path only places the text
    source = (
        "def f():\n    from raycompat.serving.resolve import served_version\n"
        "from raycompat import serving\n"
        "from ..train import export\n"
        "from raycompat.transformations import fit_kind\n"  # allowed: below the index
    )
    found = upward_imports(probe, UPWARD["raycompat/index"], source)
    assert sorted(line.split(": ", 1)[1] for line in found) == [
        "raycompat.serving",
        "raycompat.serving.resolve",
        "raycompat.serving.resolve.served_version",
        "raycompat.train",
        "raycompat.train.export",
    ]


# Orchestration reads as plan, then run (docs/architecture.md): the upgrade job's functions stay
# short enough to read whole (issue 53, item 4: Upgrader._upgrade was 86 lines).
LONGEST_FUNCTION = 80
SHORT_FUNCTIONS = ("raycompat/cluster/upgrade", "raycompat/upgrade")


def long_functions(path: Path, source: str | None = None, limit: int = LONGEST_FUNCTION) -> list:
    """``path:line: name is N lines`` for each function or method over ``limit`` lines
    (``end_lineno - lineno + 1``: its ``def`` line to its last, docstring included)."""
    tree = ast.parse(path.read_text() if source is None else source)
    found = []
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = child.end_lineno - child.lineno + 1
                owner = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
                if lines > limit:
                    found.append((child.lineno, f"{owner}{child.name} is {lines} lines"))
    return [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in sorted(found)]


@pytest.mark.parametrize("where", SHORT_FUNCTIONS)
def test_no_function_of_the_upgrade_job_is_over_80_lines(where):
    files = sorted((ROOT / where).rglob("*.py"))
    assert len(files) >= 4, where  # the walk found the package
    offenders = [line for path in files for line in long_functions(path)]
    assert not offenders, offenders


def test_the_length_check_sees_methods_and_nested_functions():
    """Not vacuous: a method of 81 lines and a function nested in another are each caught, a
    function of exactly 80 lines is not."""
    probe = PACKAGE / "upgrade" / "_probe.py"  # never written: its path only places the text
    body = "        x = 1\n"
    source = (
        "class A:\n    def f(self):\n" + body * 80  # 81 lines
        + "def g():\n" + body * 79  # 80 lines
        + "def h():\n    def inner():\n" + body * 80 + "    return inner\n"
    )  # fmt: skip
    assert long_functions(probe, source) == [
        "raycompat/upgrade/_probe.py:2: A.f is 81 lines",
        "raycompat/upgrade/_probe.py:163: h is 83 lines",
        "raycompat/upgrade/_probe.py:164: inner is 81 lines",
    ]
