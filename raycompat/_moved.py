"""Old import paths that keep working for one release after a module moved (docs/api.md).

A moved module's old file calls :func:`alias_module`: the old name becomes the new module itself
(``sys.modules`` holds one object under both names, so classes, globals and monkeypatches are
shared), with a ``DeprecationWarning`` that names the new path. A moved package's old
``__init__`` calls :func:`reexport_package`, which copies the new package's names and keeps the
old folder as the package path, so each old submodule path finds its own alias file.
"""

from __future__ import annotations

import importlib
import sys
import warnings


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; import it from there (the old path is removed in "
                  "the next release)", DeprecationWarning, stacklevel=4)


def alias_module(old: str, new: str) -> None:
    """Make module ``old`` the module ``new`` (called from the old module's own file)."""
    _warn(old, new)
    sys.modules[old] = importlib.import_module(new)


def reexport_package(namespace: dict, new: str) -> None:
    """Fill an old package's ``namespace`` with every name of package ``new``."""
    _warn(namespace["__name__"], new)
    module = importlib.import_module(new)
    for name, value in vars(module).items():
        if name == "__all__" or not (name.startswith("__") and name.endswith("__")):
            namespace.setdefault(name, value)
