"""Deprecated path (removed in the next release): use :mod:`raycompat.config.pipelines`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.config.pipelines")
