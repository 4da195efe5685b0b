"""Deprecated path (removed in the next release): use :mod:`raycompat.index.version_index`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.index.version_index")
