"""Learn ``h: phi_old -> phi_new`` between two trained models (FCT sec. 3.3), and apply it.

Shared by the upgrade job (an FCT upgrade rewrites the stored gallery with ``h``) and by sweeps
(an FCT trial scores ``h``'s cross-test on the validation split), so both learn ``h`` the same
way: triples of the new model's training images, then the transformation run on Ray Train.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from raycompat.config.fct import FCTSpec, TransformationSpec, TransformationTrainConfig
from raycompat.config.train import RunSpec, ScalingSpec


def fit_transformation(
    old_dir: str | Path,
    new_dir: str | Path,
    dataset,
    rows: np.ndarray,
    spec: FCTSpec,
    *,
    scaling: ScalingSpec,
    run: RunSpec,
    work_dir: str | Path,
    seed: int = 0,
    normalize_old: bool = False,
    uncertainty: bool = False,
    discriminative_weight: float = 0.0,
    uncertainty_error: str = "l2",
) -> str:
    """Embed ``dataset[rows]`` with both exported models, train ``h`` (no side-information) on
    the triples, and return a local directory holding ``h.*`` (``work_dir/h``).

    ``normalize_old``: L2-normalise the old side first, when ``h`` will be applied to stored
    rows that were normalised. ``uncertainty``: ``h`` also learns FastFill's per-row
    uncertainty (for a partial backfill), with the discriminative term (the new model's
    classifier on ``h``'s output) weighted by ``discriminative_weight`` when that is > 0, and
    sigma estimating the error measured as ``uncertainty_error`` (``"cosine"`` suits normalised
    stored rows; the upgrade job still passes the default ``"l2"``, docs/backfill.md). A rerun
    with the same ``run`` resumes the transformation run.
    """
    from raycompat.cluster.train.fct_loop import train_transformation
    from raycompat.fct.triples import compute_triples

    discriminative = uncertainty and discriminative_weight > 0
    triples = compute_triples(old_dir, None, new_dir, dataset, rows, with_labels=discriminative)
    if normalize_old:
        triples.old = F.normalize(torch.from_numpy(np.asarray(triples.old)), dim=1).numpy()
    triples_dir = os.path.join(work_dir, "triples")
    triples.save(triples_dir)
    result = train_transformation(
        TransformationTrainConfig(
            triples=triples_dir,
            h=TransformationSpec(
                d_old=triples.old.shape[1],
                d_side=0,
                d_new=triples.new.shape[1],
                width=spec.width,
                uncertainty=uncertainty,
            ),
            optim=spec.optim,
            epochs=spec.epochs,
            batch_size=spec.batch_size,
            scaling=dataclasses.replace(scaling, precision="fp32"),
            run=run,
            seed=seed,
            classifier=str(new_dir) if discriminative else None,
            discriminative_weight=discriminative_weight,
            uncertainty_error=uncertainty_error,
        )
    )
    out = os.path.join(work_dir, "h")
    if os.path.isdir(out):
        shutil.rmtree(out)
    result.checkpoint.to_directory(out)
    return out


@torch.no_grad()
def transform_features(h: torch.nn.Module, old_features: np.ndarray) -> np.ndarray:
    """``h(phi_old)`` without side-information: a gallery after an FCT rewrite."""
    h.eval()
    return h(torch.from_numpy(np.ascontiguousarray(old_features))).float().numpy()


@torch.no_grad()
def transform_with_uncertainty(
    h: torch.nn.Module, old_features: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(h(phi_old) (N, d_new), uncertainty (N,))`` for an ``h`` trained with its uncertainty
    head (FastFill's log-variance: larger = less certain)."""
    h.eval()
    out, sigma = h.forward_with_uncertainty(torch.from_numpy(np.ascontiguousarray(old_features)))
    return out.float().numpy(), sigma.float().numpy()
