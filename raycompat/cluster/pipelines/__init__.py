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
"""

from raycompat.cluster.pipelines.adopt import adopt_version
from raycompat.cluster.pipelines.backfill import partial_backfill_version
from raycompat.cluster.pipelines.extract import embed, extract_version
from raycompat.cluster.pipelines.index import RayTasks
from raycompat.cluster.pipelines.resume import PlanMismatchError
from raycompat.cluster.pipelines.runner import PipelineError
from raycompat.cluster.pipelines.sources import SOURCES, SourceSpec
from raycompat.cluster.pipelines.transform import (
    IdentityUpgrade,
    apply_transformation,
    identity_upgrade,
    transform_version,
)
from raycompat.config.pipelines import RunOptions

__all__ = [
    "SOURCES",
    "IdentityUpgrade",
    "PipelineError",
    "PlanMismatchError",
    "RayTasks",
    "RunOptions",
    "SourceSpec",
    "adopt_version",
    "apply_transformation",
    "embed",
    "extract_version",
    "identity_upgrade",
    "partial_backfill_version",
    "transform_version",
]
