"""The Ray-free halves of training: step rows, scenarios, the optimizer schedule, model export.

:func:`plan_steps` (:mod:`.scenarios`) turns a :class:`~raycompat.config.TrainConfig` into its
steps; :func:`optimizer_factory` and :func:`warmup_cosine` (:mod:`.schedule`) are the one
optimizer and learning-rate schedule; :class:`BatchLoader` (:mod:`.loader`) feeds a step;
:func:`build_model`, :func:`export_model` and :func:`load_exported_model` (:mod:`.export`) write
and read a trained model. The Ray Train driver is :mod:`raycompat.cluster.train`. The names load
at their first use.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "scenarios": ("SCENARIOS", "plan_steps"),
        "schedule": ("optimizer_factory", "warmup_cosine"),
        "loader": ("BatchLoader", "BatchSpec"),
        "data": ("sampler_batches",),
        "export": (
            "build_model",
            "export_model",
            "load_exported_model",
            "load_features",
            "save_features",
        ),
    },
)
