"""``POST /v1/search`` bodies, checked before anything reaches faiss.

``{"gallery": G, "model": M, "vectors": [[...], ...] | "ids": [...], "k": K}``. Every problem
is a :class:`BadRequest` (400) naming the field, and the row where a row is at fault; a body
over the size limit is :class:`BodyTooLarge` (413). The vectors' width and finiteness are
checked against the model once its snapshot is taken (:func:`check_vectors`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from raycompat.errors import UsageError
from raycompat.index.query import query_problem

FIELDS = ("gallery", "model", "vectors", "ids", "k")
DEFAULT_K = 10


class BadRequest(UsageError, ValueError):
    """A request the service refuses as it stands (HTTP 400); the message names the field."""


class BodyTooLarge(UsageError, ValueError):
    """A request body over the service's ``max_body_bytes`` (HTTP 413)."""


@dataclass(frozen=True)
class SearchRequest:
    """One search: ``vectors`` ``(Q, d)`` float32 or ``ids`` (stored rows), never both."""

    gallery: str
    model: str
    k: int
    vectors: np.ndarray | None
    ids: list | None


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
    for name in ("gallery", "model"):
        if not isinstance(data.get(name), str) or not data[name]:
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
    if what == "ids":
        return SearchRequest(data["gallery"], data["model"], k, None, _ids(rows))
    return SearchRequest(data["gallery"], data["model"], k, _vectors(rows), None)


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


def check_vectors(vectors: np.ndarray, width: int, model: str) -> None:
    """Raise :class:`BadRequest` unless ``vectors`` are finite rows of ``model``'s width."""
    problem = query_problem(vectors, width)
    if problem:
        raise BadRequest(
            f"vectors: expected finite rows of model {model}'s width {width}, got {problem}"
        )
