"""Partial backfill (FastFill, Jaeckle et al., ICLR 2023) of a stored gallery: one new version.

    partial_backfill_version(store, "faces", "v1", VersionInfo("v3", "m3", 512, True, "-"),
                             "runs/fct_m3", "runs/m3/model", SourceSpec(...), budget=0.3)

Every row of the new version is ``h(old)`` (FCT's transformation, ``provenance="transformed"``)
except ``k = round(budget * N)`` rows, chosen most uncertain first (``order="uncertainty"``: h's
predicted ``sigma``, largest first) or in a seeded random order, which are re-extracted from
their source images by the new model (``provenance="extracted"``). ``uncertainty`` holds h's
``sigma`` of every row when h has the head.

The driver reads as plan, then run: :func:`plan_partial_backfill` (``backfill_plan.py``)
checks every input and decides ``k``, the schema and the run's identity without reading a row;
then two passes over the source version's chunks, both resumable (:func:`decide_selection`,
:func:`write_rows`):

- A (``selection.py``): an actor pool writes each row's selection key; Ray Data sorts them and the
  driver keeps only the ``k``-th (a threshold): exactly ``k`` rows pass it, ties broken by id.
- B: a :class:`~raycompat.cluster.pipelines.runner.ChunkWorker` per chunk reads the rows, applies
  ``h``,
  loads and embeds the selected rows' images (the extraction pipeline's reader and ``embed``,
  decoded a batch ahead), and writes one part per chunk, with its counts of extracted rows in
  its part record (``extra["counts"]``); the version is committed from the part records in
  O(parts), like the transform, after checking from those counts (O(parts)) that it holds
  exactly ``k`` extracted rows.

Raising the budget later: from a version that is itself a partial backfill (it has
``provenance``), extracted rows are copied and count first against the budget, transformed rows
keep their stored embedding and ``sigma`` (h is not applied again) and are re-extracted if
selected; ``transformation`` may be None. See ``docs/pipelines.md``, "Partial backfill pipeline".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import closing

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from raycompat.cluster.pipelines.backfill_plan import (
    BackfillPlan,
    budget_too_low,
    plan_partial_backfill,
)
from raycompat.cluster.pipelines.extract import PREFETCH_BATCHES, embed
from raycompat.cluster.pipelines.inputs import iter_chunk_batches
from raycompat.cluster.pipelines.parts import Chunk, PartWriter
from raycompat.cluster.pipelines.resume import record_plan
from raycompat.cluster.pipelines.runner import ChunkWorker, run_staged
from raycompat.cluster.pipelines.selection import (
    SELECTION_FILE,
    Selection,
    key_path,
    read_keys,
    select_rows,
    stored_selection,
)
from raycompat.cluster.pipelines.sources import (
    SourceSpec,
    images_of_rows,
    open_source,
    source_name,
)
from raycompat.cluster.pipelines.weights import (
    Shared,
    model_of,
    share_model,
    share_transformation,
    transformation_of,
)
from raycompat.config.pipelines import RunOptions
from raycompat.io.prefetch import prefetch
from raycompat.store import GalleryStore, Staging, StoreError, VersionInfo
from raycompat.store.commit.part_record import IdFingerprint
from raycompat.store.read.vectors import vectors
from raycompat.store.schema import ID_TYPES
from raycompat.transformations import H, read_transformation

logger = logging.getLogger(__name__)


class BackfillChunks(ChunkWorker):
    """Actor: builds ``h`` and the new model once from the object store (``weights.py``) and
    opens the image source, then writes chunk after chunk: ``h(old)`` (or the stored rows of a
    partial source), selected rows re-extracted."""

    def __init__(
        self,
        *,
        source: VersionInfo,
        transformation: Shared | str | None,
        model: Shared | str,
        images: SourceSpec,
        selection: Selection,
        order: str,
        carried: list[str],
        with_uncertainty: bool,
        **base,
    ) -> None:
        super().__init__(**base)
        self.source, self.selection, self.order = source, selection, order
        self.carried, self.with_uncertainty = carried, with_uncertainty
        self.h = transformation_of(transformation, H).to(self.device) if transformation else None
        self.model = model_of(model).to(self.device)
        self.images, self.images_name = open_source(images), source_name(images)

    def fill(self, chunk: Chunk, writer: PartWriter) -> None:
        keys = read_keys(self.staging, chunk) if self.selection.threshold is not None else None
        counts = {"extracted": 0, "copied": 0}
        # the next batch's images are read and decoded in a thread while the models run
        with closing(prefetch(self.prepared(chunk, keys), depth=PREFETCH_BATCHES)) as ready:
            for batch, chosen, extract, key, images in ready:
                writer.read(batch.column("id"))
                writer.write(self.rows(batch, chosen, extract, key, images))
                counts["extracted"] += int(chosen.sum())
                counts["copied"] += int((chosen & ~extract).sum())
        writer.extra["counts"] = counts  # in the part record: a published part has its counts

    def prepared(self, chunk: Chunk, keys: pa.Table | None):
        """Per source batch: ``(batch, chosen, extract, key, images of the rows to extract)``;
        ``chosen`` rows end up extracted, ``extract`` are those not extracted in the source."""
        source, offset = self.store.backend.uri(chunk.path), 0
        for batch in iter_chunk_batches(self.store, chunk, self.source, self.run.batch_size):
            n, ids = batch.num_rows, batch.column("id")
            key = None
            if keys is not None:
                key_ids = keys.column("id").slice(offset, n).combine_chunks()
                if not key_ids.equals(ids.cast(key_ids.type)):
                    keys_uri = self.staging.uri_of(key_path(self.staging, chunk.part))
                    raise StoreError(
                        f"{keys_uri}: its ids differ from {source} rows {chunk.start + offset}..; "
                        f"abort this staging area"
                    )
                key = keys.column("key").slice(offset, n).to_numpy()
            chosen = self.selection.selects(key, ids)
            stored = np.zeros(n, dtype=bool)
            if "provenance" in batch.column_names:
                stored = pc.equal(batch.column("provenance"), "extracted").to_numpy(
                    zero_copy_only=False
                )
            if (stored & ~chosen).any():  # the driver refuses budgets below the stored share
                raise StoreError(f"{source}: an extracted row is not selected; budget too low")
            extract = chosen & ~stored
            rows = ids.to_numpy(zero_copy_only=False)[extract]
            images = None
            if rows.size:
                images = images_of_rows(self.images, rows, source, self.images_name)
            yield batch, chosen, extract, key, images
            offset += n

    def rows(self, batch, chosen, extract, key, images) -> pa.Table:
        sigma = None
        if self.h is None:  # a partial source: its rows are in the new space already
            embedding = vectors(batch, "embedding")
            if self.with_uncertainty:
                sigma = batch.column("uncertainty").to_numpy(zero_copy_only=False)
        else:
            old = torch.from_numpy(vectors(batch, "embedding")).to(self.device)
            side = None
            if self.h.d_side:
                side = torch.from_numpy(vectors(batch, "side_info")).to(self.device)
            with torch.inference_mode():  # fp32: sigma ranks rows; bf16 would tie most of them
                if self.h.has_uncertainty:
                    out, sigma_t = self.h.forward_with_uncertainty(old, side)
                    sigma = sigma_t.float().cpu().numpy()
                else:
                    out = self.h(old, side)
            embedding = out.float().cpu().numpy()
            if key is not None and self.order == "uncertainty":
                sigma = key.astype(np.float32)  # the sigma pass A selected with, to the bit
        if images is not None:
            normalize = self.staging.info.normalized
            new = embed(self.model, images.to(self.device), self.autocast, normalize)
            embedding[extract] = new.cpu().numpy()
        columns = {
            "id": batch.column("id"),
            "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(embedding.reshape(-1)), embedding.shape[1]
            ),
        }
        for name in self.carried:
            columns[name] = batch.column(name)
        columns["provenance"] = pa.array(np.where(chosen, "extracted", "transformed"))
        if self.with_uncertainty:
            columns["uncertainty"] = pa.array(sigma, pa.float32())
        return pa.table(columns)


def staged_counts(staging: Staging, chunks: list[Chunk]) -> dict[str, int]:
    """``{"extracted", "copied"}`` rows summed over the counts in the staged parts' records."""
    counts = {"extracted": 0, "copied": 0}
    records = {record.part: record for record in staging.parts()}
    for chunk in chunks:
        record = records.get(chunk.part)
        if record is None or "counts" not in record.extra:
            raise StoreError(
                f"{staging.uri}: part {chunk.part} has no counts in its record: it was not "
                f"written by this pipeline; abort this staging area"
            )
        for key in counts:
            counts[key] += record.extra["counts"][key]
    return counts


@dataclasses.dataclass(frozen=True)
class SharedInputs:
    """The weights both passes' actors build from, put once in Ray's object store: ``h``
    (None from a partial source) and the new model."""

    h: Shared | None
    model: Shared


def share_inputs(plan: BackfillPlan, model: str) -> SharedInputs:
    """Read ``h`` and the exported ``model`` on the driver and put them in the object store."""
    h = plan.transformation
    h = share_transformation(read_transformation(h, H)) if h else None
    return SharedInputs(h, share_model(model))


def _keys_or_all(
    store: GalleryStore,
    gallery: str,
    staging: Staging,
    plan: BackfillPlan,
    run: RunOptions,
    h: Shared | None,
) -> Selection:
    """Pass A when :attr:`BackfillPlan.needs_keys`; else all or none of the rows."""
    if not plan.needs_keys:
        return Selection(plan.source.rows, plan.k)
    key_kwargs = dict(
        source=plan.source,
        transformation=h,
        order=plan.order,
        seed=plan.seed,
        partial=plan.partial,
    )
    id_type = ID_TYPES[plan.id_type]
    return select_rows(store, gallery, staging, plan.chunks, plan.k, key_kwargs, run, id_type)


def decide_selection(
    store: GalleryStore,
    gallery: str,
    staging: Staging,
    plan: BackfillPlan,
    run: RunOptions,
    h: Shared | None,
) -> tuple[Selection, bool]:
    """Record the plan, then the selection an earlier run decided or pass A's (logged); returns
    it and whether it was resumed (``h``: :attr:`SharedInputs.h`). A budget below the rows the
    source holds extracted (counted by pass A) aborts the staging area: its plan names the
    refused budget."""
    refused = None
    try:
        record_plan(staging, plan.identity, plan.chunks)
        selection = stored_selection(staging)
        resumed = selection is not None
        if selection is None:
            selection = _keys_or_all(store, gallery, staging, plan, run, h)
            if selection.already_extracted > plan.k:
                extracted = selection.already_extracted
                refused = budget_too_low(plan.budget, plan.k, plan.source, extracted)
            else:
                staging.write_meta(SELECTION_FILE, selection.to_json())
    except BaseException:
        staging.release()
        raise
    if refused is not None:
        staging.abort()  # a corrected rerun starts afresh
        raise refused
    logger.info(
        "%s/%s: %d of %d rows to extract (%d extracted in the source), threshold %s",
        gallery,
        plan.target.version,
        plan.k,
        plan.source.rows,
        selection.already_extracted,
        selection.threshold,
    )
    return selection, resumed


def _counting(
    plan: BackfillPlan, counts: dict, verify: Callable[[Staging], None] | None
) -> Callable[[Staging], None]:
    """The pre-publish check of pass B: the staged parts' counts (into ``counts``) add up to
    ``k`` extracted rows, then the caller's ``verify``."""

    def checked(staged: Staging) -> None:
        counts.update(staged_counts(staged, plan.chunks))
        if counts["extracted"] != plan.k:
            raise StoreError(
                f"{staged.uri}: staged {counts['extracted']} extracted rows, expected {plan.k}"
            )
        if verify is not None:
            verify(staged)

    return checked


def write_rows(
    store: GalleryStore,
    gallery: str,
    staging: Staging,
    plan: BackfillPlan,
    selection: Selection,
    *,
    shared: SharedInputs,
    images: SourceSpec,
    run: RunOptions,
    verify: Callable[[Staging], None] | None,
) -> tuple[dict, dict]:
    """Pass B: every chunk through :class:`BackfillChunks`, then publish; returns the writer's
    summary and the staged ``{"extracted", "copied"}`` counts."""
    counts: dict = {}
    worker_kwargs = dict(
        source=plan.source,
        transformation=shared.h,
        model=shared.model,
        images=images,
        selection=selection,
        order=plan.order,
        carried=[f.name for f in plan.kept],
        with_uncertainty=plan.with_uncertainty,
    )
    source = plan.source
    result = run_staged(
        store,
        gallery,
        staging,
        name=f"partial backfill {gallery}/{source.version} -> {plan.target.version}",
        identity=plan.identity,
        chunks=plan.chunks,
        worker=BackfillChunks,
        worker_kwargs=worker_kwargs,
        schema=plan.schema,
        run=run,
        verify=_counting(plan, counts, verify),
        # each part maps its input chunk's rows 1:1, as the transform's do: O(parts)
        check="records" if source.ids else "rows",
        expected_ids=IdFingerprint.from_dict(source.ids) if source.ids else None,
    )
    return result, counts


def partial_backfill_version(
    store: GalleryStore,
    gallery: str,
    source_version: str,
    target: VersionInfo,
    transformation: str | None,
    model: str,
    images: SourceSpec,
    budget: float,
    order: str = "uncertainty",
    seed: int = 0,
    options: RunOptions | None = None,
    staging_name: str | None = None,
    verify: Callable[[Staging], None] | None = None,
) -> dict:
    """Publish ``target``: ``source_version`` through h, with ``round(budget * N)`` rows
    re-extracted by ``model`` from ``images`` in ``order``; resumable.

    Args:
        transformation: directory holding ``h.safetensors`` + ``h.json`` (built with
            ``uncertainty=True`` for ``order="uncertainty"``); None when the source is itself a
            partial backfill (h is not applied again).
        model: exported new model (``export_model``), as :func:`extract_version` takes it.
        images: the gallery's images; the version's ids are its row numbers (``dataset``).
        budget: fraction of all rows holding new-model embeddings, in [0, 1] (rows a partial
            source extracted already count); ``order``: ``"uncertainty"`` or ``"random"``
            (by a hash of the id and ``seed``).
        staging_name: fixed per job so that a rerun resumes (default
            ``partial-backfill-<source>``); verify: called before publishing, as in
            :func:`transform_version`.
    ``target.lineage`` is replaced by
    :func:`~raycompat.cluster.pipelines.backfill_plan.partial_backfill_lineage` (it records the
    budget and the order, which ``VersionInfo`` has no field for).
    Returns:
        the writer's progress summary (rows, rows/s, seconds) plus ``version`` (the published
        record), ``extracted`` (= k), ``newly_extracted``, ``already_extracted``,
        ``threshold`` (``{"key", "id"}`` of the k-th row, or None when k is 0 or N),
        ``budget``, ``order``, ``seed``, ``selection_seconds`` and ``selection_resumed``.
    """
    run = options or RunOptions()
    plan = plan_partial_backfill(
        store,
        gallery,
        source_version,
        target,
        transformation,
        model,
        images,
        budget,
        order,
        seed,
        run,
    )
    name = staging_name or f"partial-backfill-{source_version}"
    shared = share_inputs(plan, model)  # actors never read a folder: it may be the driver's
    staging = store.begin(gallery, plan.target, name)
    start = time.perf_counter()
    selection, resumed = decide_selection(store, gallery, staging, plan, run, shared.h)
    selection_s = time.perf_counter() - start
    result, counts = write_rows(
        store,
        gallery,
        staging,
        plan,
        selection,
        shared=shared,
        images=images,
        run=run,
        verify=verify,
    )
    return {
        **result,
        **selection_summary(plan, selection, counts),
        "selection_seconds": selection_s,
        "selection_resumed": resumed,
    }


def selection_summary(plan: BackfillPlan, selection: Selection, counts: dict) -> dict:
    """The summary's rows (``extracted``, ``newly_extracted``, ``already_extracted``), the
    ``threshold`` and the options the selection was made with."""
    threshold = selection.threshold
    return {
        "extracted": plan.k,
        "newly_extracted": plan.k - counts["copied"],
        "already_extracted": counts["copied"],
        "threshold": None if threshold is None else dataclasses.asdict(threshold),
        "budget": plan.budget,
        "order": plan.order,
        "seed": plan.seed,
    }
