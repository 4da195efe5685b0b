"""Deprecated path (removed in the next release): use :mod:`raycompat.nn.backbones.cifar_resnet`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.nn.backbones.cifar_resnet")
