"""The upgrade job's Ray-free pieces: evaluation and decision (pure), report, lock, backfill
evaluation. Its config is :mod:`raycompat.config.upgrade`; the stages that ``jobs/upgrade.py``
runs in order are in :mod:`raycompat.cluster.upgrade` (Ray layer). See docs/upgrade.md.

:func:`evidence` (:mod:`.evaluate`) measures a candidate, :func:`decide` (:mod:`.policy`) turns
the evidence into a :class:`Decision`, :func:`write_report` (:mod:`.report`) writes the run's
report, :func:`upgrade_lease` (:mod:`.lock`) keeps one upgrade per gallery at a time. The names
load at their first use.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "evaluate": ("Evidence", "evidence"),
        "policy": ("Decision", "decide"),
        "report": ("Report", "write_report"),
        "lock": ("UpgradeRunningError", "upgrade_lease"),
        "backfill_eval": ("backfill_evaluation",),
    },
)
