"""A search's queries, checked: ``(Q, d)`` finite float32 vectors of the query model.

- :func:`query_vectors`: the queries from exactly one source: a ``.npy``/Parquet file
  (:func:`read_query_vectors`), an array, rows stored in the version
  (``stored_rows.stored_vectors``) or images embedded with the model
  (``query_images.embed_as``), then in the version's space (``version_space.py``: a model
  whose grant is ``adapted`` has its queries mapped first).
- :func:`query_problem`: what makes an array unusable as queries (the row named), the one
  check of the CLI, the Python API and the service's request bodies.

Reads the store and never writes it; torch loads only when images are embedded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from raycompat.errors import UsageError
from raycompat.serving.query_images import embed_as
from raycompat.serving.stored_rows import stored_vectors
from raycompat.serving.version_space import to_version_space
from raycompat.store import GalleryStore
from raycompat.store.catalog.models import Catalog


class QueryError(UsageError, ValueError):
    """What a search was asked is unusable: ``k`` below 1, or a query file that is unreadable,
    empty or malformed (the message names the file). Exit status 2."""


def check_k(k: int) -> None:
    """Raise :class:`QueryError` unless ``k >= 1`` (a caller may check before opening a store)."""
    if k < 1:
        raise QueryError(f"-k must be >= 1 (hits per query), got {k}")


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
    if ids:
        return stored_vectors(store, gallery, version, list(ids))
    if given:
        if model is None:
            width = store.version(gallery, version).width
        else:
            width = Catalog(store).model(model).embed_dim
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

            from raycompat.store.read.vectors import vectors

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
