"""Deprecated path (removed in the next release): use :mod:`raycompat.cli.job_entry`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.cli.job_entry")
