"""Deprecated path (removed in the next release): use :mod:`raycompat.cluster.pipelines`."""

from raycompat._moved import reexport_package

reexport_package(globals(), "raycompat.cluster.pipelines")
