"""Ray Data pipelines that write gallery versions into the store (the Ray layer).

- :mod:`~raycompat.pipelines.extract`: images -> model actors -> a new version (backfill, initial
  index).
- :mod:`~raycompat.pipelines.transform`: a version -> FCT transformation actors -> a new version;
  :func:`identity_upgrade` for backward-compatible upgrades (no rewrite).
- :mod:`~raycompat.pipelines.backfill`: a version -> h(old), a budgeted fraction re-extracted from
  the images (FastFill's partial backfill) -> a new version.
- :mod:`~raycompat.pipelines.resume`: the per-chunk commit log that makes both resumable.

Both stream (memory bounded by actors x batch rows) and publish only after ``Staging.commit``
has verified every part. See ``docs/pipelines.md``.
"""

from raycompat.pipelines.backfill import partial_backfill_version
from raycompat.pipelines.extract import embed, extract_version
from raycompat.pipelines.models import (
    load_transformation,
    read_transformation_spec,
    save_transformation,
)
from raycompat.pipelines.resume import PlanMismatchError
from raycompat.pipelines.runner import PipelineError, RunOptions
from raycompat.pipelines.sources import SOURCES, SourceSpec
from raycompat.pipelines.transform import (
    IdentityUpgrade,
    apply_transformation,
    identity_upgrade,
    transform_version,
)

__all__ = [
    "SOURCES",
    "IdentityUpgrade",
    "PipelineError",
    "PlanMismatchError",
    "RunOptions",
    "SourceSpec",
    "apply_transformation",
    "embed",
    "extract_version",
    "identity_upgrade",
    "load_transformation",
    "partial_backfill_version",
    "read_transformation_spec",
    "save_transformation",
    "transform_version",
]
