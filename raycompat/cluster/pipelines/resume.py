"""Resumability: a per-chunk commit log kept in the staging prefix itself.

The log is the set of part records. Each chunk has a deterministic part name; its files have
writer-unique names and appear atomically (``PartWriter``) after their record, so "a record of
the part holds the chunk's row count and its file is present with the recorded byte size" means
"chunk done". A rerun with the same staging name (a new lease generation) adopts those parts
onto its own list, by their records, instead of writing over them, and redoes the rest; nothing
is ever appended to or replaced, so a kill at any moment loses at most the chunks in flight.

Deterministic names are only safe if the rerun plans the *same* chunks, so the first run writes
``_plan.json`` (ignored by the store's listings: it starts with ``_``) holding the job's
identity (source, models, ``rows_per_file``...) and the chunk list; a rerun whose plan differs
is refused instead of mixing two chunkings (which would duplicate or lose rows).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

import pyarrow.fs as pafs

from raycompat.cluster.pipelines.parts import Chunk
from raycompat.store import Staging, StoreError
from raycompat.store.read.status import PLAN_FILE  # raycompat status reads the plan too

logger = logging.getLogger(__name__)


class PlanMismatchError(StoreError):
    """The staging prefix holds parts of a different plan (other source, model or sizing)."""


def record_plan(staging: Staging, identity: dict, chunks: list[Chunk]) -> None:
    """Write the plan on the first run; on a rerun check it equals the stored one."""
    fs, path = staging.filesystem, staging.meta_path(PLAN_FILE)
    plan = {"identity": identity, "chunks": [asdict(c) for c in chunks]}
    data = json.dumps(plan, sort_keys=True).encode()
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_stream(path) as handle:
            raw = handle.read()
        try:
            stored = json.loads(raw)
            stored["identity"], stored["chunks"]  # noqa: B018 - the keys a plan must have
        except (ValueError, KeyError, TypeError) as error:
            raise PlanMismatchError(
                f"{staging.uri_of(path)}: unreadable plan ({error}); abort this staging "
                f"area (or delete the file) to plan the job again"
            ) from None
        if stored != json.loads(data):
            diff = {
                k: (stored["identity"].get(k), v)
                for k, v in identity.items()
                if stored["identity"].get(k) != v
            }
            raise PlanMismatchError(
                f"{staging.uri}: holds a run with another plan (identity changes {diff or 'none'}"
                f"; chunks {len(stored['chunks'])} vs {len(chunks)}). Use another staging name, "
                f"or abort that staging prefix to start over"
            )
        return
    staging.write_meta(PLAN_FILE, data)


def pending_chunks(staging: Staging, chunks: list[Chunk]) -> list[Chunk]:
    """The chunks without a complete part. ``GalleryStore.begin`` adopted the complete parts of
    earlier writers onto this writer's list (by their records); those are skipped, and a part
    whose row count is not its chunk's is taken off the list and redone."""
    adopted = {record.part: record for record in staging.parts()}
    unplanned = sorted(set(adopted) - {c.part for c in chunks})
    if unplanned:
        raise PlanMismatchError(f"{staging.uri}: parts not in the plan: {unplanned[:5]}")
    todo = []
    for chunk in chunks:
        record = adopted.get(chunk.part)
        if record is not None and record.rows == chunk.rows:
            continue
        if record is not None:
            logger.warning(
                "%s/%s holds %d rows, the chunk %d: redoing it",
                staging.uri,
                record.file,
                record.rows,
                chunk.rows,
            )
            staging.drop_part(chunk.part)
        todo.append(chunk)
    logger.info(
        "%s: %d of %d chunks done, %d to do",
        staging.uri,
        len(chunks) - len(todo),
        len(chunks),
        len(todo),
    )
    return todo
