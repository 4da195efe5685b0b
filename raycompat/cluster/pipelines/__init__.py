"""Ray Data pipelines that write gallery versions into the store (the Ray layer).

- :mod:`~raycompat.cluster.pipelines.extract`: images -> model actors -> a new version (backfill,
  initial index).
- :mod:`~raycompat.cluster.pipelines.transform`: a version -> transformation actors (any kind of
  ``h``, :mod:`raycompat.transformations`) -> a new version; :func:`identity_upgrade` for
  backward-compatible upgrades (no rewrite).
- :mod:`~raycompat.cluster.pipelines.backfill`: a version -> h(old), a budgeted fraction
  re-extracted from the images (FastFill's partial backfill) -> a new version.
- :mod:`~raycompat.cluster.pipelines.resume`: the per-chunk commit log that makes both resumable.
- :mod:`~raycompat.cluster.pipelines.adopt`: :func:`adopt_version` registers existing Parquet,
  Delta or Iceberg tables; :mod:`~raycompat.cluster.pipelines.index`: :class:`RayTasks` builds
  sharded indexes with Ray tasks.

Both stream (memory bounded by actors x batch rows) and publish only after ``Staging.commit``
has verified every part. See ``docs/pipelines.md``.

Names load on first use (``raycompat/_lazy.py``): an actor that unpickles
``transform.TransformChunks`` imports this package first, and importing every pipeline here
(faiss for the index runner, the backfill's planning, Delta and Iceberg for adoption) cost each
actor about 0.2 s of its start-up.
"""

from raycompat._lazy import lazy_exports

# the pipelines' typed options (no Ray, no torch): imported as they are
from raycompat.config.pipelines import RunOptions as RunOptions
from raycompat.config.pipelines import SourceSpec as SourceSpec

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "adopt": ("adopt_version",),
        "backfill": ("partial_backfill_version",),
        "extract": ("embed", "extract_version"),
        "index": ("RayTasks",),
        "resume": ("PlanMismatchError",),
        "runner": ("PipelineError",),
        "sources": ("SOURCES",),
        "transform": (
            "IdentityUpgrade",
            "apply_transformation",
            "identity_upgrade",
            "transform_version",
        ),
    },
)
__all__ = sorted([*__all__, "RunOptions", "SourceSpec"])
