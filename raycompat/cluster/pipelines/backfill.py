"""Partial backfill (FastFill, Jaeckle et al., ICLR 2023) of a stored gallery: one new version.

    partial_backfill_version(store, "faces", "v1", VersionInfo("v3", "m3", 512, True, "-"),
                             "runs/fct_m3", "runs/m3/model", SourceSpec(...), budget=0.3)

Every row of the new version is ``h(old)`` (FCT's transformation, ``provenance="transformed"``)
except ``k = round(budget * N)`` rows, chosen most uncertain first (``order="uncertainty"``: h's
predicted ``sigma``, largest first) or in a seeded random order, which are re-extracted from
their source images by the new model (``provenance="extracted"``). ``uncertainty`` holds h's
``sigma`` of every row when h has the head.

Two passes over the source version's chunks, both resumable:

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
import posixpath
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from raycompat.backfill import check_budget
from raycompat.cluster.pipelines.extract import PREFETCH_BATCHES, embed
from raycompat.cluster.pipelines.inputs import (
    file_digest,
    iter_chunk_batches,
    plan_version_chunks,
    vectors,
)
from raycompat.cluster.pipelines.parts import Chunk, PartWriter
from raycompat.cluster.pipelines.prefetch import prefetch
from raycompat.cluster.pipelines.resume import record_plan
from raycompat.cluster.pipelines.runner import ChunkWorker, RunOptions, run_staged
from raycompat.cluster.pipelines.selection import (
    ORDERS,
    SELECTION_FILE,
    Selection,
    key_path,
    read_keys,
    select_rows,
    stored_selection,
)
from raycompat.cluster.pipelines.sources import SourceSpec, open_source
from raycompat.cluster.pipelines.transform import check_transformation
from raycompat.config import ConfigError
from raycompat.fct.models import (
    H,
    load_transformation,
    read_transformation_spec,
    weights_path,
)
from raycompat.store import GalleryStore, SchemaError, Staging, StoreError, VersionInfo
from raycompat.store.commit_checks import RECORD_READERS
from raycompat.store.part_record import IdFingerprint, PartRecord, part_record_path
from raycompat.store.schema import ID_TYPES, PROVENANCE_FIELD, UNCERTAINTY_FIELD, embedding_schema
from raycompat.train.export import MODEL_FILE, build_model, load_exported_model, read_spec

logger = logging.getLogger(__name__)
BACKFILL_COLUMNS = ("provenance", "uncertainty")


class BackfillChunks(ChunkWorker):
    """Actor: loads ``h``, the new model and the image source once, then writes chunk after
    chunk: ``h(old)`` (or the stored rows of a partial source), selected rows re-extracted."""

    def __init__(
        self,
        *,
        source: VersionInfo,
        transformation: str | None,
        model: str,
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
        self.h = load_transformation(transformation, H).to(self.device) if transformation else None
        self.model = load_exported_model(model)[0].to(self.device)
        self.images, self.images_name = open_source(images), f"{images.kind} {images.name!r}"

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
            images = self.load_images(rows, source) if rows.size else None
            yield batch, chosen, extract, key, images
            offset += n

    def load_images(self, rows: np.ndarray, source: str) -> torch.Tensor:
        try:
            return self.images.dataset.batch(rows)
        except IndexError as error:
            raise SchemaError(
                f"{source}: ids are row numbers of the image source {self.images_name}, but {error}"
            ) from None

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
                if self.h.uncertainty_head is not None:
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


def _budget_too_low(budget: float, k: int, source: VersionInfo, extracted: int) -> ConfigError:
    return ConfigError(
        f"budget {budget!r} is {k} of {source.rows} rows, but source {source.version} holds "
        f"{extracted} extracted rows already; a partial backfill never turns them back into "
        f"h(old): use a budget >= {extracted / source.rows:.6g}"
    )


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


def _check_inputs(
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
        with_uncertainty = "uncertainty" in carried
    else:
        if not transformation:
            raise ConfigError(
                f"source {source.version} holds old-model rows: a partial backfill needs the "
                f"transformation h (a directory holding h.safetensors + h.json)"
            )
        check_transformation(source, target, transformation, None)
        with_uncertainty = bool(read_transformation_spec(transformation, H)["uncertainty"])
        if order == "uncertainty" and not with_uncertainty:
            raise ConfigError(
                f"order='uncertainty' needs h with an uncertainty head, but "
                f"{Path(transformation) / 'h.json'} has none (uncertainty: false); export h "
                f"fitted with fit_uncertain_transformation, or use order='random'"
            )
    spec, _ = read_spec(model)
    with torch.device("meta"):
        width = build_model(spec).embed_dim
    if width != target.width:
        raise SchemaError(
            f"{model} embeds {width}-d features but target {target.version} "
            f"declares width {target.width}"
        )
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
    ``target.lineage`` is replaced by :func:`partial_backfill_lineage` (it records the budget
    and the order, which ``VersionInfo`` has no field for).
    Returns:
        the writer's progress summary (rows, rows/s, seconds) plus ``version`` (the published
        record), ``extracted`` (= k), ``newly_extracted``, ``already_extracted``,
        ``threshold`` (``{"key", "id"}`` of the k-th row, or None when k is 0 or N),
        ``budget``, ``order``, ``seed``, ``selection_seconds`` and ``selection_resumed``.
    """
    budget = check_budget(budget)
    if order not in ORDERS:
        raise ConfigError(f"order must be one of {list(ORDERS)}, got {order!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an int >= 0, got {seed!r}")
    run = options or RunOptions()
    source = store.version(gallery, source_version)  # ManifestError if absent
    chunks, id_type, carried_fields = plan_version_chunks(store, gallery, source, run.rows_per_file)
    carried = [f.name for f in carried_fields]
    partial = "provenance" in carried
    if partial and transformation:
        logger.info("%s/%s is a partial backfill: h is not applied again", gallery, source_version)
    h_dir = None if partial else transformation
    with_uncertainty = _check_inputs(source, target, carried, h_dir, model, images, id_type, order)
    rows = source.rows
    k = int(np.rint(budget * rows))
    stored = extracted_in_version(store, gallery, source) if partial else 0
    if stored is not None and stored > k:  # known before any work for this pipeline's versions
        raise _budget_too_low(budget, k, source, stored)
    lineage = partial_backfill_lineage(
        target.version, source.version, h_dir, target.model_version, budget, order, seed
    )
    target = dataclasses.replace(target, lineage=lineage)
    kept = [f for f in carried_fields if f.name not in BACKFILL_COLUMNS]
    schema = embedding_schema(target.width, id_type, dtype=target.dtype)
    schema = pa.schema(
        list(schema) + kept + [PROVENANCE_FIELD] + ([UNCERTAINTY_FIELD] if with_uncertainty else [])
    )
    staging = store.begin(gallery, target, staging_name or f"partial-backfill-{source_version}")
    identity = {
        "kind": "partial_backfill",
        "source": f"{gallery}/{source.version}@{source.created}",
        "h": file_digest(weights_path(h_dir, H)) if h_dir else None,
        "model": file_digest(Path(model) / MODEL_FILE),
        "images": repr(images),
        "budget": budget,
        "order": order,
        "seed": seed if order == "random" else None,
        "rows_per_file": run.rows_per_file,
    }
    start, refused = time.perf_counter(), None
    try:
        record_plan(staging, identity, chunks)
        selection = stored_selection(staging)
        resumed = selection is not None
        if selection is None:
            # k == 0 of a partial source whose counts are unknown: pass A checks it holds none
            if k < rows and (k > 0 or stored is None):
                key_kwargs = dict(
                    source=source, transformation=h_dir, order=order, seed=seed, partial=partial
                )
                selection = select_rows(
                    store, gallery, staging, chunks, k, key_kwargs, run, ID_TYPES[id_type]
                )
            else:
                selection = Selection(rows, k)
            if selection.already_extracted > k:
                refused = _budget_too_low(budget, k, source, selection.already_extracted)
            else:
                staging.write_meta(SELECTION_FILE, selection.to_json())
    except BaseException:
        staging.release()
        raise
    if refused is not None:
        staging.abort()  # its plan names the refused budget; a corrected rerun starts afresh
        raise refused
    selection_s = time.perf_counter() - start
    logger.info(
        "%s/%s: %d of %d rows to extract (%d extracted in the source), threshold %s",
        gallery,
        target.version,
        k,
        rows,
        selection.already_extracted,
        selection.threshold,
    )

    counts = {}

    def checked(staged: Staging) -> None:
        counts.update(staged_counts(staged, chunks))
        if counts["extracted"] != k:
            raise StoreError(
                f"{staged.uri}: staged {counts['extracted']} extracted rows, expected {k}"
            )
        if verify is not None:
            verify(staged)

    result = run_staged(
        store,
        gallery,
        staging,
        name=f"partial backfill {gallery}/{source_version} -> {target.version}",
        identity=identity,
        chunks=chunks,
        worker=BackfillChunks,
        worker_kwargs=dict(
            source=source,
            transformation=h_dir and str(h_dir),
            model=str(model),
            images=images,
            selection=selection,
            order=order,
            carried=[f.name for f in kept],
            with_uncertainty=with_uncertainty,
        ),
        schema=schema,
        run=run,
        verify=checked,
        # each part maps its input chunk's rows 1:1, as the transform's do: O(parts)
        check="records" if source.ids else "rows",
        expected_ids=IdFingerprint.from_dict(source.ids) if source.ids else None,
    )
    threshold = selection.threshold
    return {
        **result,
        "extracted": k,
        "newly_extracted": k - counts["copied"],
        "already_extracted": counts["copied"],
        "threshold": None if threshold is None else dataclasses.asdict(threshold),
        "budget": budget,
        "order": order,
        "seed": seed,
        "selection_seconds": selection_s,
        "selection_resumed": resumed,
    }
