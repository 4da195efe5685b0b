"""Deprecated path (removed in the next release): use :mod:`raycompat.config.upgrade`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.config.upgrade")
