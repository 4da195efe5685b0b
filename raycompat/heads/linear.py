"""Deprecated path (removed in the next release): use :mod:`raycompat.nn.heads.linear`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.nn.heads.linear")
