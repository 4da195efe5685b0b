"""The layers of docs/architecture.md hold: the core imports without Ray, jobs are recipes.

The core is imported in a fresh interpreter whose import system refuses ``ray`` (a meta-path
finder placed first), so an import of Ray anywhere below a core module, direct or through another
module, is caught and named, even when Ray is installed, as it is here.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# docs/architecture.md, "Core": every module under these packages, and these single modules.
CORE_PACKAGES = [
    "raycompat.backbones",
    "raycompat.backfill",
    "raycompat.data",
    "raycompat.heads",
    "raycompat.methods",
    "raycompat.metrics",
    "raycompat.parallel",
    "raycompat.side_info",
    "raycompat.store",
]
CORE_MODULES = [
    "raycompat",
    "raycompat.cli",
    "raycompat.cli_errors",
    "raycompat.config",
    "raycompat.credentials",
    "raycompat.demo",
    "raycompat.distances",
    "raycompat.engine",
    "raycompat.evaluation",
    "raycompat.models",
    "raycompat.registry",
    "raycompat.search",
    "raycompat.transformation",
    "raycompat.weights",
]
# Ray-layer modules that must stay cheap: the upgrade and Tune configs read them before Ray starts
CHEAP_RAY_LAYER = ["raycompat.fct", "raycompat.fct.config", "raycompat.fct.export"]
# A Ray-layer module, imported last: proves the finder really refuses Ray (no vacuous pass).
CONTROL = "raycompat.train.driver"

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
packages, modules, control = json.loads(sys.argv[1])
names, errors = list(modules), {}
for package in packages:
    names.append(package)
    try:
        path = importlib.import_module(package).__path__
    except Exception as error:
        errors[package] = f"{type(error).__name__}: {error}"
        continue
    def failed(name):
        errors[name] = f"{sys.exc_info()[0].__name__}: {sys.exc_info()[1]}"
    names += [m.name for m in pkgutil.walk_packages(path, package + ".", onerror=failed)]
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
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _IMPORT_WITHOUT_RAY,
            json.dumps([CORE_PACKAGES, CORE_MODULES + CHEAP_RAY_LAYER, CONTROL]),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_core_imports_without_ray(core_import):
    who = {module: name for name, module in core_import["attempts"]}
    assert not core_import["attempts"], f"core modules import Ray: {who}"
    assert not core_import["errors"], core_import["errors"]
    assert not core_import["ray_loaded"]
    for package in CORE_PACKAGES:  # the walk found the packages' modules, not just __init__
        assert any(m.startswith(package + ".") for m in core_import["modules"]), package
    assert "raycompat.data.verification_bin" in core_import["modules"]


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
