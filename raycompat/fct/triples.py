"""Training data of the FCT transformation: ``(phi_old(x), psi(x), phi_new(x))`` per image.

At upgrade time the old model, the side-information model (trained at old time) and the new
model embed the *new* training set (FCT sec. 3.3); ``h`` is then fit on these arrays alone, so
the images are read once. With a new side-information model, ``psi_new(x)`` is stored too as the
target of ``g`` (FCT sec. 4.3). A triples directory holds float32 ``old.npy``, ``side.npy``,
``new.npy`` and optionally ``side_new.npy`` (and int64 ``labels.npy``, the new model's class of
each image, for FastFill's discriminative term), row i of each describing the same image;
workers memory-map them and read only their shard. Nothing here imports Ray.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from raycompat.engine import embed
from raycompat.fct.export import load_side_info
from raycompat.train.export import load_exported_model

log = logging.getLogger(__name__)
CHECK_ROWS = 65536  # rows per chunk when validating memory-mapped arrays


@dataclass
class Triples:
    """``old (N, d_old)``, ``side (N, d_side)``, ``new (N, d_new)``, ``side_new (N, d_g)|None``;
    ``labels (N,)|None``: the new model's head output of each image's class (not in
    :meth:`arrays`, which holds the float features)."""

    old: np.ndarray
    side: np.ndarray
    new: np.ndarray
    side_new: np.ndarray | None = None
    labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.old)

    def arrays(self) -> dict[str, np.ndarray]:
        named = {"old": self.old, "side": self.side, "new": self.new, "side_new": self.side_new}
        return {k: v for k, v in named.items() if v is not None}

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, array in self.arrays().items():
            np.save(directory / f"{name}.npy", np.asarray(array, dtype=np.float32))
        if self.labels is not None:
            np.save(directory / "labels.npy", np.asarray(self.labels, dtype=np.int64))

    @classmethod
    def load(cls, directory: str | Path, mmap: bool = True) -> Triples:
        """Memory-mapped by default: a worker touches only the rows it trains on."""
        directory = Path(directory)
        mode = "r" if mmap else None

        def read(name: str, required: bool = True):
            path = directory / f"{name}.npy"
            if not path.is_file():
                if required:
                    raise FileNotFoundError(f"triples: {path} does not exist")
                return None
            return np.load(path, mmap_mode=mode, allow_pickle=False)

        return cls(
            read("old"),
            read("side"),
            read("new"),
            read("side_new", required=False),
            read("labels", required=False),
        )


def check_triples(triples: Triples, source: str, widths: dict[str, int], unit_norm: str = ""):
    """Raise ``ValueError`` naming the file when a width, the row count or a value is wrong.

    Args:
        widths: expected second dimension per array name (``{"old": d_old, ...}``); an array
            named here must exist.
        unit_norm: name of an array whose rows must be L2-normalised (h's target when h's
            output is normalised), or "".
    """
    arrays = triples.arrays()
    if triples.labels is not None and triples.labels.shape != (len(triples.old),):
        raise ValueError(
            f"triples {source}/labels.npy has shape {triples.labels.shape}, expected "
            f"({len(triples.old)},): one class per row of old.npy"
        )
    for name, width in widths.items():
        if name not in arrays:
            raise ValueError(f"triples {source}: {name}.npy is missing (needed for width {width})")
        array = arrays[name]
        if array.ndim != 2 or array.shape[1] != width:
            raise ValueError(
                f"triples {source}/{name}.npy has shape {array.shape}, expected (N, {width}); "
                "check the config's widths against the models that produced the triples"
            )
        if len(array) != len(triples.old):
            raise ValueError(
                f"triples {source}/{name}.npy has {len(array)} rows but old.npy has "
                f"{len(triples.old)}; row i of every file must describe the same image"
            )
    for name, array in arrays.items():
        for start in range(0, len(array), CHECK_ROWS):
            block = np.asarray(array[start : start + CHECK_ROWS], dtype=np.float64)
            bad = ~np.isfinite(block).all(axis=1)
            if bad.any():
                raise ValueError(
                    f"triples {source}/{name}.npy: row {start + bad.argmax()} is not finite"
                )
            if name == unit_norm:
                off = np.abs(np.linalg.norm(block, axis=1) - 1.0) > 1e-3
                if off.any():
                    row = start + off.argmax()
                    raise ValueError(
                        f"triples {source}/{name}.npy: row {row} is not L2-normalised but "
                        "h.normalize_output is set; compute the triples with normalize_new=True"
                    )


@torch.no_grad()
def compute_triples(
    old_model_dir: str | Path,
    side_info_dir: str | Path | None,
    new_model_dir: str | Path,
    dataset,
    rows: np.ndarray | None = None,
    *,
    new_side_info_dir: str | Path | None = None,
    normalize_new: bool = False,
    with_labels: bool = False,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
) -> Triples:
    """Embed ``dataset[rows]`` (the new training set) with every model, in ``rows`` order.

    Args:
        old_model_dir, new_model_dir: exported models (:func:`raycompat.train.export.export_model`).
        side_info_dir: an exported side-information model, or None for no side-info (width 0).
        new_side_info_dir: the new side-information model, whose output is ``g``'s target.
        normalize_new: L2-normalise ``phi_new`` (then train ``h`` with ``normalize_output``).
        with_labels: also store each image's class as the new model's head output (its
            ``label_map``): the targets of FastFill's discriminative term.
    """
    rows = np.arange(len(dataset)) if rows is None else np.asarray(rows, dtype=np.int64)
    if not len(rows):
        raise ValueError("compute_triples: no rows to embed")
    new_model, new_info = load_exported_model(new_model_dir)
    models = {"old": load_exported_model(old_model_dir)[0], "new": new_model}
    if side_info_dir is not None:
        models["side"] = load_side_info(side_info_dir)
    if new_side_info_dir is not None:
        models["side_new"] = load_side_info(new_side_info_dir)
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in models}
    for model in models.values():
        model.to(device).eval()
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        images = torch.stack([dataset[int(r)][0] for r in batch]).to(device)
        for name, model in models.items():
            unit = normalize_new and name == "new"
            parts[name].append(embed(model.forward_features, images, normalize=unit).cpu())
    out = {name: torch.cat(chunks).numpy() for name, chunks in parts.items()}
    side = out.get("side", np.zeros((len(rows), 0), dtype=np.float32))
    log.info("computed %d triples: %s", len(rows), {k: v.shape for k, v in out.items()})
    labels = _head_labels(new_info, dataset, rows, new_model_dir) if with_labels else None
    return Triples(out["old"], side, out["new"], out.get("side_new"), labels)


def _head_labels(info: dict, dataset, rows: np.ndarray, source) -> np.ndarray:
    """The new model's head output for the class of each of ``rows`` (its ``label_map``)."""
    label_map = {int(c): int(o) for c, o in info.get("label_map", {}).items()}
    classes = np.asarray(dataset.labels)[rows]
    unknown = sorted(set(np.unique(classes).tolist()) - set(label_map))
    if unknown:
        raise ValueError(
            f"compute_triples: classes {unknown[:10]} are not in the label_map of {source}; "
            "the discriminative term needs the new model to know every class it is fit on"
        )
    return np.asarray([label_map[int(c)] for c in classes], dtype=np.int64)
