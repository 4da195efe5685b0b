"""Deprecated path (removed in the next release): use :mod:`raycompat.store.model_catalog`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.store.model_catalog")
