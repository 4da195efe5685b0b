"""Ray Train: the TorchTrainer driver, the per-worker loops (models and FCT), checkpoints.

:func:`run_training` (:mod:`.driver`) runs a :class:`~raycompat.config.TrainConfig`'s steps, a
``TorchTrainer`` each; :func:`fit_transformation` and :func:`transform_features`
(:mod:`.fct_fit`) fit FCT's ``h`` from arrays and apply it; :func:`train_side_info` and
:func:`train_transformation` (:mod:`.fct_loop`) are FCT's two Ray Train runs.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "driver": ("TrainingResult", "run_training"),
        "fct_fit": ("fit_transformation", "transform_features"),
        "fct_loop": ("train_side_info", "train_transformation"),
    },
)
