"""Forward Compatible Training (FCT, CVPR 2022): the new model is trained independently
(plain cross-entropy, its accuracy untouched) and compatibility comes afterwards from the
transformation ``h(phi_old, psi) -> phi_new`` (:mod:`raycompat.transformation`) applied to the
stored gallery, with side-information from :mod:`raycompat.side_info`.
"""

from __future__ import annotations

import torch

from raycompat.methods.base import METHODS, Batch, CompatibilityMethod, classification_terms


@METHODS.register("fct")
class ForwardCompatibleTraining(CompatibilityMethod):
    name = "fct"
    init = "random"
    needs_transformation = True

    def losses(self, model, batch: Batch) -> dict[str, torch.Tensor]:
        _, terms = classification_terms(model, batch)
        return {**terms, "loss": terms["ce"]}
