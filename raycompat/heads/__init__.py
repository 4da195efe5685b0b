"""Deprecated path (removed in the next release): use :mod:`raycompat.nn.heads`."""

from raycompat._moved import reexport_package

reexport_package(globals(), "raycompat.nn.heads")
