"""Ray Tune sweeps over the training driver (Ray layer). See ``docs/tune.md``.

:func:`run_sweep` (:mod:`.sweep`) runs a :class:`~raycompat.config.SweepConfig`;
:data:`OBJECTIVES` (:mod:`.objectives`) is the registry of what a sweep optimises.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "sweep": ("run_sweep",),
        "objectives": ("OBJECTIVES",),
    },
)
