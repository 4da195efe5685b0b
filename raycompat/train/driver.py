"""Deprecated path (removed in the next release): use :mod:`raycompat.cluster.train.driver`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.cluster.train.driver")
