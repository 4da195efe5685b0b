"""Deprecated path (removed in the next release): use :mod:`raycompat.cluster.tune.space`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.cluster.tune.space")
