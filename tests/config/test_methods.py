"""The torch-free method catalogue (raycompat/config/methods.py) is the real registry, exactly."""

from __future__ import annotations

import inspect

import pytest

from raycompat.config import ConfigError
from raycompat.config.methods import METHOD_CATALOG, MethodEntry, check_method_options
from raycompat.methods import METHODS
from raycompat.methods.baselines import Independent
from raycompat.registry import UnknownNameError


def registry_catalogue() -> dict[str, MethodEntry]:
    """What the catalogue must say, read from the registered classes: ``needs_transformation``
    and the constructor's keyword names other than ``self`` and ``old``, in signature order."""
    out = {}
    for name in METHODS.names():
        cls = METHODS.get(name)
        params = inspect.signature(cls.__init__).parameters
        options = tuple(p for p in params if p not in ("self", "old"))
        out[name] = MethodEntry(bool(cls.needs_transformation), options)
    return out


def test_the_catalogue_equals_the_registry():
    assert METHOD_CATALOG == registry_catalogue(), (
        "raycompat/config/methods.py METHOD_CATALOG differs from the registered methods: "
        "update it beside the method"
    )


def test_a_method_registered_but_not_catalogued_is_caught(monkeypatch):
    """Not vacuous: the comparison sees a registry entry the catalogue lacks."""
    monkeypatch.setitem(METHODS._builders, "independent_copy", Independent)
    assert set(registry_catalogue()) - set(METHOD_CATALOG) == {"independent_copy"}


def test_options_and_names_are_refused_as_the_registry_did():
    check_method_options("dsimplex_hoc", {"lam": 0.5, "rho": 5.0})
    with pytest.raises(ConfigError, match="^method_options: 'dsimplex_hoc' takes no option"):
        check_method_options("dsimplex_hoc", {"lamda": 0.5})
    with pytest.raises(ConfigError, match=r"^upgrades\[1\].method_options: 'fct' .*valid: none"):
        check_method_options("fct", {"lam": 0.5}, "upgrades[1].method_options")
    with pytest.raises(UnknownNameError) as caught:
        check_method_options("bctx", {})
    with pytest.raises(UnknownNameError) as expected:
        METHODS.get("bctx")
    assert str(caught.value) == str(expected.value)
