"""The partial backfill's plan: every check and decision that needs no row, before Ray starts.

    plan = plan_partial_backfill(store, "faces", "v1", target, "runs/fct_m3", "runs/m3/model",
                                 SourceSpec(...), budget=0.3, order="uncertainty", seed=0,
                                 run=RunOptions())
    plan.k, plan.schema, plan.identity      # k = round(budget * N) rows to re-extract

:func:`plan_partial_backfill` reads only small things (the version's record, part footers, part
records, h's and the model's specs) and returns a :class:`BackfillPlan`; the driver in
``backfill.py`` then runs pass A (which rows, ``selection.py``) and pass B (the rows) from it.
FastFill: Jaeckle et al., ICLR 2023. See ``docs/pipelines.md``, "Partial backfill pipeline".
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from raycompat.backfill import check_budget
from raycompat.cluster.pipelines.extract import check_model_width
from raycompat.cluster.pipelines.inputs import file_digest, plan_version_chunks
from raycompat.cluster.pipelines.parts import Chunk
from raycompat.cluster.pipelines.selection import ORDERS
from raycompat.cluster.pipelines.sources import SourceSpec
from raycompat.cluster.pipelines.transform import check_transformation
from raycompat.config.pipelines import RunOptions
from raycompat.errors import ConfigError
from raycompat.store import GalleryStore, SchemaError, VersionInfo
from raycompat.store.commit.checks import RECORD_READERS
from raycompat.store.commit.part_record import PartRecord, part_record_path
from raycompat.store.schema import PROVENANCE_FIELD, UNCERTAINTY_FIELD, embedding_schema
from raycompat.train.export import MODEL_FILE
from raycompat.transformations import H, read_transformation_spec, weights_path

logger = logging.getLogger(__name__)
BACKFILL_COLUMNS = ("provenance", "uncertainty")


@dataclasses.dataclass(frozen=True)
class BackfillPlan:
    """A partial backfill of ``source`` into ``target``, decided before any Ray work.

    Attributes:
        target: the caller's target with ``lineage`` from :func:`partial_backfill_lineage`.
        chunks / id_type: the source's chunks and id type (``plan_version_chunks``).
        kept: source columns carried as they are (``label``...; not ``provenance``,
            ``uncertainty``, which are rewritten).
        transformation: h's directory; None from a partial source (h is not applied again).
        partial: the source is itself a partial backfill (it has ``provenance``).
        with_uncertainty: the rows get a ``sigma`` (h has the head, or the source stores one).
        k: rows to hold new-model embeddings, ``round(budget * N)``.
        stored: rows the source holds extracted, from its part records (0 for an old-model
            source; None when a part has no counts).
        schema / identity: the output schema, and what ``_plan.json`` records.
    """

    source: VersionInfo
    target: VersionInfo
    chunks: list[Chunk]
    id_type: str
    kept: list[pa.Field]
    transformation: str | None
    partial: bool
    with_uncertainty: bool
    budget: float
    order: str
    seed: int
    k: int
    stored: int | None
    schema: pa.Schema
    identity: dict

    @property
    def needs_keys(self) -> bool:
        """Pass A runs: some but not all rows are selected (and k = 0 of a partial source whose
        counts are unknown, so that pass A checks it holds none)."""
        return self.k < self.source.rows and (self.k > 0 or self.stored is None)


def partial_backfill_lineage(
    version: str,
    source: str,
    transformation: str | None,
    model_version: str,
    budget: float,
    order: str,
    seed: int,
) -> str:
    """``"v3 = partial_backfill(v1, h=fct_m3, extract=m3, budget=0.3, order=uncertainty)"``
    (no ``h=`` from a partial source; ``seed=`` for the random order)."""
    args = [source] + ([f"h={Path(transformation).name}"] if transformation else [])
    args += [f"extract={model_version}", f"budget={budget!r}", f"order={order}"]
    args += [f"seed={seed}"] if order == "random" else []
    return f"{version} = partial_backfill({', '.join(args)})"


def extracted_in_version(store: GalleryStore, gallery: str, info: VersionInfo) -> int | None:
    """Rows a partial backfill version holds extracted, from the counts in its parts' records
    (O(parts) reads, no row); None if a part has none (not written by this pipeline)."""
    if info.external is not None:
        return None

    def read(path: str) -> int | None:
        record = part_record_path(posixpath.dirname(path), posixpath.basename(path))
        try:
            with store.filesystem.open_input_stream(record) as handle:
                counts = PartRecord.from_json(handle.read(), record).extra.get("counts")
        except FileNotFoundError:
            return None
        return None if counts is None else int(counts["extracted"])

    with ThreadPoolExecutor(RECORD_READERS) as pool:
        counts = list(pool.map(read, [path for path, _ in store.version_files(gallery, info)]))
    return None if None in counts else sum(counts)


def budget_too_low(budget: float, k: int, source: VersionInfo, extracted: int) -> ConfigError:
    return ConfigError(
        f"budget {budget!r} is {k} of {source.rows} rows, but source {source.version} holds "
        f"{extracted} extracted rows already; a partial backfill never turns them back into "
        f"h(old): use a budget >= {extracted / source.rows:.6g}"
    )


def check_options(budget, order: str, seed: int) -> float:
    """The budget as a float in [0, 1], once ``order`` and ``seed`` are valid."""
    budget = check_budget(budget)
    if order not in ORDERS:
        raise ConfigError(f"order must be one of {list(ORDERS)}, got {order!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an int >= 0, got {seed!r}")
    return budget


def _check_partial_source(
    source: VersionInfo, target: VersionInfo, carried: list[str], order: str
) -> bool:
    """A source that is a partial backfill fits the target (same model, width, normalisation);
    returns whether it stores ``uncertainty``."""
    if source.model_version != target.model_version:
        raise SchemaError(
            f"source {source.version} is a partial backfill of model "
            f"{source.model_version!r}; target {target.version} declares "
            f"{target.model_version!r} (its extracted rows would be of another model)"
        )
    if source.width != target.width or (target.normalized and not source.normalized):
        raise SchemaError(
            f"source {source.version} (width {source.width}, normalized "
            f"{source.normalized}) does not fit target {target.version} (width "
            f"{target.width}, normalized {target.normalized})"
        )
    if order == "uncertainty" and "uncertainty" not in carried:
        raise SchemaError(
            f"order='uncertainty' but source {source.version} stores no uncertainty column "
            f"(it was backfilled without sigma); use order='random'"
        )
    return "uncertainty" in carried


def _check_old_source(
    source: VersionInfo, target: VersionInfo, transformation: str | None, order: str
) -> bool:
    """An old-model source has h, whose widths fit; returns whether h has the uncertainty
    head (which ``order="uncertainty"`` needs)."""
    if not transformation:
        raise ConfigError(
            f"source {source.version} holds old-model rows: a partial backfill needs the "
            f"transformation h (a directory holding h.safetensors + h.json)"
        )
    check_transformation(source, target, transformation, None)
    with_uncertainty = read_transformation_spec(transformation, H).uncertainty
    if order == "uncertainty" and not with_uncertainty:
        raise ConfigError(
            f"order='uncertainty' needs h with an uncertainty head, but "
            f"{Path(transformation) / 'h.json'} has none (uncertainty: false); export h "
            f"fitted with fit_uncertain_transformation, or use order='random'"
        )
    return with_uncertainty


def check_backfill_inputs(
    source: VersionInfo,
    target: VersionInfo,
    carried: list[str],
    transformation: str | None,
    model: str,
    images: SourceSpec,
    id_type: str,
    order: str,
) -> bool:
    """Every check that needs no row, before any Ray work; returns whether the rows get a
    ``sigma`` (h has the head, or a partial source stores one)."""
    if target.side_info_width is not None:
        raise SchemaError(
            f"target {target.version}: a partial backfill writes no side_info column "
            f"(side_info_width must be None)"
        )
    if "provenance" in carried:  # raising the budget of an earlier partial backfill
        with_uncertainty = _check_partial_source(source, target, carried, order)
    else:
        with_uncertainty = _check_old_source(source, target, transformation, order)
    check_model_width(model, target)
    if images.kind != "dataset":
        raise ConfigError(
            f"images: a partial backfill loads images by id, which only the 'dataset' source "
            f"supports (ids are row numbers); got kind {images.kind!r}"
        )
    if id_type != "int64":
        raise SchemaError(
            f"source {source.version} has {id_type} ids; the 'dataset' image source needs int64 "
            f"ids (its row numbers)"
        )
    return with_uncertainty


def backfill_schema(
    target: VersionInfo, id_type: str, kept: list[pa.Field], with_uncertainty: bool
) -> pa.Schema:
    """``id, embedding (target.width), <kept columns>, provenance[, uncertainty]``."""
    schema = embedding_schema(target.width, id_type, dtype=target.dtype)
    extra = [PROVENANCE_FIELD] + ([UNCERTAINTY_FIELD] if with_uncertainty else [])
    return pa.schema(list(schema) + kept + extra)


def _inputs_identity(
    h_dir: str | None, model: str, images: SourceSpec, budget: float, order: str, seed: int
) -> dict:
    """What ``_plan.json`` records of the inputs: digests of h's and the model's weights, the
    image source and the selection's options (a rerun with other ones is refused)."""
    return {
        "h": file_digest(weights_path(h_dir, H)) if h_dir else None,
        "model": file_digest(Path(model) / MODEL_FILE),
        "images": repr(images),
        "budget": budget,
        "order": order,
        "seed": seed if order == "random" else None,
    }


def plan_partial_backfill(
    store: GalleryStore,
    gallery: str,
    source_version: str,
    target: VersionInfo,
    transformation: str | None,
    model: str,
    images: SourceSpec,
    budget: float,
    order: str,
    seed: int,
    run: RunOptions,
) -> BackfillPlan:
    """Check everything that needs no row and plan the backfill (arguments as
    :func:`~raycompat.cluster.pipelines.backfill.partial_backfill_version` takes them).

    Raises:
        ConfigError / SchemaError: an input out of range or not fitting, named; a budget below
            the rows a partial source holds extracted already (when its part records count
            them).
    """
    budget = check_options(budget, order, seed)
    source = store.version(gallery, source_version)  # ManifestError if absent
    chunks, id_type, carried_fields = plan_version_chunks(store, gallery, source, run.rows_per_file)
    carried = [f.name for f in carried_fields]
    partial = "provenance" in carried
    if partial and transformation:
        logger.info("%s/%s is a partial backfill: h is not applied again", gallery, source_version)
    h_dir = None if partial else transformation
    with_uncertainty = check_backfill_inputs(
        source, target, carried, h_dir, model, images, id_type, order
    )
    k = int(np.rint(budget * source.rows))
    stored = extracted_in_version(store, gallery, source) if partial else 0
    if stored is not None and stored > k:  # known before any work for this pipeline's versions
        raise budget_too_low(budget, k, source, stored)
    lineage = partial_backfill_lineage(
        target.version, source.version, h_dir, target.model_version, budget, order, seed
    )
    kept = [f for f in carried_fields if f.name not in BACKFILL_COLUMNS]
    identity = {
        "kind": "partial_backfill",
        "source": f"{gallery}/{source.version}@{source.created}",
        **_inputs_identity(h_dir, model, images, budget, order, seed),
        "rows_per_file": run.rows_per_file,
    }
    return BackfillPlan(
        source=source,
        target=dataclasses.replace(target, lineage=lineage),
        chunks=chunks,
        id_type=id_type,
        kept=kept,
        transformation=h_dir,
        partial=partial,
        with_uncertainty=with_uncertainty,
        budget=budget,
        order=order,
        seed=seed,
        k=k,
        stored=stored,
        schema=backfill_schema(target, id_type, kept, with_uncertainty),
        identity=identity,
    )
