"""The upgrade job on Ray: the history driver (:mod:`.job`), its stages and publishing actions.

:class:`Upgrader` (:mod:`.job`) runs an :class:`~raycompat.config.UpgradeConfig`'s history;
:class:`Publisher` (:mod:`.actions`) carries out a decision for a :class:`Candidate`.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "job": ("Upgrader",),
        "actions": ("Candidate", "Publisher"),
    },
)
