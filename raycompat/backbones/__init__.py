"""Deprecated path (removed in the next release): use :mod:`raycompat.nn.backbones`."""

from raycompat._moved import reexport_package

reexport_package(globals(), "raycompat.nn.backbones")
