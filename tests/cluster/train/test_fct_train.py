"""Training the FCT pieces with Ray Train: SimCLR side-information, triples, h and g.

The Ray tests (real local Ray, 2 CPU workers) train on toy data; the rest check the exports and
every bad input before a worker starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from raycompat.cluster.train.fct_loop import (
    compute_triples,
    load_side_info,
    train_side_info,
    train_transformation,
)
from raycompat.config import load_config
from raycompat.config.fct import SideInfoTrainConfig, TransformationTrainConfig
from raycompat.config.train import ModelSpec
from raycompat.data import create_dataset
from raycompat.errors import ConfigError
from raycompat.evaluation import EvalSet, score
from raycompat.fct.triples import Triples
from raycompat.nn.side_info import create_side_info
from raycompat.train.export import build_model, export_model, load_exported_model
from raycompat.transformations import (
    FCTTransformation,
    export_transformation,
    load_transformation,
)

IMAGES = "{num_classes: 4, images_per_class: 16, image_size: 28, channels: 1, seed: 0}"


def side_info_config(tmp_path, *overrides) -> SideInfoTrainConfig:
    return load_config(
        SideInfoTrainConfig,
        None,
        [
            "data.name=synthetic",
            f"data.options={IMAGES}",
            "data.classes=[0, 1, 2]",
            "model.backbone=lenetpp",
            "model.embed_dim=8",
            "model.projection_dim=8",
            "optim.warmup_epochs=1",
            "epochs=2",
            "batch_size=16",
            "scaling.num_workers=2",
            "run.name=side-info",
            f"run.storage_path={tmp_path}",
            *overrides,
        ],
    )


def synthetic_triples(seed: int = 0, n_classes: int = 50, per_class: int = 40):
    """Identities with a 16-d latent code: phi_old sees its first half, psi the second half,
    phi_new (and psi_new) fixed random linear maps of all of it, plus a little noise."""
    g = np.random.default_rng(seed)
    codes = g.normal(size=(n_classes, 16))
    labels = np.repeat(np.arange(n_classes), per_class)
    x = codes[labels] + 0.5 * g.normal(size=(len(labels), 16))
    old = x[:, :8] @ g.normal(size=(8, 8))
    side = x[:, 8:] @ g.normal(size=(8, 6))
    new = x @ g.normal(size=(16, 12)) / 4 + 0.05 * g.normal(size=(len(labels), 12))
    side_new = x @ g.normal(size=(16, 5)) / 4
    arrays = [a.astype(np.float32) for a in (old, side, new, side_new)]
    return Triples(*arrays), labels


def subset(triples: Triples, rows: np.ndarray) -> Triples:
    return Triples(*(np.ascontiguousarray(a[rows]) for a in triples.arrays().values()))


def transformation_config(triples_dir, tmp_path, *overrides) -> TransformationTrainConfig:
    return load_config(
        TransformationTrainConfig,
        None,
        [
            f"triples={triples_dir}",
            "h={d_old: 8, d_side: 6, d_new: 12, width: 64}",
            "g={d_side_new: 5, width: 32}",
            "optim.lr=0.005",
            "optim.warmup_epochs=1",
            "epochs=8",
            "batch_size=64",
            "scaling.num_workers=2",
            "run.name=fct",
            f"run.storage_path={tmp_path}",
            *overrides,
        ],
    )


def bn_running_means(h) -> torch.Tensor:
    return torch.cat([m.running_mean for m in h.modules() if isinstance(m, torch.nn.BatchNorm1d)])


@pytest.mark.ray
@pytest.mark.slow
def test_side_info_training_exports_a_loadable_model_and_triples(ray_local, tmp_path):
    cfg = side_info_config(tmp_path)
    result = train_side_info(cfg)
    assert result.metrics["epoch"] == 1 and np.isfinite(result.metrics["nt_xent"])
    # 3 classes x 16 images over 2 workers x 8: 3 full steps each.
    assert result.metrics["steps"] == 3
    side_dir = tmp_path / "exported"
    result.checkpoint.to_directory(str(side_dir))
    psi = load_side_info(side_dir)
    torch.manual_seed(cfg.seed)
    initial = create_side_info("simclr", backbone="lenetpp", embed_dim=8, projection_dim=8)
    assert not torch.equal(psi.projection[0].weight, initial.projection[0].weight)

    dataset = create_dataset(
        "synthetic", num_classes=4, images_per_class=16, image_size=28, channels=1, seed=0
    )
    specs = {"old": ModelSpec(embed_dim=3, num_classes=4), "new": ModelSpec(num_classes=6)}
    for name, spec in specs.items():
        torch.manual_seed(len(name))
        export_model(tmp_path / name, build_model(spec).state_dict(), spec)
    rows = np.array([5, 40, 17, 63, 0])
    triples = compute_triples(
        tmp_path / "old",
        side_dir,
        tmp_path / "new",
        dataset,
        rows,
        new_side_info_dir=side_dir,
        batch_size=2,
    )
    images = torch.stack([dataset[int(r)][0] for r in rows])
    with torch.no_grad():
        expected = {
            "old": load_exported_model(tmp_path / "old")[0].forward_features(images),
            "side": psi.forward_features(images),
            "new": load_exported_model(tmp_path / "new")[0].forward_features(images),
        }
    for name, value in expected.items():
        np.testing.assert_allclose(getattr(triples, name), value.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(triples.side_new, triples.side)
    unit = compute_triples(
        tmp_path / "old", None, tmp_path / "new", dataset, rows, normalize_new=True
    )
    assert unit.side.shape == (5, 0) and unit.side_new is None
    np.testing.assert_allclose(np.linalg.norm(unit.new, axis=1), 1.0, rtol=1e-5)
    triples.save(tmp_path / "triples")
    loaded = Triples.load(tmp_path / "triples")
    np.testing.assert_array_equal(loaded.old, triples.old)


@pytest.mark.ray
@pytest.mark.slow
def test_transformation_learns_freezes_bn_and_resumes(ray_local, tmp_path):
    triples, labels = synthetic_triples()
    perm = np.random.default_rng(1).permutation(len(labels))
    train, test = perm[:1600], perm[1600:]
    subset(triples, train).save(tmp_path / "triples")
    # 4 epochs (BN frozen from 2 = epochs // 2 on, the failure at 3): each epoch reports a
    # checkpoint, which costs more than its steps, so the epochs are few and the steps many.
    epochs, half, batch_size = 4, 2, 32
    cfg = transformation_config(
        tmp_path / "triples",
        tmp_path,
        f"epochs={epochs}",
        f"batch_size={batch_size}",
        f"run.checkpoints_to_keep={epochs}",
        "run.max_failures=1",
        "run.inject_failure={epoch: 3, batch: 3, rank: 1}",
    )
    result = train_transformation(cfg)

    assert (Path(tmp_path) / "fct" / "_injected_failure_transformation").is_file()
    assert result.metrics["epoch"] == epochs - 1
    assert result.metrics["steps"] == 1600 // batch_size
    by_epoch = {m["epoch"]: c for c, m in result.best_checkpoints}
    assert sorted(by_epoch) == list(range(epochs))
    assert [
        m["bn_frozen"] for _, m in sorted(result.best_checkpoints, key=lambda p: p[1]["epoch"])
    ] == [False] * half + [True] * half

    means = []
    for epoch in range(epochs):
        with by_epoch[epoch].as_directory() as directory:
            means.append(bn_running_means(load_transformation(directory)))
    assert not torch.equal(means[half - 2], means[half - 1])  # still updating before epochs // 2
    for epoch in range(half, epochs):  # frozen from epochs // 2 on, across the restart at 3
        torch.testing.assert_close(means[epoch], means[half - 1], rtol=0, atol=0)

    with result.checkpoint.as_directory() as directory:
        h, g = load_transformation(directory), load_transformation(directory, "g")
    assert (h.d_old, h.d_side, h.d_new, h.normalize_output) == (8, 6, 12, False)
    held = subset(triples, test)
    with torch.no_grad():
        mapped = h(torch.from_numpy(held.old), torch.from_numpy(held.side)).numpy()
        side_new = g(torch.from_numpy(held.old), torch.from_numpy(held.side)).numpy()
    mse = ((mapped - held.new) ** 2).sum(1).mean()
    zero = (held.new**2).sum(1).mean()
    assert mse < 0.25 * zero, (mse, zero)
    assert ((side_new - held.side_new) ** 2).sum(1).mean() < 0.25 * (held.side_new**2).sum(1).mean()
    queries = EvalSet(labels[test])
    cross = score("identification", held.new, mapped, queries, distance="l2")
    old_old = score("identification", held.old, held.old, queries, distance="l2")
    assert cross > old_old + 0.1, (cross, old_old)


# ---- no Ray needed: exports and checks before any worker starts ------------------------------


class CountingBar:
    """Stands in for Ray's ``tqdm_ray.tqdm``: counts the epochs it is shown."""

    def __init__(self, total: int, desc: str, unit: str) -> None:
        self.total, self.n, self.closed = total, 0, False
        CountingBar.last = self

    def update(self, n: int) -> None:
        self.n += n

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self) -> None:
        self.closed = True


def train_in_process(cfg: TransformationTrainConfig, run_path: Path) -> None:
    """The transformation's loop as its one-worker task runs it (``task_run.train_task``),
    in this process: no Ray."""
    import pyarrow.fs as pafs

    from raycompat.cluster.train.fct_loop import transformation_loop_per_worker
    from raycompat.cluster.train.task_run import Keep, train_task
    from raycompat.fct.checks import check_transformation_config

    local = pafs.LocalFileSystem()
    config = {
        "cfg": cfg,
        "marker": (local, str(run_path / "_injected_failure")),
        "triples": check_transformation_config(cfg),
    }
    run_path.mkdir(parents=True)
    loop = transformation_loop_per_worker
    reports = train_task(loop, config, local, str(run_path), "transformation", Keep(1), False)
    assert [m["epoch"] for m in reports] == list(range(cfg.epochs))  # the task yields each


def test_the_transformations_epochs_are_a_few_lines_off_a_terminal_and_a_bar_on_one(
    toy_triples, tmp_path, caplog, monkeypatch
):
    """30 epochs of h (the upgrade job's count) log the first and the last epoch's lines and
    at most one more per 10 s, not one per epoch, where the console is not a terminal; on
    one, a bar counts the epochs and the last line stays. Every epoch is in metrics.jsonl
    either way."""
    import logging
    import time

    from ray.experimental import tqdm_ray

    from raycompat.progress import CONSOLE_ENV, LINE_EVERY_S, TERMINAL

    def epoch_lines(run: str, *overrides: str) -> tuple[list[str], float]:
        cfg = transformation_config(
            toy_triples, tmp_path, "scaling.num_workers=1", "g=null", f"run.name={run}", *overrides
        )
        caplog.clear()
        began = time.perf_counter()
        with caplog.at_level(logging.INFO, logger="raycompat"):
            train_in_process(cfg, tmp_path / run)
        lines = [r.getMessage() for r in caplog.records if "/transformation epoch " in r.message]
        reports = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        assert len(reports) == cfg.epochs, reports
        return lines, time.perf_counter() - began

    monkeypatch.delenv(CONSOLE_ENV, raising=False)  # a log file, CI, `ray job logs`
    lines, seconds = epoch_lines("lines", "epochs=30")
    assert lines[0].startswith("lines/transformation epoch 1/30: h_mse="), lines
    assert lines[-1].startswith("lines/transformation epoch 30/30: h_mse="), lines
    assert len(lines) <= 2 + seconds // LINE_EVERY_S, (seconds, lines)

    monkeypatch.setenv(CONSOLE_ENV, TERMINAL)  # what the driver says on a terminal
    monkeypatch.setattr(tqdm_ray, "tqdm", CountingBar)
    lines, _ = epoch_lines("bar", "epochs=4")
    assert [line.split(":")[0] for line in lines] == ["bar/transformation epoch 4/4"]
    bar = CountingBar.last
    assert (bar.total, bar.n, bar.closed) == (4, 4, True)
    assert bar.desc.startswith("bar/transformation h_mse="), bar.desc


def test_transformation_export_round_trip(tmp_path):
    torch.manual_seed(0)
    h = FCTTransformation(4, 3, 5, width=16, normalize_output=True).eval()
    dims = dict(d_old=4, d_side=3, d_new=5, width=16, normalize_output=True)
    export_transformation(tmp_path, "h", h.state_dict(), dims, kind="fct", epoch=3)
    loaded = load_transformation(tmp_path)
    old, side = torch.randn(6, 4), torch.randn(6, 3)
    torch.testing.assert_close(loaded(old, side), h(old, side))
    with pytest.raises(FileNotFoundError, match="g.json"):
        load_transformation(tmp_path, "g")
    with pytest.raises(ValueError, match="width"):
        export_transformation(tmp_path, "h", h.state_dict(), {"d_old": 4}, kind="fct")


@pytest.fixture
def toy_triples(tmp_path):
    triples, _ = synthetic_triples(n_classes=10, per_class=20)
    triples.save(tmp_path / "triples")
    return tmp_path / "triples"


def test_bad_width_is_an_error_before_training(toy_triples, tmp_path):
    cfg = transformation_config(toy_triples, tmp_path, "h.d_old=7")
    with pytest.raises(ValueError, match=r"old\.npy has shape \(200, 8\), expected \(N, 7\)"):
        train_transformation(cfg)
    assert not (tmp_path / "fct").exists()  # nothing started


@pytest.mark.parametrize(
    "damage, overrides, message",
    [
        (lambda d: np.save(d / "side.npy", np.zeros((199, 6), np.float32)), [], "199 rows"),
        (lambda d: (d / "side_new.npy").unlink(), [], "side_new.npy is missing"),
        (
            lambda d: np.save(d / "new.npy", np.full((200, 12), np.nan, np.float32)),
            [],
            r"new\.npy: row 0 is not finite",
        ),
        (lambda d: None, ["h.normalize_output=true"], "row 0 is not L2-normalised"),
        (lambda d: None, ["batch_size=512"], "less than one batch"),
        (lambda d: None, ["batch_size=2", "scaling.num_workers=2"], "at least 2"),
        (lambda d: None, ["triples=/nonexistent/triples"], "not a directory"),
        (lambda d: None, ["scaling.strategy=fsdp"], "use ddp"),
    ],
)
def test_bad_triples_are_clear_errors(toy_triples, tmp_path, damage, overrides, message):
    damage(toy_triples)
    cfg = transformation_config(toy_triples, tmp_path, *overrides)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        train_transformation(cfg)


def test_configs_reject_unknown_and_missing_keys(tmp_path):
    with pytest.raises(ConfigError, match="h.d_olds"):
        transformation_config(tmp_path, tmp_path, "h.d_olds=3")
    with pytest.raises(ConfigError, match="missing required config key.*triples"):
        load_config(TransformationTrainConfig, None, ["h={d_old: 1, d_side: 0, d_new: 1}"])
    with pytest.raises(ConfigError, match="model.embed_dims"):
        side_info_config(tmp_path, "model.embed_dims=3")


def test_side_info_bad_inputs_fail_before_training(tmp_path):
    with pytest.raises(ValueError, match=r"data.classes: classes \[7\]"):
        train_side_info(side_info_config(tmp_path, "data.classes=[0, 7]"))
    rgb = "{num_classes: 4, images_per_class: 16, image_size: 28, channels: 3, seed: 0}"
    with pytest.raises(ValueError, match=r"lenetpp.*\(3, 28, 28\)"):
        train_side_info(side_info_config(tmp_path, f"data.options={rgb}"))


# ---- FastFill: h with its uncertainty head ---------------------------------------------------


def hard_row_triples(seed: int = 0, n: int = 800):
    """30% of the rows are hard: their new embedding carries noise their old one cannot
    predict, and the old embedding's last coordinate says which rows those are (as in
    tests/backfill/test_backfill.py). Labels: 4 classes, the new model's head outputs."""
    g = np.random.default_rng(seed)
    labels = g.integers(0, 4, size=n)
    x = np.eye(4)[labels] @ g.normal(size=(4, 6)) + 0.3 * g.normal(size=(n, 6))
    hard = g.random(n) < 0.3
    old = np.concatenate([x, 3.0 * hard[:, None]], axis=1)
    new = x @ g.normal(size=(6, 5)) / 2 + 1.5 * hard[:, None] * g.normal(size=(n, 5))
    triples = Triples(
        old.astype(np.float32),
        np.zeros((n, 0), np.float32),
        new.astype(np.float32),
        labels=labels.astype(np.int64),
    )
    return triples, hard


def classifier_dir(directory, d_new: int = 5, classes: int = 4) -> str:
    torch.manual_seed(0)
    spec = ModelSpec(backbone="lenetpp", head="linear", num_classes=classes, embed_dim=d_new)
    export_model(directory, build_model(spec).state_dict(), spec)
    return str(directory)


def uncertain_config(triples_dir, tmp_path, *overrides) -> TransformationTrainConfig:
    return transformation_config(
        triples_dir,
        tmp_path,
        "h={d_old: 7, d_side: 0, d_new: 5, width: 32, uncertainty: true}",
        "g=null",
        "epochs=6",
        *overrides,
    )


def test_uncertain_transformation_export_round_trip(tmp_path):
    torch.manual_seed(0)
    h = FCTTransformation(4, 0, 5, width=16, uncertainty=True).eval()
    dims = dict(d_old=4, d_side=0, d_new=5, width=16, normalize_output=False, uncertainty=True)
    export_transformation(tmp_path, "h", h.state_dict(), dims, kind="fct", epoch=3)
    loaded = load_transformation(tmp_path)
    old = torch.randn(6, 4)
    for got, expected in zip(
        loaded.forward_with_uncertainty(old), h.forward_with_uncertainty(old), strict=True
    ):
        torch.testing.assert_close(got, expected)
    # An export written before the flag existed (no "uncertainty" key) loads as plain FCT h.
    plain = FCTTransformation(4, 0, 5, width=16).eval()
    export_transformation(
        tmp_path / "old", "h", plain.state_dict(), {**dims, "uncertainty": 0}, kind="fct"
    )
    spec_file = tmp_path / "old" / "h.json"
    info = json.loads(spec_file.read_text())
    del info["uncertainty"]
    spec_file.write_text(json.dumps(info))
    old_h = load_transformation(tmp_path / "old")
    assert old_h.uncertainty_head is None
    torch.testing.assert_close(old_h(old), plain(old))


def test_uncertain_triples_round_trip_and_bad_discriminative_setups_fail_early(tmp_path):
    triples, _ = hard_row_triples(n=200)
    triples.save(tmp_path / "triples")
    loaded = Triples.load(tmp_path / "triples")
    assert loaded.labels.dtype == np.int64
    np.testing.assert_array_equal(loaded.labels, triples.labels)
    head = classifier_dir(tmp_path / "new")
    cases = [
        (["h.uncertainty=false", f"classifier={head}"], "set h.uncertainty=true"),
        ([f"classifier={classifier_dir(tmp_path / 'wide', d_new=6)}"], "outputs h.d_new=5"),
        ([f"classifier={classifier_dir(tmp_path / 'few', classes=2)}"], r"outside \[0, 2\)"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            train_transformation(uncertain_config(tmp_path / "triples", tmp_path, *overrides))
    (tmp_path / "triples" / "labels.npy").unlink()
    with pytest.raises(ValueError, match="labels.npy is missing"):
        train_transformation(uncertain_config(tmp_path / "triples", tmp_path, f"classifier={head}"))
    assert not (tmp_path / "fct").exists()  # nothing started


@pytest.mark.ray
@pytest.mark.slow
def test_ray_loop_trains_an_uncertain_transformation(ray_local, tmp_path):
    """h with its head on 2 workers, FastFill's loss with the discriminative term and the
    cosine error: the export carries the head, and h is less sure of the hard rows than of the
    easy ones."""
    triples, hard = hard_row_triples()
    triples.save(tmp_path / "triples")
    head = classifier_dir(tmp_path / "new")
    cfg = uncertain_config(
        tmp_path / "triples",
        tmp_path,
        f"classifier={head}",
        "discriminative_weight=0.1",
        "epochs=3",  # as many steps as 6 epochs of 64, half the epochs' checkpoints
        "batch_size=32",
        "uncertainty_error=cosine",  # sigma estimates the error between unit vectors
    )
    result = train_transformation(cfg)
    assert {"h_mse", "h_error", "h_sigma", "h_discriminative", "h_loss"} <= set(result.metrics)
    with result.checkpoint.as_directory() as directory:
        h = load_transformation(directory)
    assert h.uncertainty_head is not None
    with torch.no_grad():
        _, sigma = h.forward_with_uncertainty(torch.from_numpy(triples.old))
    sigma = sigma.numpy()
    assert np.isfinite(sigma).all()
    assert sigma[hard].mean() > sigma[~hard].mean() + 0.5, (sigma[hard].mean(), sigma.mean())
