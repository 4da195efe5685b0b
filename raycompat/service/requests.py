"""``POST /v1/search`` bodies, checked before anything reaches faiss.

``{"gallery": G, "model": M, "vectors": [[...], ...] | "ids": [...], "k": K}``, or ``"alias": A``
(a named alias of G, ``prod``) in place of the model, or beside it (then the alias must point
at that model: vectors embedded by one model are not searched as another's). Every problem
is a :class:`BadRequest` (400) naming the field, and the row where a row is at fault; a body
over the size limit is :class:`BodyTooLarge` (413). The vectors' width and finiteness are
checked against the model once its snapshot is taken (:func:`check_vectors`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from raycompat.errors import UsageError
from raycompat.service.routes import Route
from raycompat.serving.query_inputs import query_problem

FIELDS = ("gallery", "model", "alias", "vectors", "ids", "k")
DEFAULT_K = 10


class BadRequest(UsageError, ValueError):
    """A request the service refuses as it stands (HTTP 400); the message names the field."""


class AliasMovedError(UsageError, ValueError):
    """A search asked a named alias and a model, and the alias points at another model now
    (HTTP 409): the caller's vectors are another model's, so they are not searched."""


class BodyTooLarge(UsageError, ValueError):
    """A request body over the service's ``max_body_bytes`` (HTTP 413)."""


@dataclass(frozen=True)
class SearchRequest:
    """One search of ``model`` or ``alias`` (or both): ``vectors`` ``(Q, d)`` float32 or
    ``ids`` (stored rows), never both."""

    gallery: str
    model: str | None
    k: int
    vectors: np.ndarray | None
    ids: list | None
    alias: str | None = None

    def route(self) -> Route:
        if self.alias is not None:
            return Route(self.gallery, self.alias, "alias")
        return Route(self.gallery, self.model)


def parse_search(body: bytes, max_k: int, max_batch: int) -> SearchRequest:
    """The request ``body`` asks, checked (see the module docstring)."""
    try:
        data = json.loads(body)
    except ValueError as error:
        raise BadRequest(f"body: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise BadRequest(f"body: expected a JSON object with fields {', '.join(FIELDS)}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise BadRequest(f"body: unknown field(s) {', '.join(unknown)}; fields are {FIELDS}")
    if "model" not in data and "alias" not in data:
        raise BadRequest("body: give model (or alias, a named alias of the gallery)")
    for name in ("gallery", "model", "alias"):
        if (name == "gallery" or name in data) and not _name(data.get(name)):
            raise BadRequest(f"{name}: expected a name (a non-empty string)")
    k = data.get("k", DEFAULT_K)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= max_k:
        raise BadRequest(f"k: expected an integer from 1 to {max_k}, got {k!r}")
    if ("vectors" in data) == ("ids" in data):
        raise BadRequest("body: give vectors or ids (one of them)")
    rows = data.get("vectors", data.get("ids"))
    what = "vectors" if "vectors" in data else "ids"
    if not isinstance(rows, list) or not 1 <= len(rows) <= max_batch:
        raise BadRequest(f"{what}: expected a list of 1 to {max_batch} rows")
    vectors, ids = (None, _ids(rows)) if what == "ids" else (_vectors(rows), None)
    return SearchRequest(data["gallery"], data.get("model"), k, vectors, ids, data.get("alias"))


def _name(value) -> bool:
    return isinstance(value, str) and bool(value)


def _ids(rows: list) -> list:
    for row, value in enumerate(rows):
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise BadRequest(f"ids[{row}]: expected a string or an integer, got {value!r}")
    return [str(value) for value in rows]


def _vectors(rows: list) -> np.ndarray:
    if not isinstance(rows[0], list):
        raise BadRequest("vectors[0]: expected a list of numbers (vectors is a list of rows)")
    width = len(rows[0])
    for row, values in enumerate(rows):
        if not isinstance(values, list) or len(values) != width:
            raise BadRequest(f"vectors[{row}]: expected a list of {width} numbers (row 0's)")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise BadRequest(f"vectors[{row}]: expected numbers only")
    with np.errstate(over="ignore"):  # beyond float32: inf, refused by check_vectors
        return np.asarray(rows, dtype=np.float32)


def check_alias_model(alias: str | None, model: str | None, loaded) -> None:
    """Raise :class:`AliasMovedError` when a search through ``alias`` asked for ``model``'s
    vectors and the alias points at another model now (``loaded``: its snapshot)."""
    if alias is not None and model not in (None, loaded.model):
        raise AliasMovedError(
            f"model: alias {alias} of gallery {loaded.gallery} points at version "
            f"{loaded.version} searched by model {loaded.model} now, not model {model}"
        )


def check_vectors(vectors: np.ndarray, width: int, model: str) -> None:
    """Raise :class:`BadRequest` unless ``vectors`` are finite rows of ``model``'s width."""
    problem = query_problem(vectors, width)
    if problem:
        raise BadRequest(
            f"vectors: expected finite rows of model {model}'s width {width}, got {problem}"
        )
