"""Deprecated path: use :mod:`raycompat.cluster.pipelines.selection`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.cluster.pipelines.selection")
