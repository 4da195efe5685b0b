"""Search a gallery as a model: the query path that ``raycompat search`` and the Python API share.

One home for what a search does between "these are the queries" and "these are the hits":

- :func:`served_version`: the version a model searches on a gallery (its newest alias, else
  its catalog grant; ``store/aliases.py``), after checking both names exist.
- :func:`aliased_version`: the version and query model a named alias (``prod``) points at
  (``store/named_aliases.py``); search that version with that model's queries.
- :func:`query_vectors`: the ``(Q, d)`` queries, from a ``.npy``/Parquet file
  (:func:`read_query_vectors`), from rows stored in that version (:func:`stored_vectors`) or
  from images embedded with the model (:func:`embed_images`: an image of another size is
  resized, with a note; a model registered without weights cannot embed, ``NoWeightsError``).
- :func:`to_version_space`: a model whose grant is ``adapted`` (a training-free upgrade,
  ``store/query_adapters.py``) has its queries mapped into the version's space first, by the
  map :func:`query_adapter` builds to run beside faiss (``index/query_map.py``).
- :func:`search`: all of it in one call (the version ``model`` serves, its queries, the
  search), the entry point of the CLI, the Python API and the service; its answer names the
  version, the index that answered and what the scores are (cosine similarity or negative
  squared L2).
- :func:`search_gallery`: the top-k of each query in the version's published index (without a
  valid one, an exact in-memory search of a small version; ``index/version_index.py``), as
  gallery ids with their stored labels, and the notes a caller should show (why a query got
  fewer than ``k`` hits, why the search was exact).

A compatible model of another width is compared on the shared first coordinates
(:func:`to_width`: BCT's zero-padding, Shen et al. 2020, sec. 3.2), as in training. Everything
here reads the store and never writes it. No argparse and no Ray: a service that resolves
aliases itself calls :func:`search_gallery` with the version. torch, faiss and the alias log
load inside the functions that use them, so the CLI starts without them
(``tests/cli/test_startup.py``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raycompat.errors import StoreError, UsageError
from raycompat.index.distances import ZeroNormError
from raycompat.store import GalleryStore
from raycompat.store.lookup import check_gallery, model_record
from raycompat.store.model_catalog import Catalog

if TYPE_CHECKING:
    from raycompat.index.version_index import VersionIndex
    from raycompat.store.aliases import Serving


class QueryError(UsageError, ValueError):
    """What a search was asked is unusable: ``k`` below 1, or a query file that is unreadable,
    empty or malformed (the message names the file). Exit status 2."""


@dataclass(frozen=True)
class QueryHits:
    """One query's hits, best first, only items found (``n <= k``).

    Attributes:
        ids: ``(n,)`` gallery ids (str or int64, as the version stores them).
        scores: ``(n,)`` similarity scores, higher is better.
        labels: the stored ``label`` of each id; None where the version has no label.
    """

    ids: np.ndarray
    scores: np.ndarray
    labels: list[Any]


@dataclass(frozen=True)
class SearchResult:
    """The hits of each query on ``gallery``/``version``, in query order; ``notes``: one-line
    notes a caller shows to the user (an exact search without an index, short hit lists).

    Attributes:
        index: what answered: ``build <id>`` (the published index build) or ``exact`` (an
            in-memory search of the version's rows, no index published).
        metric: what the scores are: ``cosine similarity``, ``negative squared L2`` or
            ``inner product`` (the index's distance, ``index/distances.py``).
        model: the query model, None for a version searched with its own vectors.
    """

    gallery: str
    version: str
    hits: list[QueryHits]
    notes: list[str]
    index: str = "exact"
    metric: str = ""
    model: str | None = None


def check_k(k: int) -> None:
    """Raise :class:`QueryError` unless ``k >= 1`` (a caller may check before opening a store)."""
    if k < 1:
        raise QueryError(f"-k must be >= 1 (hits per query), got {k}")


def served_version(store: GalleryStore, gallery: str, model: str) -> Serving:
    """What ``model`` searches on ``gallery``: its newest alias, else its grant.

    Raises:
        NotInStoreError: no such gallery, or ``model`` is not registered (lists the names).
        StoreError: the model holds no grant there, was revoked there or was retired.
    """
    from raycompat.store.aliases import current

    check_gallery(store, gallery)
    model_record(Catalog(store), model)
    return current(store, gallery, model)


def aliased_version(store: GalleryStore, gallery: str, alias: str) -> Serving:
    """What the named alias ``alias`` of ``gallery`` points at: ``gallery_version`` searched
    with the queries of ``model_version`` (``source``: ``"alias prod (change 3)"``).

    Raises:
        NotInStoreError: no such gallery, or no such alias (lists the gallery's aliases).
        StoreError: the alias's model was retired, or revoked on the gallery.
    """
    from raycompat.store.aliases import Serving
    from raycompat.store.named_aliases import resolve

    check_gallery(store, gallery)
    record = resolve(store, gallery, alias)
    source = f"alias {alias} (change {record.seq})"
    return Serving(gallery, record.model_version, record.gallery_version, record.relation, source)


def query_vectors(
    store: GalleryStore,
    gallery: str,
    version: str,
    model: str | None,
    *,
    images: Sequence[str] | None = None,
    vectors: str | np.ndarray | None = None,
    ids: Sequence[str] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> np.ndarray:
    """``(Q, d)`` queries of ``model`` from exactly one source: ``vectors`` (an array, or a
    .npy file or Parquet ``embedding`` column; checked against the model's width, or the
    version's without a model), the rows ``ids`` stored in ``gallery``/``version``, or
    ``images`` embedded with the model (``on_note`` is told when an image is resized to the
    model's input size).

    Raises:
        QueryError: not exactly one source, images without a model, or malformed vectors (the
            row named).
        NoWeightsError: images, and the model was registered without weights (adopted).
    """
    given = vectors is not None if isinstance(vectors, np.ndarray) else bool(vectors)
    if sum((bool(images), given, bool(ids))) != 1:
        raise QueryError("query_vectors takes images, vectors or ids (one of them)")
    catalog = Catalog(store)
    if ids:
        return stored_vectors(store, gallery, version, list(ids))
    if given:
        if model is None:
            width = store.version(gallery, version).width
        else:
            width = catalog.model(model).embed_dim
        if isinstance(vectors, str):
            queries = read_query_vectors(vectors, width)
        else:
            queries = checked_vectors(vectors, width, "vectors")
        if model is None:
            return queries
    elif model is None:
        raise QueryError("query images need --model, the model that embeds them")
    else:
        queries = embed_as(store, model, list(images), on_note)
    return to_version_space(store, gallery, version, model, queries)


def embed_as(
    store: GalleryStore, model: str, images: list[str], on_note: Callable[[str], None] | None
) -> np.ndarray:
    """``(len(images), d)`` features of the image files with the store's ``model``
    (:func:`embed_images`; its files copied out first from an S3 store).

    Raises:
        NoWeightsError: the model was registered without weights (adopted).
    """
    catalog = Catalog(store)
    catalog.weights_of(model, "embed query images")
    uri = catalog.model_uri(model)  # a store-relative uri resolves against the store's root
    if Path(uri).is_dir():
        return embed_images(uri, images, on_note)
    with tempfile.TemporaryDirectory() as local:  # files in an S3 store: copy them out first
        return embed_images(catalog.fetch_model_files(model, local), images, on_note)


def to_version_space(
    store: GalleryStore, gallery: str, version: str, model: str, queries: np.ndarray
) -> np.ndarray:
    """``model``'s queries in ``version``'s space: mapped by the model's query adapter when its
    grant is ``adapted`` to that version (``store/query_adapters.py``: nothing in the gallery
    was rewritten), else as they are (a compatible model's are cut or padded by
    :func:`to_width` at search time)."""
    adapter = query_adapter(store, gallery, version, model)
    return queries if adapter is None else adapted(adapter, queries)


def query_adapter(store: GalleryStore, gallery: str, version: str, model: str):
    """The map ``model``'s queries go through to search ``version`` (its grant is ``adapted``
    to that version), loaded once and built to run beside faiss (:func:`search_map`); None
    when they are searched as they are."""
    from raycompat.index.query_map import search_map
    from raycompat.store.query_adapters import ADAPTED, load_adapter

    grant = Catalog(store).grant_of(gallery, model)  # none: --version searches regardless
    if grant is None or grant.relation != ADAPTED or grant.gallery_version != version:
        return None
    return search_map(load_adapter(store, grant))


def adapted(adapter, queries: np.ndarray) -> np.ndarray:
    """``(Q, d_version)``: ``queries`` mapped by a :func:`query_adapter` (its ``map_arrays``)."""
    return adapter.map_arrays(queries)


def embed_images(
    model_uri: str, paths: list[str], on_note: Callable[[str], None] | None = None
) -> np.ndarray:
    """``(len(paths), d)`` features of the images with the exported model at ``model_uri``,
    read as the model's backbone was built (channels and size), unnormalised. An image of
    another size is resized (bilinear), and ``on_note`` gets one line naming those resized."""
    import torch

    from raycompat.data.image_folder import read_image
    from raycompat.engine import embed
    from raycompat.train.export import load_exported_model

    model, _ = load_exported_model(model_uri)
    # Backbones record the input they were built for; others take RGB at the stored size.
    channels = getattr(model.backbone, "in_chans", 3)
    size = getattr(model.backbone, "image_size", None)
    hw = (size, size) if isinstance(size, int) else size
    if hw is not None and on_note is not None:
        note = _resized_note(paths, tuple(hw))
        if note:
            on_note(note)
    images = torch.stack(
        [read_image(p, mode="L" if channels == 1 else "RGB", size=hw) for p in paths]
    )
    return embed(model.forward_features, images, normalize=False).numpy()


def _resized_note(paths: list[str], hw: tuple[int, int]) -> str | None:
    """One line naming the images whose stored size is not ``hw`` (H, W), or None. Only the
    headers are read."""
    from PIL import Image

    other = []
    for path in paths:
        try:
            with Image.open(path) as image:
                w, h = image.size
        except OSError:
            continue  # read_image names an unreadable file
        if (h, w) != tuple(hw):
            other.append(f"{path} ({h} x {w})")
    if not other:
        return None
    return (
        f"resized {len(other)} of {len(paths)} query image(s) to {hw[0]} x {hw[1]} (H x W), "
        f"the model's input size: {', '.join(other)}"
    )


def read_query_vectors(path: str, width: int) -> np.ndarray:
    """A ``(Q, width)`` float32 array, ``Q >= 1``, from ``.npy`` or a Parquet ``embedding`` column.

    Raises:
        QueryError: the file is unreadable, or :func:`query_problem` finds it malformed; the
            message starts with ``path``.
    """
    try:
        if path.endswith(".npy"):
            x = np.load(path, allow_pickle=False)
        else:
            import pyarrow.parquet as pq

            from raycompat.store.vectors import vectors

            x = vectors(pq.read_table(path, columns=["embedding"]), "embedding")
    except (OSError, KeyError, ValueError, EOFError, AttributeError, TypeError) as error:
        npy = path.endswith(".npy")
        what = "not a readable .npy array" if npy else "no readable fixed-size list 'embedding'"
        raise QueryError(f"{path}: {what} ({error})") from None
    return checked_vectors(x, width, path, f" for model width {width}")


def checked_vectors(x: np.ndarray, width: int, where: str, why: str = "") -> np.ndarray:
    """``x`` as float32 ``(Q, width)`` queries; else a ``QueryError`` that starts with
    ``where`` and says what :func:`query_problem` found (the row named); ``why`` follows the
    expected shape."""
    problem = query_problem(x, width)
    if problem:
        raise QueryError(
            f"{where}: expected finite vectors of shape (Q, {width}){why}, got {problem}"
        )
    return x.astype(np.float32, copy=False)  # nothing downstream writes into the queries


def query_problem(x: np.ndarray, width: int) -> str | None:
    """What makes ``x`` unusable as ``(Q >= 1, width)`` finite query vectors, or None."""
    if x.dtype.kind not in "fiu":
        return f"values of type {x.dtype}"
    if x.ndim >= 1 and x.shape[0] == 0:
        return f"no rows (shape {x.shape})"
    if x.ndim != 2 or x.shape[1] != width:
        return f"shape {x.shape}"
    if not np.isfinite(x).all():  # the row only once one is at fault
        return f"NaN or inf in row {int(np.argmin(np.isfinite(x).all(axis=1)))}"
    return None


def stored_rows(store: GalleryStore, gallery: str, version: str, ids: list, columns: list):
    """``(id -> row, table)`` of the rows of ``ids`` in the version (one streamed scan; only
    the matches are kept)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    found, want = [], None
    for batch in store.iter_batches(gallery, version, columns=["id", *columns]):
        want = want if want is not None else pa.array(ids).cast(batch.schema.field("id").type)
        found.append(batch.filter(pc.is_in(batch.column("id"), value_set=want)))
    table = pa.Table.from_batches(found) if found else pa.table({})
    return {i: k for k, i in enumerate(table.column("id").to_pylist())}, table


def stored_vectors(store: GalleryStore, gallery: str, version: str, ids: list[str]) -> np.ndarray:
    """``(Q, d)`` stored embeddings of ``ids`` in query order (given as text; int64 ids are
    parsed).

    Raises:
        StoreError: an id is not an int of an int64-id version, or no row holds it.
    """
    import pyarrow as pa

    first = next(store.iter_batches(gallery, version, batch_size=1, columns=["id"]))
    ids = typed_ids(ids, pa.types.is_int64(first.schema.field("id").type), f"{gallery}/{version}")
    found, missing = embeddings_of(store, gallery, version, ids)
    if missing:
        raise no_rows(f"{gallery}/{version}", missing)
    return found


def typed_ids(ids: list[str], int64: bool, where: str) -> list:
    """``ids`` given as text, parsed as ints where the version ``where`` has int64 ids."""
    if not int64:
        return ids
    try:
        return [int(i) for i in ids]
    except ValueError:
        raise StoreError(f"{where} has int64 ids; got {ids}") from None


def no_rows(where: str, missing: list) -> StoreError:
    return StoreError(f"{where} holds no row with id(s) {missing}")


def embeddings_of(
    store: GalleryStore, gallery: str, version: str, ids: list, rows_of: Callable | None = None
) -> tuple[np.ndarray | None, list]:
    """``(embeddings (len(ids), d) in ``ids`` order, [])`` of the rows holding ``ids`` (ids of
    the version's id type), or ``(None, the ids no row holds)``. ``rows_of`` finds them, as
    :func:`stored_rows` (the default: one streamed scan in this process) or the Ray layer's
    ``stored_matches`` (tasks over the version's chunks)."""
    from raycompat.store.vectors import vectors  # the core's: pipelines would import Ray

    where, table = (rows_of or stored_rows)(store, gallery, version, ids, ["embedding"])
    missing = [i for i in ids if i not in where]
    if missing:
        return None, missing
    return vectors(table, "embedding")[[where[i] for i in ids]], []


def column_names(store: GalleryStore, gallery: str, version: str) -> list[str]:
    """The version's columns, from its first file's footer (no row is decoded)."""
    info = store.version(gallery, version)
    path, source = next(iter(store.version_files(gallery, info)))
    with store.open_file(info, path, source) as parquet:
        return parquet.schema_arrow.names


def labels_of(
    store: GalleryStore,
    gallery: str,
    version: str,
    ids: list[np.ndarray],
    labelled: bool | None = None,
) -> list:
    """Stored ``label`` of each id, per query (``ids``: one array per query; None where
    unlabelled). ``labelled``: whether the version has a ``label`` column, when the caller
    knows it already (None: read from its first file's footer)."""
    wanted = sorted({i for row in ids for i in row.tolist()})
    if labelled is None:
        labelled = bool(wanted) and "label" in column_names(store, gallery, version)
    if not wanted or not labelled:
        return [[None] * len(row) for row in ids]
    where, table = stored_rows(store, gallery, version, wanted, ["label"])
    labels = table.column("label").to_pylist()
    return [[labels[where[i]] if i in where else None for i in row.tolist()] for row in ids]


def to_width(queries: np.ndarray, width: int) -> np.ndarray:
    """``(Q, width)`` contiguous float32 queries: a wider model's cut to the gallery's first
    ``width`` coordinates, a narrower one's zero-padded (BCT sec. 3.2: a compatible model shares
    the old model's first coordinates)."""
    shared = queries[:, :width]
    if shared.shape[1] < width:
        shared = np.pad(shared, ((0, 0), (0, width - shared.shape[1])))
    return np.ascontiguousarray(shared, dtype=np.float32)


def search(
    store: GalleryStore,
    gallery: str,
    model: str | None,
    *,
    vectors: np.ndarray | str | None = None,
    ids: Sequence[str] | None = None,
    images: Sequence[str] | None = None,
    k: int = 5,
    version: str | None = None,
    nprobe: int | None = None,
    names: Sequence[Any] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> SearchResult:
    """Search ``gallery`` as ``model``: the one query path of the CLI, the Python API and the
    service. The answer names the version searched, the index that answered and what its
    scores are (:class:`SearchResult`).

    Args:
        model: the query model; it serves the version searched unless ``version`` is given
            (then it may be None with ``vectors`` or ``ids``).
        vectors: ``(Q, d)`` queries of ``model`` (an array, or a ``.npy``/Parquet file);
            exactly one of ``vectors``, ``ids`` (rows stored in the version) and ``images``.
        k, nprobe, names, on_note: as :func:`search_gallery`.
    Raises:
        QueryError: not exactly one source, ``k < 1``, or malformed vectors (the row named).
        NotInStoreError, StoreError: as :func:`served_version`.
    """
    check_k(k)
    if version is None:
        if model is None:
            raise QueryError("search needs the query model or the gallery version")
        version = served_version(store, gallery, model).gallery_version
    queries = query_vectors(
        store, gallery, version, model, images=images, vectors=vectors, ids=ids, on_note=on_note
    )
    if names is None and isinstance(vectors, str):
        names = [f"{vectors}[{q}]" for q in range(len(queries))]
    return search_gallery(
        store, gallery, queries, k, model=model, version=version, nprobe=nprobe, names=names,
        on_note=on_note,
    )  # fmt: skip


def search_gallery(
    store: GalleryStore,
    gallery: str,
    queries: np.ndarray,
    k: int,
    *,
    model: str | None = None,
    version: str | None = None,
    nprobe: int | None = None,
    names: Sequence[Any] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> SearchResult:
    """The top-``k`` hits of each of ``queries (Q, d)`` in ``gallery``, read-only.

    Args:
        model: the query model; without ``version``, the version it serves is searched
            (:func:`served_version`). It also names the model in errors.
        version: the gallery version to search (a service that resolved an alias gives it).
        nprobe: inverted lists an IVF index visits per query; ignored by an exact index.
        names: what to call each query in errors (default its row number).
        on_note: called with each note as it arises, so a caller that prints them shows the
            first even when the search then fails; every note is also in the result.
    Raises:
        QueryError: ``k < 1``, queries not ``(Q, d)``, or neither ``model`` nor ``version``.
        ZeroNormError: a zero query on a cosine version (the message names the query).
        IndexNeededError: no valid index, and the version is too large to search exactly.
    """
    from raycompat.index.version_index import open_search_index

    check_k(k)
    if np.ndim(queries) != 2:
        raise QueryError(f"queries: expected shape (Q, d), got {np.shape(queries)}")
    if version is None:
        if model is None:
            raise QueryError("search_gallery needs the query model or the gallery version")
        version = served_version(store, gallery, model).gallery_version
    notes: list[str] = []

    def note(line: str) -> None:
        notes.append(line)
        if on_note is not None:
            on_note(line)

    index, exact = open_search_index(store, gallery, version)
    if exact:
        note(exact)
    names = list(range(len(queries))) if names is None else list(names)
    hits, short = ranked_hits(index, queries, k, nprobe, names, model)
    if short:
        note(short)
    labels = labels_of(store, gallery, version, [ids for _, ids in hits])
    found = [QueryHits(i, s, lrow) for (s, i), lrow in zip(hits, labels, strict=True)]
    metric = index.index.distance.score_label
    return SearchResult(gallery, version, found, notes, index.source, metric, model)


def ranked_hits(
    index: VersionIndex,
    queries: np.ndarray,
    k: int,
    nprobe: int | None = None,
    names: list | None = None,
    model: str | None = None,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], str | None]:
    """``index.hits`` of the queries at the index's width, and a note when a query got fewer
    than ``k`` (else None): the one ranking every search does, from the CLI's to the
    service's (``raycompat/service/``), which keeps its indexes loaded. ``names``: what to
    call each query in a zero-vector error (default its row number)."""
    names = list(range(len(queries))) if names is None else names
    # nprobe tunes IVF indexes (large versions); an exact flat index has nothing to tune
    nprobe = nprobe if index.index.is_ivf else None
    try:
        hits = index.hits(to_width(queries, index.info.width), k, nprobe=nprobe)
    except ZeroNormError as err:
        bad = ", ".join(str(names[row]) for row in err.rows)
        who = f" for model {model}" if model is not None else ""
        raise ZeroNormError(
            f"query {bad} is a zero vector{who}: cosine search cannot rank the gallery for it",
            err.rows,
        ) from None
    short = [len(ids) for _, ids in hits if len(ids) < k]
    return hits, _short_note(index, k, nprobe, short, len(hits)) if short else None


def _short_note(
    index: VersionIndex, k: int, nprobe: int | None, short: list[int], queries: int
) -> str:
    """Why ``short`` (hit counts below k) of ``queries`` queries got fewer than ``k`` hits."""
    rows, version = index.index.ntotal, index.info.version
    if rows < k:
        why = f"version {version} holds {rows} rows"
    else:
        lists = nprobe or index.index.index.nprobe
        why = f"the {lists} inverted list(s) visited per query hold fewer; raise --nprobe"
    fewest = min(short)
    return f"{len(short)} of {queries} queries got fewer than -k {k} hits (fewest {fewest}): {why}"
