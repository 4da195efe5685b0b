"""What every transformation kind is: ``h(old[, side]) -> new``, one ``nn.Module`` interface.

A transformation maps embeddings of an old model (and, for a kind that uses it, the old
side-information ``psi``) into a new model's space, so an old gallery becomes searchable by the
new model without re-extracting its images. The pipelines (transform, partial backfill) and the
backfill fit need of it only what :class:`Transformation` declares: ``forward``, its widths
(checked against a store's versions from the stored spec, before any row is read), whether it
normalises its output, an optional per-row uncertainty, and the constructor spec it is saved
and rebuilt with (:mod:`raycompat.transformations.files`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

# Constructor arguments of every kind: what a pipeline checks against the store's widths.
INTERFACE_KEYS = ("d_old", "d_side", "d_new", "normalize_output")


class Transformation(nn.Module):
    """``forward(old (N, d_old), side (N, d_side) or None) -> (N, d_new)``.

    A kind subclasses this, registers its class under :attr:`kind` in
    :data:`~raycompat.transformations.kinds.TRANSFORMATIONS`, and declares its constructor's
    arguments: :attr:`spec_keys` (every stored spec holds them; :data:`INTERFACE_KEYS` among
    them) and :attr:`spec_defaults` (arguments added after exports existed, with the value an
    export written before them means). :meth:`spec` returns exactly those arguments, so
    ``type(h)(**h.spec())`` rebuilds ``h``'s shape.
    """

    kind: ClassVar[str]
    spec_keys: ClassVar[tuple[str, ...]] = INTERFACE_KEYS
    spec_defaults: ClassVar[Mapping[str, Any]] = {}

    d_old: int
    d_side: int  # 0: the kind takes no side-information
    d_new: int
    normalize_output: bool

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        missing = [k for k in INTERFACE_KEYS if k not in cls.spec_keys]
        if missing:
            raise TypeError(f"{cls.__name__}.spec_keys lacks the interface keys {missing}")

    def spec(self) -> dict[str, Any]:
        """The constructor arguments (:attr:`spec_keys` and :attr:`spec_defaults`)."""
        raise NotImplementedError

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        """Where its tensors live: the first parameter's device, or the first buffer's for a
        kind whose map is fitted, not trained (``procrustes`` and ``affine`` hold buffers)."""
        for tensor in (*self.parameters(), *self.buffers()):
            return tensor.device
        return torch.device("cpu")

    @property
    def has_uncertainty(self) -> bool:
        """Whether :meth:`forward_with_uncertainty` gives a per-row uncertainty."""
        return False

    def map_arrays(self, old: np.ndarray) -> np.ndarray:
        """``forward`` on a float32 array ``(N, d_old)`` (no side-information), as an array:
        what a query-side search runs on each request for a kind without its own search-side
        map (``raycompat/index/query_map.py``: the linear kinds run on faiss there)."""
        with torch.no_grad():
            return self(torch.from_numpy(np.ascontiguousarray(old, dtype=np.float32))).numpy()

    def forward_with_uncertainty(
        self, old: torch.Tensor, side: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h (N, d_new), sigma (N,))``, sigma a predicted log-variance (larger = less
        certain); only for a transformation with :attr:`has_uncertainty`."""
        raise ValueError(f"this {self.kind!r} transformation has no uncertainty head")

    @classmethod
    def missing_keys(cls, info: Mapping[str, Any]) -> list[str]:
        """The :attr:`spec_keys` that ``info`` (a stored spec, or dims to export) lacks."""
        return [k for k in cls.spec_keys if k not in info]

    @classmethod
    def args_of(cls, info: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor arguments in ``info`` (other keys ignored): :attr:`spec_keys`, then
        each of :attr:`spec_defaults`, converted to its default's type, or the default when
        ``info`` lacks it. Check :meth:`missing_keys` first."""
        args = {k: info[k] for k in cls.spec_keys}
        args.update({k: type(v)(info.get(k, v)) for k, v in cls.spec_defaults.items()})
        return args
