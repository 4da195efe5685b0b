"""Forward Compatible Training (FCT, CVPR 2022): the new model is trained independently
(plain cross-entropy, its accuracy untouched) and compatibility comes afterwards from the
transformation ``h(phi_old, psi) -> phi_new`` (:mod:`raycompat.transformations.fct`) applied to the
stored gallery, with side-information from :mod:`raycompat.nn.side_info`.
"""

from __future__ import annotations

from raycompat.methods.base import CrossEntropyMethod


class ForwardCompatibleTraining(CrossEntropyMethod):
    name = "fct"
    init = "random"
