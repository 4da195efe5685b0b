"""A query-side map run by the engine that runs the search.

A model whose grant is ``adapted`` (``serving/query_adapters.py``) has each query mapped into the
version's space before faiss searches it. :func:`search_map` turns the stored transformation
into what the search calls (``map_arrays(queries) -> (Q, d_version)``), one registry entry per
kind:

- ``procrustes`` and ``affine`` (``q W + b``): faiss's own ``LinearTransform``, so the product
  runs on faiss's BLAS and OpenMP threads, those the search itself runs on. Through torch (a
  second OpenMP runtime, whose threads spin after each product) the map added 5.1% to a batch
  search of 256 queries when faiss was imported first; through faiss it adds 0.3%, and one
  512-d query costs 8.4 us instead of 13.9 (``benchmarks/adapters.py``, 2-core Xeon,
  2026-11-29).
- any other kind (``adapter``, a residual MLP): its own torch ``map_arrays``.

Both give ``forward`` on the queries to float32 rounding (``tests/index/test_query_map.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import faiss
import numpy as np


class FaissLinearMap:
    """``q W + b`` (then unit rows when the transformation normalises its output) as a faiss
    ``LinearTransform`` holding ``A = W^T``, ``b``."""

    def __init__(self, h) -> None:
        self.kind, self.d_old, self.d_new = h.kind, h.d_old, h.d_new
        self.normalize_output = h.normalize_output
        self.transform = faiss.LinearTransform(h.d_old, h.d_new, True)
        weight_t = np.ascontiguousarray(h.weight.detach().numpy().T, dtype=np.float32)
        faiss.copy_array_to_vector(weight_t.ravel(), self.transform.A)
        faiss.copy_array_to_vector(h.bias.detach().numpy().astype(np.float32), self.transform.b)
        self.transform.is_trained = True

    def map_arrays(self, queries: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(queries, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[1] != self.d_old:
            raise ValueError(
                f"expected old embeddings of shape (N, {self.d_old}), got {tuple(rows.shape)}"
            )
        out = np.empty((len(rows), self.d_new), np.float32)  # apply_noalloc: 0.8 us less a call
        self.transform.apply_noalloc(len(rows), faiss.swig_ptr(rows), faiss.swig_ptr(out))
        if self.normalize_output:
            faiss.normalize_L2(out)
        return out


SEARCH_MAPS: dict[str, Callable] = {"procrustes": FaissLinearMap, "affine": FaissLinearMap}


def search_map(h):
    """What a search calls to map queries through the transformation ``h``: its registry entry
    in :data:`SEARCH_MAPS`, else ``h`` itself (its ``map_arrays``)."""
    build = SEARCH_MAPS.get(h.kind)
    return h if build is None else build(h)
