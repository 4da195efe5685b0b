"""Deprecated path (removed in the next release): use :mod:`raycompat.index.distances`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.index.distances")
