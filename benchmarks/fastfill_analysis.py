"""Why FastFill's uncertainty order can score below random (issue 25, item 5).

    .venv/bin/python benchmarks/fastfill_analysis.py     # 3 seeds, 3 fits: 15 min on 2 busy cores
    .venv/bin/python benchmarks/fastfill_analysis.py --seeds 0 --variants cosine_error --out x.json

On MNIST-5k (LeNet++, the pure-PyTorch core of ``benchmarks/fidelity.py``): ``m_old`` trains on
digits 0-2, ``m_new`` on digits 0-6, and FastFill's ``h`` (uncertainty head) is fitted on
``m_new``'s training images, as the upgrade job fits it: old side L2-normalised (the stored
rows), target ``m_new``'s raw features, discriminative term on ``m_new``'s classifier; sigma
estimates the raw error (``l2_error``, before issue 25) or the error between unit vectors
(``cosine_error``, now; ``cosine_no_discriminative`` without the discriminative term). Each
variant of the fit (``VARIANTS``) is then measured on three sets of rows:

- ``fit_rows``: the images ``h`` was fitted on;
- ``training_classes``: held-out images of digits 0-6 (classes ``h`` and ``m_new`` trained on);
- ``unseen_classes``: every image of digits 7-9 (no model trained on them: the demo's protocol).

Per set: Spearman's rho of the predicted uncertainty against the true transformation error
(``||normalize(h(old)) - normalize(new)||^2``, what the oracle order sorts by), against the raw
error (what an unnormalised loss regresses) and against ``||phi_new||``; and, on the two
evaluation sets, the backfill AUC (top-1 and mAP, percent) of the uncertainty, random and oracle
orders, plus the "top-1 impact" of backfilling each row alone (:func:`single_row_impact`), which
explains why the oracle can lose to random on top-1.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fidelity_eval import (  # noqa: E402
    combine,
    spearman,
    summary_leaf,
    transformation_error,
)
from _fidelity_train import (  # noqa: E402
    Optim,
    SequenceTrainer,
    TrainData,
    features,
    normalized,
)
from _machine import emit, machine_info  # noqa: E402

from raycompat.backfill import compare_orders, fit_uncertain_transformation  # noqa: E402
from raycompat.data.mnist import load_mnist5k  # noqa: E402
from raycompat.data.splits import holdout_split  # noqa: E402
from raycompat.registry import Registry  # noqa: E402

OLD_DIGITS, NEW_DIGITS, UNSEEN = 3, 7, (7, 8, 9)
PERCENT = 100.0
VARIANTS: Registry = Registry("fit variant")


class HSpec:
    """h's recipe: the upgrade demo's (configs/upgrade_mnist.yaml: width 256, 30 epochs,
    batch 256) with FCT appendix D's lr and a 2-epoch warm-up, as benchmarks/fidelity.py."""

    width, epochs, batch_size, lr, warmup_epochs = 256, 30, 256, 5e-4, 2
    uncertainty_weight, random_orders = 1.0, 5


def _fit(old, new, labels, head, seed, *, error: str, weight: float):
    return fit_uncertain_transformation(
        old,
        new,
        epochs=HSpec.epochs,
        seed=seed,
        width=HSpec.width,
        lr=HSpec.lr,
        batch_size=HSpec.batch_size,
        warmup_epochs=HSpec.warmup_epochs,
        labels=labels if weight > 0 else None,
        classifier=head if weight > 0 else None,
        discriminative_weight=weight,
        error=error,
    )


@VARIANTS.register("l2_error")
def l2_error(old, new, labels, head, seed):
    """Before the fix: sigma estimates the raw error ``||h - phi_new||^2`` (what the upgrade job
    fitted), discriminative weight 1."""
    return _fit(old, new, labels, head, seed, error="l2", weight=HSpec.uncertainty_weight)


@VARIANTS.register("cosine_error")
def cosine_error(old, new, labels, head, seed):
    """After the fix: sigma estimates the error on unit vectors (what cosine search and the
    oracle compare), discriminative weight 1."""
    return _fit(old, new, labels, head, seed, error="cosine", weight=HSpec.uncertainty_weight)


@VARIANTS.register("cosine_no_discriminative")
def cosine_no_discriminative(old, new, labels, head, seed):
    """The fixed error without the discriminative term (weight 0)."""
    return _fit(old, new, labels, head, seed, error="cosine", weight=0.0)


def single_row_impact(query, gallery_h, gallery_new, labels) -> np.ndarray:
    """Per gallery row i: top-1 answers made right minus made wrong when row i ALONE is
    backfilled (``h(old)`` -> new), identification protocol (query j IS gallery row j,
    excluded), cosine. ``(G,)`` int. A row changes query j's answer only if its new embedding
    overtakes j's current best, or it was j's best and falls behind the runner-up."""
    q, h, n = (torch.from_numpy(normalized(a)).double() for a in (query, gallery_h, gallery_new))
    before, after = q @ h.T, q @ n.T  # (Q, G) similarities with row i as h(old) / as new
    eye = torch.eye(len(q), dtype=torch.bool)
    before[eye], after[eye] = -np.inf, -np.inf
    top2 = before.topk(2, dim=1)
    best, best_row, runner = top2.values[:, 0], top2.indices[:, 0], top2.values[:, 1]
    y = torch.from_numpy(np.asarray(labels))
    right_now = y[best_row] == y
    same = y[None, :] == y[:, None]  # (Q, G): would row i be right for query j
    is_best = best_row[:, None] == torch.arange(len(q))[None, :]
    # row i not the best: it takes over when after > best
    takes = ~is_best & (after > best[:, None])
    gain = takes & same & ~right_now[:, None]
    loss = takes & ~same & right_now[:, None]
    # row i is the best: it stays best if after > runner-up, else the runner-up answers
    runner_row = top2.indices[:, 1]
    runner_right = y[runner_row] == y
    keeps = is_best & (after > runner[:, None])
    falls = is_best & ~keeps
    gain |= falls & runner_right[:, None] & ~right_now[:, None]
    loss |= falls & ~runner_right[:, None] & right_now[:, None]
    return (gain.sum(0) - loss.sum(0)).numpy().astype(np.int64)


def coverage(new: np.ndarray, labels: np.ndarray, orders: dict, fraction: float = 0.3) -> dict:
    """Per order: ``nearest_same_class``, the fraction of queries whose nearest same-class
    gallery row (new-model cosine, itself excluded) is among the first ``fraction`` of the order
    (random: about ``fraction``; top-1 turns right once that row holds its new embedding), and
    ``largest_class_share``, the largest share one class takes of those first rows (random:
    about the largest class's share of the gallery)."""
    unit = torch.from_numpy(normalized(new)).double()
    sim = unit @ unit.T
    y = torch.from_numpy(np.asarray(labels))
    sim[y[None, :] != y[:, None]] = -np.inf
    sim.fill_diagonal_(-np.inf)
    nearest = sim.argmax(dim=1).numpy()
    out = {}
    for name, order in orders.items():
        first = np.zeros(len(new), dtype=bool)
        first[order[: round(fraction * len(order))]] = True
        shares = np.bincount(np.asarray(labels)[first]) / first.sum()
        out[name] = {
            "nearest_same_class": float(first[nearest].mean()),
            "largest_class_share": float(shares.max()),
        }
    out["gallery_largest_class_share"] = float(np.bincount(np.asarray(labels)).max() / len(new))
    return out


def impact_by_error(impact: np.ndarray, error: np.ndarray, uncertainty: np.ndarray) -> dict:
    """How the rows each order backfills first change top-1 answers: the mean single-row impact
    of the first 10% / 30% of the oracle and uncertainty orders and of all rows, the share of
    rows that change any answer, and Spearman of the impact with error and uncertainty."""
    out = {"mean_all": float(impact.mean()), "rows_changing_an_answer": float(np.mean(impact != 0))}
    for name, key in (("oracle", error), ("uncertainty", uncertainty)):
        order = np.argsort(-key, kind="stable")
        for frac in (0.1, 0.3):
            first = order[: max(1, round(frac * len(order)))]
            out[f"mean_first_{int(frac * 100)}pct_{name}"] = float(impact[first].mean())
            out[f"changing_first_{int(frac * 100)}pct_{name}"] = float(np.mean(impact[first] != 0))
    out["spearman_impact_error"] = spearman(impact, error)
    out["spearman_impact_uncertainty"] = spearman(impact, uncertainty)
    return out


def measure(h, old, new, labels, with_curves: bool) -> dict:
    """Uncertainty vs error on one set of rows; backfill AUCs and impacts when ``with_curves``."""
    moved, uncertainty = h.transform(old)
    error = transformation_error(moved, new)
    raw_error = ((moved.astype(np.float64) - new) ** 2).sum(1)
    out = {
        "rows": len(old),
        "spearman_error": spearman(uncertainty, error),
        "spearman_raw_error": spearman(uncertainty, raw_error),
        "spearman_new_norm": spearman(uncertainty, np.linalg.norm(new, axis=1)),
        "spearman_raw_error_vs_error": spearman(raw_error, error),
    }
    if with_curves:
        curves = compare_orders(
            new,
            new,
            moved,
            labels,
            labels,
            uncertainty,
            random_seeds=tuple(range(HSpec.random_orders)),
            exclude_self=True,
        )
        for metric in ("top1", "mean_ap"):
            out[f"auc_{metric}"] = {k: c.auc(metric) * PERCENT for k, c in curves.items()}
        out["top1_at"] = {
            f"{f:.0%}": {k: float(c.top1[i]) * PERCENT for k, c in curves.items()}
            for i, f in enumerate(curves["random"].fractions)
            if i in (0, 1, 3, 10)
        }
        impact = single_row_impact(new, normalized(moved), new, labels)
        out["impact"] = impact_by_error(impact, error, uncertainty)
        orders = {
            "uncertainty": np.argsort(-uncertainty, kind="stable"),
            "oracle": np.argsort(-error, kind="stable"),
        }
        out["coverage_30pct"] = coverage(new, labels, orders)
    return out


def mnist_data(seed: int):
    """TrainData for steps (3, 7) on 80% of digits 0-6 (seeded), plus the evaluation rows."""
    raw, labels = load_mnist5k()
    images = torch.from_numpy(raw).float().div_(255.0).unsqueeze(1)
    rows = np.arange(len(labels))
    trained = rows[labels < NEW_DIGITS]
    train, held = holdout_split(labels[trained], 0.2, seed=seed)
    train_rows, held_rows = trained[train], trained[held]
    data = TrainData(
        images[train_rows],
        torch.from_numpy(labels[train_rows]),
        (OLD_DIGITS, NEW_DIGITS),
        10,
        "lenetpp",
        {},
        9,
    )
    unseen = rows[np.isin(labels, UNSEEN)]
    evals = {
        "training_classes": (images[held_rows], labels[held_rows]),
        "unseen_classes": (images[unseen], labels[unseen]),
    }
    return data, evals


def run_seed(seed: int, variants: list[str], epochs: int) -> dict:
    data, evals = mnist_data(seed)
    start = time.perf_counter()
    m_old, m_new = SequenceTrainer(data, Optim(epochs, 64, 2e-3), seed).sequence("independent")
    fit_images = data.images[data.step_rows(1)]
    old_fit, new_fit = normalized(features(m_old, fit_images)), features(m_new, fit_images)
    fit_labels = data.labels[data.step_rows(1)].numpy()
    out = {"models_seconds": time.perf_counter() - start}
    for name in variants:
        begin = time.perf_counter()
        h = VARIANTS.get(name)(old_fit, new_fit, fit_labels, m_new.head, seed * 1000 + 1)
        result = {"fit_rows": measure(h, old_fit, new_fit, fit_labels, False)}
        for split, (images, labels) in evals.items():
            old, new = normalized(features(m_old, images)), features(m_new, images)
            result[split] = measure(h, old, new, labels, True)
        result["seconds"] = time.perf_counter() - begin
        out[name] = result
        logging.info("seed %d %s: %.0f s", seed, name, result["seconds"])
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS.names()))
    parser.add_argument("--epochs", type=int, default=2, help="m_old/m_new epochs (the demo's)")
    parser.add_argument("--out", default="benchmarks/results/fastfill_analysis.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    torch.set_num_threads(1)
    start = time.perf_counter()
    seeds = {str(s): run_seed(s, args.variants, args.epochs) for s in args.seeds}
    summary = combine(list(seeds.values()), summary_leaf)
    result = {
        "benchmark": "fastfill_analysis",
        "machine": machine_info(),
        "protocol": {
            "old_digits": list(range(OLD_DIGITS)),
            "new_digits": list(range(NEW_DIGITS)),
            "unseen_digits": list(UNSEEN),
            "model_epochs": args.epochs,
            "h": {
                k: getattr(HSpec, k)
                for k in (
                    "width",
                    "epochs",
                    "batch_size",
                    "lr",
                    "warmup_epochs",
                    "uncertainty_weight",
                )
            },
        },
        "seeds": seeds,
        "summary": summary,
        "seconds": time.perf_counter() - start,
    }
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
