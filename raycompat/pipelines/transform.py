"""Deprecated path: use :mod:`raycompat.cluster.pipelines.transform`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.cluster.pipelines.transform")
