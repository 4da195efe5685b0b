"""The method registry (raycompat/methods/catalog.py): one entry per method, each naming its
class and the constructor options a config may give, checked without torch."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from raycompat.errors import ConfigError
from raycompat.methods import METHOD_CATALOG, METHODS, list_methods
from raycompat.methods.baselines import Independent
from raycompat.methods.catalog import check_method_options, method_entry
from raycompat.registry import UnknownNameError


def constructor_options(cls) -> tuple[str, ...]:
    params = inspect.signature(cls.__init__).parameters
    return tuple(p for p in params if p not in ("self", "old"))


@pytest.mark.parametrize("name", sorted(METHOD_CATALOG))
def test_each_entry_names_its_class_and_that_class_options(name):
    cls = METHODS.get(name)
    # the class the entry imports is the method of that name; an upgrade without compatible
    # training (procrustes, affine, adapter, slerp) trains an independent model, then fits its map
    assert cls.name == ("independent" if method_entry(name).fits_map else name)
    assert method_entry(name).options == constructor_options(cls)


def test_the_registry_lists_exactly_the_catalogue():
    assert list_methods() == sorted(METHOD_CATALOG) == METHODS.names()
    assert [n for n in METHOD_CATALOG if method_entry(n).needs_transformation] == ["fct"]
    fitted = [n for n in METHOD_CATALOG if method_entry(n).fits_map]
    assert fitted == ["procrustes", "affine", "adapter", "slerp"]


def test_a_registered_method_is_a_class_from_its_module():
    assert METHODS.get("independent") is Independent


def test_options_and_names_are_refused_as_the_registry_does():
    check_method_options("dsimplex_hoc", {"lam": 0.5, "rho": 5.0})
    with pytest.raises(ConfigError, match="^method_options: 'dsimplex_hoc' takes no option"):
        check_method_options("dsimplex_hoc", {"lamda": 0.5})
    with pytest.raises(ConfigError, match=r"^upgrades\[1\].method_options: 'fct' .*valid: none"):
        check_method_options("fct", {"lam": 0.5}, "upgrades[1].method_options")
    with pytest.raises(UnknownNameError, match=r"unknown compatibility method 'bctx'; valid"):
        check_method_options("bctx", {})


def test_the_registry_and_config_checks_load_no_torch():
    code = (
        "import sys\n"
        "from raycompat.methods import METHODS, check_method_options, method_entry\n"
        "check_method_options('bct', {'weight': 1.0})\n"
        "assert 'cores' in METHODS and method_entry('fct').needs_transformation\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_near_miss_names_the_nearest_method_and_option():
    """Every registry's unknown name, and a method option, end with the closest valid one."""
    with pytest.raises(UnknownNameError, match=r"'bctx'; valid names: .*; did you mean 'bct'\?$"):
        METHODS.get("bctx")
    with pytest.raises(ConfigError, match=r"valid: lam, rho, nce_mask; did you mean 'lam'\?$"):
        check_method_options("dsimplex_hoc", {"lamda": 0.5})
    with pytest.raises(UnknownNameError, match=r"valid names: [^;]*$"):  # nothing close: no hint
        METHODS.get("zzzz")
