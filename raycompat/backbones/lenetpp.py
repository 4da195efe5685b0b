"""Deprecated path (removed in the next release): use :mod:`raycompat.nn.backbones.lenetpp`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.nn.backbones.lenetpp")
