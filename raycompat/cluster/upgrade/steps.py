"""The stages of one upgrade that touch Ray or the store (the job's building blocks).

- :func:`train_candidate`: one model trained on Ray Train (the driver's ``two_model`` scenario
  against the gallery's model, or a single ``cores`` step for the initial model), copied to a
  local work directory as ``model.safetensors`` + ``model.json`` + ``test_features.npy``;
- :func:`train_fct`: triples of the candidate's training images, then ``h`` on Ray Train;
- :func:`rows_of`: the stored (or staged) vectors of given ids, for checks on what the service
  will actually search;
- :func:`publish_model`: model files into the store, then the catalog record (then a grant).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raycompat.config.train import OldModelSpec, RunSpec, ScenarioSpec, TrainConfig
from raycompat.config.upgrade import PartialBackfillSpec, UpgradeConfig, UpgradeSpec
from raycompat.errors import StoreError
from raycompat.store import GalleryStore
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.store.read.parquet import open_parquet
from raycompat.store.read.vectors import vectors
from raycompat.train.export import MODEL_FILE, SPEC_FILE, load_features, read_spec
from raycompat.upgrade.evaluate import Parent

log = logging.getLogger(__name__)


def parent_of(catalog: Catalog, model_version: str, work_dir: str) -> Parent:
    """The registered model's files, copied once into the work dir. A model registered
    without weights (adopted) is a ``NoWeightsError``: nothing can be trained against it."""
    directory = os.path.join(work_dir, "models", model_version)
    if not os.path.isfile(os.path.join(directory, MODEL_FILE)):
        purpose = "be scored or trained against by the upgrade job"
        catalog.fetch_model_files(model_version, directory, purpose)
    _, info = read_spec(directory)
    classes = max(int(c) for c in info["label_map"]) + 1
    return Parent(model_version, directory, classes)


def train_config(
    cfg: UpgradeConfig, spec: UpgradeSpec, method: str, run_name: str, parent: Parent | None
) -> TrainConfig:
    """The shared training config specialised to one model of the history."""
    base = cfg.training
    if parent is None:  # the initial model: one step on its classes
        scenario = ScenarioSpec(kind="cores", tasks=[spec.classes])
    else:
        old_spec, _ = read_spec(parent.directory)
        old = OldModelSpec(
            checkpoint=os.path.join(parent.directory, MODEL_FILE),
            model=old_spec,
            classes=parent.classes,
        )
        scenario = ScenarioSpec(
            kind="two_model",
            tasks=[parent.classes, spec.classes],
            old_model=old,
            model_selection=base.scenario.model_selection,  # CoReS eq. 10-12 when asked
        )
    return dataclasses.replace(
        base,
        method=method,
        first_method=method if parent is None else base.first_method,
        method_options=spec.method_options if method == spec.method else {},
        scenario=scenario,
        run=dataclasses.replace(base.run, name=run_name),
        epochs=spec.epochs if spec.epochs is not None else base.epochs,
    )


def trained_already(train_cfg: TrainConfig) -> bool:
    """Whether an earlier run already trained this candidate (``driver.trained_already``)."""
    from raycompat.cluster.train.driver import trained_already as finished

    return finished(train_cfg)


def train_candidate(train_cfg: TrainConfig, directory: str) -> str:
    """Train (or resume) the run and copy its last model into ``directory`` (returned)."""
    from raycompat.cluster.train.driver import run_training

    result = run_training(train_cfg)
    last = list(result.checkpoints)[-1]
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    result.checkpoints[last].to_directory(directory)
    shutil.rmtree(os.path.join(directory, "train_state"), ignore_errors=True)
    return directory


def test_features(directory: str) -> np.ndarray:
    return load_features(directory, "test")


def _matching_rows(opener, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(ids, vectors)`` of the rows of one part whose id is in ``wanted``, streamed one batch
    at a time (memory: a batch plus the matches); None if the part's ids are not integers.
    ``opener()`` opens the part as a ``pq.ParquetFile`` (a store's ``open_file`` for a published
    version, which also reads adopted files in store columns)."""
    value_set, found_ids, found = pa.array(wanted), [np.zeros(0, np.int64)], []
    with opener() as parquet:
        if not pa.types.is_integer(parquet.schema_arrow.field("id").type):
            return None
        width = parquet.schema_arrow.field("embedding").type.list_size
        found.append(np.zeros((0, width), np.float32))
        for batch in parquet.iter_batches(columns=["id", "embedding"]):
            batch = batch.filter(pc.is_in(batch.column("id"), value_set=value_set))
            found_ids.append(batch.column("id").to_numpy())
            found.append(vectors(batch, "embedding"))
    return np.concatenate(found_ids), np.concatenate(found)


def rows_of(fs, paths: list[str], ids: np.ndarray, source: str, openers=None) -> np.ndarray | None:
    """``(len(ids), d)`` vectors of ``ids`` from Parquet ``paths``, in ``ids`` order; None when
    some id is absent (the gallery does not hold those images). ``openers``: one per path
    (default: open the path on ``fs``).

    With Ray running, each part is scanned by a Ray task on the cluster and only the matching
    rows come back: the driver holds the requested rows, never a whole part or version.
    """
    wanted = np.asarray(ids, dtype=np.int64)
    openers = openers or [functools.partial(open_parquet, fs, path, path) for path in paths]
    import ray

    if ray.is_initialized() and len(paths) > 1:
        scan = ray.remote(_matching_rows)
        parts = ray.get([scan.remote(opener, wanted) for opener in openers])
    else:
        parts = [_matching_rows(opener, wanted) for opener in openers]
    if not parts or any(p is None for p in parts):
        return None
    got = np.concatenate([p[0] for p in parts])
    if len(got) != len(ids):
        log.info("%s holds %d of the %d test ids", source, len(got), len(ids))
        return None
    order = np.argsort(got)[np.searchsorted(got, ids, sorter=np.argsort(got))]
    return np.concatenate([p[1] for p in parts])[order]


def version_rows(store: GalleryStore, gallery: str, version: str, ids) -> np.ndarray | None:
    info = store.version(gallery, version)
    files = list(store.version_files(gallery, info))
    openers = [functools.partial(store.open_file, info, path, uri) for path, uri in files]
    paths = [path for path, _ in files]
    return rows_of(store.filesystem, paths, ids, store.uri(gallery, version), openers)


def publish_model(
    catalog: Catalog, record: ModelRecord, local_dir: str, grant: QueryGrant, query_map=None
) -> QueryGrant:
    """Files, then the model record, then its grant: each create-if-absent (reruns no-op).
    ``query_map`` (a fitted ``Fit``): stored beside the version, and named by the grant
    (``adapted``, with ``grant.evidence`` added)."""
    from raycompat.serving.query_adapters import publish_adapter

    files = [
        MODEL_FILE,
        SPEC_FILE,
        *sorted(f for f in os.listdir(local_dir) if f[:2] in ("h.", "g.")),
    ]
    record.uri = catalog.put_model_files(record.model_version, local_dir, files)
    catalog.register_model(record)
    if query_map is not None:
        g = grant
        return publish_adapter(
            catalog.store, g.gallery, g.gallery_version, g.model_version, query_map, g.evidence
        )
    return catalog.grant(grant)


def fit_map(cfg: UpgradeConfig, spec: UpgradeSpec, store, gallery: str, current, candidate: str):
    """The ``spec.method`` map (procrustes, affine, adapter, slerp), fitted on a seeded sample
    of the stored version ``current``'s rows (``spec.map.budget()``: about ``pairs`` of them,
    or a share) (seed ``training.seed``), each
    paired with the candidate's embedding of the same gallery image, re-extracted on the
    workers (``raycompat.cluster.pipelines.pairs``): from the candidate's space into the stored
    gallery's for ``map.direction: query``, the reverse for ``gallery``. The linear kinds are
    fitted from statistics merged over the workers; the adapter and slerp (``ROW_FITTED_KINDS``)
    on the sampled pairs themselves, which their held-out split needs.
    Rows the job scores on are never sampled (:func:`held_out_rows`). Returns a
    ``raycompat.transformations.Fit``."""
    from raycompat.cluster.pipelines.pairs import sample_pair_statistics
    from raycompat.transformations import fit_kind, fit_statistics
    from raycompat.transformations.kinds import ROW_FITTED_KINDS

    on_rows = spec.method in ROW_FITTED_KINDS
    stats, x, y = sample_pair_statistics(
        store, gallery, current.version, cfg.gallery_images, candidate,
        **spec.map.budget(), seed=cfg.training.seed, direction=spec.map.direction,
        keep_rows=on_rows, exclude=held_out_rows(cfg), run=cfg.pipeline,
    )  # fmt: skip
    if on_rows:
        where = f"{spec.model_version}'s pairs"
        return fit_kind(spec.method, x, y, seed=cfg.training.seed, where=where)
    return fit_statistics(spec.method, stats, lam=spec.map.lam)


def held_out_rows(cfg: UpgradeConfig) -> np.ndarray | None:
    """The validation and test rows of the training data, when the gallery's images are that
    data (its ids are then the data's row numbers): the job scores on them, so a map's pairs
    never include them. None for a gallery of other images."""
    from raycompat.train.data import make_splits, open_dataset

    images, data = cfg.gallery_images, cfg.training.data
    if images.kind != "dataset" or (images.name, images.options) != (data.name, data.options):
        return None
    splits = make_splits(cfg.training, open_dataset(data).labels)
    return np.concatenate([splits.val, splits.test]).astype(np.int64)


def existing_grant(catalog: Catalog, gallery: str, model_version: str) -> QueryGrant | None:
    try:
        return catalog.queryable_version(gallery, model_version)
    except StoreError:
        return None


def gallery_before(versions: list, upgrades: list[UpgradeSpec], position: int):
    """The version the entry at ``position`` is judged against: the latest one published by a
    model that is not this entry or a later one in the history. On a rerun the later entries'
    versions exist already, and judging an entry against them would compare it with a gallery
    it never saw (and change its decision digest). Versions of models outside the history (an
    adopted production table) count as earlier. None: the entry starts the gallery."""
    later = {u.model_version for u in upgrades[position:]}
    earlier = [v for v in versions if v.model_version not in later]
    return earlier[-1] if earlier else None


def run_spec(cfg: UpgradeConfig, name: str) -> RunSpec:
    return dataclasses.replace(cfg.training.run, name=name)


def train_fct(
    cfg: UpgradeConfig,
    spec: UpgradeSpec,
    parent: Parent,
    candidate: str,
    source_normalized: bool,
    work_dir: str,
    backfill: PartialBackfillSpec | None = None,
    run_name: str | None = None,
) -> str:
    """Learn ``h: phi_parent -> phi_candidate`` on the candidate's training images (FCT
    sec. 3.3) and copy ``h.*`` into ``candidate``. The old side of the triples is normalised
    like the stored gallery, since ``h`` is applied to stored rows. ``backfill``: a partial
    backfill may follow, so ``h`` learns its uncertainty too (FastFill), with
    ``backfill.uncertainty_weight`` on the discriminative term. ``run_name``: the
    transformation run (default ``<name>-<model>-fct``)."""
    from raycompat.cluster.train.fct_fit import fit_transformation
    from raycompat.train.data import make_splits, open_dataset

    base = cfg.training
    dataset = open_dataset(base.data)
    splits = make_splits(base, dataset.labels)
    h_dir = fit_transformation(
        parent.directory,
        candidate,
        dataset,
        splits.train[dataset.labels[splits.train] < spec.classes],
        spec.fct,
        scaling=base.scaling,
        run=run_spec(cfg, run_name or f"{cfg.name}-{spec.model_version}-fct"),
        work_dir=os.path.join(work_dir, "fct", spec.model_version),
        seed=base.seed,
        normalize_old=source_normalized,
        uncertainty=backfill is not None,
        discriminative_weight=backfill.uncertainty_weight if backfill is not None else 0.0,
    )
    for name in os.listdir(h_dir):
        if name.startswith("h."):
            shutil.copy2(os.path.join(h_dir, name), os.path.join(candidate, name))
    return candidate
