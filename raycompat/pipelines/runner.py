"""Deprecated path (removed in the next release): use :mod:`raycompat.cluster.pipelines.runner`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.cluster.pipelines.runner")
