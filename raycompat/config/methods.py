"""What a config may say about a compatibility method, without importing torch.

The methods themselves (:mod:`raycompat.methods`) are torch modules, and importing that package
registers all of them, so a config check that asked the real registry would load torch (about 2
s) before it could say that ``method: bctx`` is a typo. This catalogue repeats, per registered
name, the two facts a config check needs: whether the method learns a transformation ``h`` (an
FCT upgrade) and the option names its constructor takes (``method_options``), in signature
order. It lives in the config layer rather than in ``raycompat/methods/`` because importing any
module of that package runs its ``__init__``, which imports torch.

``tests/config/test_methods.py`` checks that it equals the real registry exactly (names,
``needs_transformation``, the constructors' option names), so the two cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass

from raycompat.config import ConfigError
from raycompat.registry import Registry


@dataclass(frozen=True)
class MethodEntry:
    """One registered compatibility method as a config sees it.

    Attributes:
        needs_transformation: the method upgrades by transforming the gallery (FCT).
        options: the keyword arguments of its constructor other than ``old``, in order.
    """

    needs_transformation: bool = False
    options: tuple[str, ...] = ()


# One entry per name registered in raycompat.methods (baselines, bct, dsimplex, fct, nifcl).
METHOD_CATALOG: dict[str, MethodEntry] = {
    "independent": MethodEntry(),
    "ift": MethodEntry(),
    "er": MethodEntry(),
    "l2": MethodEntry(options=("weight",)),
    "lwf": MethodEntry(options=("weight", "temperature")),
    "bct": MethodEntry(options=("weight", "normalize_synthesized")),
    "cores": MethodEntry(),
    "dsimplex_hoc": MethodEntry(options=("lam", "rho", "nce_mask")),
    "dsimplex_fd": MethodEntry(options=("weight", "distance")),
    "fct": MethodEntry(needs_transformation=True),
    "nifcl_avg": MethodEntry(options=("weight", "temperature", "lam")),
    "nifcl_rw": MethodEntry(options=("weight", "temperature", "lam")),
}


def _catalog_registry() -> Registry:
    """The entries under the family name of :data:`raycompat.methods.METHODS`, so an unknown
    name is refused with the registry's own message (the valid names listed)."""
    registry: Registry = Registry("compatibility method")
    for name, entry in METHOD_CATALOG.items():
        registry.register(name)(entry)
    return registry


_CATALOG = _catalog_registry()


def method_entry(name: str) -> MethodEntry:
    """The catalogue entry of ``name``; an unknown name raises
    :class:`~raycompat.registry.UnknownNameError` listing the valid names, as the registry does."""
    return _CATALOG.get(name)


def check_method_options(name: str, options: dict, key: str = "method_options") -> None:
    """Reject option names the method does not take (a :class:`ConfigError` naming ``key``),
    without importing or constructing the method."""
    valid = method_entry(name).options
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(
            f"{key}: {name!r} takes no option(s) {', '.join(unknown)}; "
            f"valid: {', '.join(valid) or 'none'}"
        )
