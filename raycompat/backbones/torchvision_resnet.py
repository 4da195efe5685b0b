"""Deprecated path: use :mod:`raycompat.nn.backbones.torchvision_resnet`."""

from raycompat._moved import alias_module

alias_module(__name__, "raycompat.nn.backbones.torchvision_resnet")
