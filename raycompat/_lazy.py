"""Lazy exports for a package's ``__init__`` (PEP 562), so importing a package stays cheap.

A package whose public names live in modules that import torch, faiss, deltalake, pyiceberg or
Ray (or that import the package itself back) names each one's module instead of importing it::

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"base": ("Batch", "OldModel")})

``from package import Batch`` then imports ``package.base`` at that moment, once; ``import
package`` imports none of them. The scientific Python ecosystem's ``lazy_loader.attach`` (SPEC
1) has the same shape.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, names)`` for ``package``.

    ``homes`` maps a module, relative to ``package`` (``"base"``, ``"formats.adopt"``), to the
    names it defines that ``package`` exports. ``names``: those names, sorted. A name is looked
    up in its module at first access and then kept in the package's namespace; any other name
    raises ``AttributeError`` as usual (so ``from package import submodule`` still imports it).
    """
    home = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *home})

    return __getattr__, __dir__, sorted(home)
