"""A first end-to-end demonstration on real data: ``python -m raycompat.cli.demo``.

On MNIST-5k with LeNet++ in a 2-D feature space (the CoReS figures), train three models on a
growing class sequence (default 4, 7, 10 digits) with each of ``ift``, ``bct`` and ``cores``;
evaluate 3 x 3 compatibility matrices on held-out images (1:N top-1, cosine, query excluded by
index), log them with AC / AA, and write a PNG per method with the 2-D features of each model.

Two held-out evaluation sets are reported, because they answer different questions:
``seen`` holds only the digits every model was trained on (the first step's), ``all`` holds all
ten digits, which is open-set for the earlier models (as CIFAR-10 is for CoReS' CIFAR-100
models).
No Ray: this is the pure-PyTorch core.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from raycompat.config import load_config, save_config
from raycompat.console import configure_console
from raycompat.data.mnist import load_mnist5k
from raycompat.data.splits import holdout_split
from raycompat.engine import extract_features, tensor_batches, train_epoch
from raycompat.methods import METHODS, OldModel, create_method
from raycompat.metrics.compatibility import (
    CompatibilityMatrix,
    average_accuracy,
    average_compatibility,
)
from raycompat.metrics.retrieval import cmc
from raycompat.nn.models import CompatModel, create_model
from raycompat.progress import Stages, plural

log = logging.getLogger("raycompat.cli.demo")

NUM_CLASSES = 10


@dataclass
class DemoConfig:
    methods: list[str] = field(default_factory=lambda: ["ift", "bct", "cores"])
    steps: list[int] = field(default_factory=lambda: [4, 7, 10])
    epochs: int = 4
    batch_size: int = 32
    lr: float = 2e-3
    heldout_fraction: float = 0.2
    seed: int = 0
    threads: int = 2
    output_dir: str = "outputs/demo"


def _new_model(method_name: str, seed: int) -> CompatModel:
    torch.manual_seed(seed)
    if METHODS.get(method_name).fixed_head:
        # The 2-D analogue of the d-Simplex: a fixed regular 10-gon (CoReS Fig. 7c).
        return create_model("lenetpp", "polygon", num_classes=NUM_CLASSES)
    # CoReS sec. 5: unit-normalised classifier weights and zero biases in the 2-D toy.
    return create_model(
        "lenetpp",
        "linear",
        num_classes=NUM_CLASSES,
        embed_dim=2,
        head_kwargs={"bias": False, "normalize_weight": True},
    )


def _initial_model(method_name: str, step: int, seed: int, previous: CompatModel | None):
    policy = METHODS.get(method_name).init
    if policy == "old" and previous is not None:
        return copy.deepcopy(previous)
    if policy == "same_seed":
        return _new_model(method_name, seed)
    return _new_model(method_name, seed + 1 + step)


def train_sequence(
    cfg: DemoConfig,
    method_name: str,
    images: torch.Tensor,
    labels: torch.Tensor,
    stages: Stages | None = None,
):
    """Train one model per step on the union of the classes seen so far; each step is a stage
    of ``stages`` (announced before it starts), numbered after the stages already begun."""
    models: list[CompatModel] = []
    for step, num_seen in enumerate(cfg.steps):
        keep = labels < num_seen
        x, y = images[keep], labels[keep]
        if stages is not None:
            stages.begin(stages.position + 1)
            stages.announce(
                f"{method_name} step {step + 1}",
                f"training on {num_seen} digits ({len(x)} images), {plural(cfg.epochs, 'epoch')}",
            )
        previous = models[-1] if models else None
        model = _initial_model(method_name, step, cfg.seed, previous)
        old = None
        name = method_name
        if previous is not None:
            old = OldModel.from_model(copy.deepcopy(previous), classes=range(cfg.steps[step - 1]))
        elif METHODS.get(method_name).needs_old_model:
            name = "independent"  # the first model has nothing to be compatible with
        method = create_method(name, old=old)
        method.check_model(model)
        gen = torch.Generator().manual_seed(cfg.seed * 100 + step)
        method.prepare(model, tensor_batches(x, y, 256, shuffle=False))
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        start = time.perf_counter()
        for epoch in range(cfg.epochs):
            batches = tensor_batches(x, y, cfg.batch_size, gen)
            terms = train_epoch(model, method, batches, optimizer, epoch=epoch)
            spent = time.perf_counter() - start
            log.info(
                "%s step %d (%d digits, %d images) epoch %d/%d: %s | ETA %.0fs",
                method_name,
                step + 1,
                num_seen,
                len(x),
                epoch + 1,
                cfg.epochs,
                " ".join(f"{k}={v:.3f}" for k, v in terms.items()),
                spent / (epoch + 1) * (cfg.epochs - epoch - 1),
            )
        log.info("%s step %d trained in %.1fs", method_name, step + 1, time.perf_counter() - start)
        models.append(model.eval())
    return models


def compatibility_matrix(features: list[torch.Tensor], labels: torch.Tensor) -> CompatibilityMatrix:
    """``M(t, k)`` = 1:N top-1 with queries from model t against a gallery from model k.

    Args:
        features: one ``(N, d)`` tensor per model, all of the same N images.
    """
    matrix = CompatibilityMatrix(metric="top1", higher_is_better=True)
    for t in range(len(features)):
        row = [
            cmc(features[t], features[k], labels, labels, topk=(1,), exclude_self=True)[1]
            for k in range(t + 1)
        ]
        matrix.add_row(row, name=f"phi_{t + 1}")
    return matrix


def plot_features(models, features, labels, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 4.2))
    colors = plt.get_cmap("tab10")
    for t, (ax, model, model_features) in enumerate(
        zip(np.atleast_1d(axes), models, features, strict=True)
    ):
        feats = model_features.numpy()
        radius = np.percentile(np.linalg.norm(feats, axis=1), 95)
        for c in range(NUM_CLASSES):
            pts = feats[labels.numpy() == c]
            ax.scatter(pts[:, 0], pts[:, 1], s=3, color=colors(c), label=str(c), alpha=0.6)
        protos = torch.nn.functional.normalize(model.head.weight_matrix().detach(), dim=1).numpy()
        for c, w in enumerate(protos):
            ax.plot([0, radius * w[0]], [0, radius * w[1]], color=colors(c), linewidth=1.5)
        ax.set_title(f"{title}: model {t + 1}")
        ax.set_aspect("equal")
    np.atleast_1d(axes)[0].legend(markerscale=4, fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(cfg: DemoConfig) -> dict:
    if cfg.steps != sorted(cfg.steps) or cfg.steps[-1] > NUM_CLASSES or cfg.steps[0] < 2:
        raise ValueError(f"steps must grow within 2..{NUM_CLASSES} digits, got {cfg.steps}")
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    raw_images, raw_labels = load_mnist5k()
    train_idx, heldout_idx = holdout_split(raw_labels, cfg.heldout_fraction, seed=cfg.seed)
    images = torch.from_numpy(raw_images).float().div_(255.0).unsqueeze(1)
    labels = torch.from_numpy(raw_labels)
    log.info("MNIST-5k: %d training and %d held-out images", len(train_idx), len(heldout_idx))
    heldout_labels = labels[heldout_idx]
    eval_sets = {  # rows of the held-out set
        "seen": heldout_labels < cfg.steps[0],
        "all": torch.ones_like(heldout_labels, dtype=torch.bool),
    }
    results = {}
    stages = Stages(len(cfg.methods) * len(cfg.steps))  # one per model trained
    for method_name in cfg.methods:
        models = train_sequence(cfg, method_name, images[train_idx], labels[train_idx], stages)
        stages.end()  # the evaluation's seconds are not a training step's
        stages.announce(method_name, f"scoring {len(models)} models on the held-out images")
        features = [extract_features(m, images[heldout_idx]) for m in models]
        plot_features(
            models, features, heldout_labels, out / f"features_{method_name}.png", method_name
        )
        results[method_name] = {}
        for set_name, rows in eval_sets.items():
            matrix = compatibility_matrix([f[rows] for f in features], heldout_labels[rows])
            ac, aa = average_compatibility(matrix), average_accuracy(matrix)
            log.info(
                "%s, held-out %s digits (%d images), 1:N top-1 %%, rows = query model:\n%s\n"
                "AC=%.3f AA=%.3f",
                method_name,
                set_name,
                int(rows.sum()),
                format_matrix(matrix),
                ac,
                aa,
            )
            results[method_name][set_name] = {
                "matrix": matrix.as_array().tolist(),
                "AC": ac,
                "AA": aa,
            }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    log.info("wrote %s", out)
    return results


def format_matrix(matrix: CompatibilityMatrix) -> str:
    array = matrix.as_array()
    lines = []
    for t, row in enumerate(array):
        cells = [f"{v * 100:6.2f}" if k <= t else "     -" for k, v in enumerate(row)]
        lines.append(f"  phi_{t + 1}  " + " ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML file with DemoConfig keys")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. epochs=2")
    args = parser.parse_args(argv)
    configure_console()
    return run(load_config(DemoConfig, args.config, args.overrides))


RESUMES = "rerunning starts the demo again (it stores no progress)"

if __name__ == "__main__":
    from raycompat.cli.errors import run_main

    run_main(main, resumes=RESUMES)
