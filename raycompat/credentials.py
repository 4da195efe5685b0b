"""Deprecated path (removed in the next release): use :mod:`raycompat.io.credentials`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.io.credentials")
