"""Multi-seed fidelity benchmark of every compatibility method (issue 25): what holds on every
seed, and how far the numbers move between seeds.

    .venv/bin/python benchmarks/fidelity.py --seeds 0 1 2 3 4 \
        --out benchmarks/results/fidelity_cpu.json --markdown /tmp/fidelity.md
    .venv/bin/python benchmarks/fidelity.py --quick          # seconds: structure only
    .venv/bin/python benchmarks/fidelity.py protocols=[mnist5k] mnist5k.epochs=2  # overrides
    .venv/bin/python benchmarks/fidelity.py --config benchmarks/fidelity_regime_cpu.yaml

For each protocol (``_fidelity_data``: MNIST-5k and synthetic identities, each scored open-set
and closed-set, and ``regime``, the papers' regime, run on its own), seed and method, one
sequence of models is trained on growing class sets
(``_fidelity_train``, the Ray-free core); each method serves its galleries (``_fidelity_fct``:
stored rows, or FCT's ``h`` moving them forward, with and without side-information, or
FastFill's ``h`` with its partial backfill) and is scored (``_fidelity_eval``): the full
compatibility matrix, ECC, AC, AA, update gain, negative flips and, for FastFill, backfill AUCs
and the rank correlation of its uncertainty with the true error. The JSON holds every seed's
numbers and their mean, sd, min and max; ``--markdown`` writes the tables
(``_fidelity_report``). Nothing is tuned. In ``mnist5k`` and ``synthetic`` no model is selected:
every model is its last epoch's; in ``regime`` every model trains to convergence by a
validation-plateau rule (``_fidelity_converge``), the epoch count a cap, and is scored by 1:1
verification and class-mean templates too (docs/fidelity.md, "Protocol `regime`").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fidelity_data import PROTOCOLS, Protocol  # noqa: E402
from _fidelity_eval import (  # noqa: E402
    combine,
    mean_leaf,
    re_embedding_share,
    run_metrics,
    score_metrics,
    summary_leaf,
)
from _fidelity_fct import COMPAT, Transformations  # noqa: E402
from _fidelity_maps import MAP_ENTRIES, register  # noqa: E402
from _fidelity_report import markdown  # noqa: E402
from _fidelity_train import (  # noqa: E402
    Optim,
    PassCounter,
    SequenceTrainer,
    features,
    seconds_per_pass,
)
from _machine import emit, machine_info  # noqa: E402

from raycompat.config import bounded, load_config, to_dict
from raycompat.errors import ConfigError
from raycompat.evaluation import EvalSet, score  # noqa: E402
from raycompat.methods import list_methods  # noqa: E402

log = logging.getLogger("benchmarks.fidelity")

# Benchmark entries that are not a plain registered method: (training method, serving mode).
ENTRIES = {
    "fct": ("fct", "fct"),
    "fct_side": ("fct", "fct_side"),
    "fastfill": ("fct", "fastfill"),
    **MAP_ENTRIES,  # procrustes, affine, adapter maps between independent models (issue 41)
}
register(COMPAT)
# Whole run over its training steps alone: old-model forwards, h and psi, feature extraction and
# scoring. The third full run measured 79.1 CPU-min against 75.6 estimated (docs/fidelity.md).
OVERHEAD = 1.3
DEFAULT_METHODS = [
    "independent",
    "ift",
    "l2",
    "lwf",
    "bct",
    "cores",
    "dsimplex_hoc",
    "nifcl_avg",
    "nifcl_rw",
    "fct",
    "fct_side",
    "fastfill",
]

# About half of a seed's CPU each: the independent models, FCT's h, psi and the baselines;
# then the methods that train with an old model of their own.
GROUPS = [
    ["independent", "fct", "fct_side", "fastfill", "ift", "l2", "lwf"],
    ["bct", "cores", "dsimplex_hoc", "nifcl_avg", "nifcl_rw"],
]


@dataclass
class MnistSpec:
    steps: list[int] = field(default_factory=lambda: [5, 6, 7])
    test_digits: list[int] = field(default_factory=lambda: [7, 8, 9])
    heldout_fraction: float = bounded(0.2, gt=0.0, lt=1.0)
    per_class: int | None = bounded(None, ge=4)
    num_outputs: int | None = bounded(10, ge=2)
    embed_dim: int | None = bounded(None, ge=1)
    epochs: int = bounded(2, ge=1)
    # None: the global FidelityConfig.batch_size / lr (the demo's)
    batch_size: int | None = bounded(None, ge=2)
    lr: float | None = bounded(None, gt=0.0)


@dataclass
class SyntheticSpec:
    steps: list[int] = field(default_factory=lambda: [300, 400, 500])
    test_identities: int = bounded(100, ge=2)
    images_per_class: int = bounded(8, ge=3)
    heldout_per_class: int = bounded(2, ge=2)
    image_size: int = bounded(16, ge=8)
    difficulty: float = bounded(0.5, ge=0.0)
    num_outputs: int | None = bounded(None, ge=2)
    embed_dim: int | None = bounded(None, ge=1)
    epochs: int = bounded(3, ge=1)
    # at the global lr 2e-3, or without standardised input, LeNet++ stays at chance for 3
    # epochs here (docs/fidelity.md, "Sizing the synthetic protocol"); None: the global one
    standardize_inputs: bool = True
    batch_size: int | None = bounded(None, ge=2)
    lr: float | None = bounded(1e-3, gt=0.0)


@dataclass(frozen=True)
class RegimeSize:
    """Every size of the ``regime`` protocol (docs/fidelity.md, "Protocol `regime`")."""

    steps: tuple[int, ...]
    test_identities: int
    train_per_class: int
    val_per_class: int
    test_per_class: int
    image_size: int
    channels: int
    backbone: str
    epochs: int  # the cap: the same budget for every model
    patience: int
    verification_pairs: int
    device: str
    difficulty: float = 0.5
    min_delta: float = 0.0
    # revision 1 (docs/fidelity.md): no stop before half the cap (None: epochs // 2), and
    # every gradient's norm clipped
    min_epochs: int | None = None
    clip_grad_norm: float | None = 10.0
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    schedule: str = "cosine"  # or "step": x0.1 at `milestones` (None: 70% of the cap)
    milestones: tuple[int, ...] | None = None
    augment: str = "crop_flip"
    padding: int | None = None  # None: an eighth of the side (CIFAR's 4 of 32)

    def optim(self) -> Optim:
        milestones = self.milestones
        if milestones is None:
            milestones = (round(0.7 * self.epochs),) if self.schedule == "step" else ()
        return Optim(
            self.epochs,
            self.batch_size,
            self.lr,
            optimizer="sgd",
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            schedule=self.schedule,
            milestones=tuple(milestones),
            augment=self.augment,
            padding=self.image_size // 8 if self.padding is None else self.padding,
            patience=self.patience,
            min_delta=self.min_delta,
            min_epochs=self.epochs // 2 if self.min_epochs is None else self.min_epochs,
            clip_grad_norm=self.clip_grad_norm,
            device=self.device,
        )


# Fixed 2026-12-01 before any result, revised once (revision 1) after a sizing run and pilots,
# before any comparison (docs/fidelity.md); `regime.size` picks one.
REGIME_SIZES = {
    "cpu": RegimeSize(
        steps=(300, 400, 500),
        test_identities=100,
        train_per_class=6,
        val_per_class=2,
        test_per_class=2,
        image_size=16,
        channels=1,
        backbone="cifar_resnet20",
        epochs=60,
        patience=8,
        verification_pairs=3000,
        device="cpu",
    ),
    "gpu": RegimeSize(
        steps=(2000, 3000, 4000),
        test_identities=1000,
        train_per_class=16,
        val_per_class=4,
        test_per_class=4,
        image_size=32,
        channels=3,
        backbone="senet18",
        epochs=100,
        patience=5,
        verification_pairs=3000,
        device="cuda",
    ),
}


@dataclass
class RegimeSpec:
    """The ``regime`` protocol: ``size`` picks a preset of :data:`REGIME_SIZES`; every other
    key, left None, takes the preset's value, and given, overrides it."""

    size: Literal["cpu", "gpu"] = "cpu"
    steps: list[int] | None = None
    test_identities: int | None = bounded(None, ge=2)
    train_per_class: int | None = bounded(None, ge=1)
    val_per_class: int | None = bounded(None, ge=2)
    test_per_class: int | None = bounded(None, ge=2)
    image_size: int | None = bounded(None, ge=8)
    channels: int | None = bounded(None, ge=1)
    backbone: str | None = None
    epochs: int | None = bounded(None, ge=1)
    patience: int | None = bounded(None, ge=1)
    verification_pairs: int | None = bounded(None, ge=5)
    device: str | None = None
    difficulty: float | None = bounded(None, ge=0.0)
    min_delta: float | None = bounded(None, ge=0.0)
    min_epochs: int | None = bounded(None, ge=1)
    clip_grad_norm: float | None = bounded(None, gt=0.0)
    batch_size: int | None = bounded(None, ge=2)
    lr: float | None = bounded(None, gt=0.0)
    momentum: float | None = bounded(None, ge=0.0, lt=1.0)
    weight_decay: float | None = bounded(None, ge=0.0)
    schedule: Literal["cosine", "step", "constant"] | None = None
    milestones: list[int] | None = None
    augment: str | None = None
    padding: int | None = bounded(None, ge=0)

    def resolved(self) -> RegimeSize:
        given = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "size"}
        given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
        return replace(REGIME_SIZES[self.size], **{k: v for k, v in given.items() if v is not None})


@dataclass
class FCTBenchSpec:
    """h (FCT and FastFill) and psi; ``random_orders``: seeds of the random backfill order."""

    width: int = bounded(256, ge=1)
    epochs: int = bounded(30, ge=1)
    batch_size: int = bounded(256, ge=2)
    lr: float = bounded(5e-4, gt=0.0)
    warmup_epochs: int = bounded(2, ge=0)
    uncertainty_weight: float = bounded(1.0, ge=0.0)
    random_orders: int = bounded(3, ge=1)
    side_info: str = "simclr"
    side_dim: int = bounded(32, ge=1)
    side_epochs: int = bounded(2, ge=1)
    side_lr: float = bounded(1e-3, gt=0.0)
    side_batch_size: int = bounded(128, ge=2)
    side_temperature: float = bounded(0.1, gt=0.0)


@dataclass
class FidelityConfig:
    protocols: list[str] = field(default_factory=lambda: ["mnist5k", "synthetic"])
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    # five: three gave a min-max so narrow that one demo run fell outside it (issue 41, item 5)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    threads: int = bounded(1, ge=1)
    processes: int = bounded(2, ge=1)
    # Each (protocol, seed) runs as one task per group, so that the processes finish together;
    # a method in no group joins the last. Models two groups share are trained once when the
    # group that trains them ran first (SequenceTrainer's cache), else once per group.
    method_groups: list[list[str]] = field(default_factory=lambda: [list(g) for g in GROUPS])
    batch_size: int = bounded(64, ge=2)
    lr: float = bounded(2e-3, gt=0.0)
    # the upgrade demo's (configs/upgrade_mnist.yaml); other methods: the registry's defaults
    method_options: dict = field(default_factory=lambda: {"dsimplex_hoc": {"lam": 0.1, "rho": 5.0}})
    mnist5k: MnistSpec = field(default_factory=MnistSpec)
    synthetic: SyntheticSpec = field(default_factory=SyntheticSpec)
    regime: RegimeSpec = field(default_factory=RegimeSpec)
    fct: FCTBenchSpec = field(default_factory=FCTBenchSpec)


QUICK = [
    "seeds=[0, 1]",
    "threads=1",
    "methods=[independent, bct, cores, fct, fct_side, fastfill]",
    "mnist5k.per_class=20",
    "mnist5k.steps=[2, 3]",
    "mnist5k.test_digits=[8, 9]",
    "mnist5k.epochs=1",
    "synthetic.steps=[4, 6]",
    "synthetic.test_identities=3",
    "synthetic.images_per_class=4",
    "synthetic.image_size=8",
    "synthetic.epochs=1",
    "fct.width=16",
    "fct.epochs=2",
    "fct.batch_size=16",
    "fct.warmup_epochs=0",
    "fct.side_dim=4",
    "fct.side_epochs=1",
    "fct.random_orders=2",
]


def optim(cfg: FidelityConfig, name: str) -> Optim:
    """Protocol ``name``'s epochs, and its batch size and lr where it sets them, else the
    global ones; ``regime``: its own recipe and stopping rule (:meth:`RegimeSize.optim`)."""
    spec = getattr(cfg, name)
    if isinstance(spec, RegimeSpec):
        return spec.resolved().optim()
    return Optim(spec.epochs, spec.batch_size or cfg.batch_size, spec.lr or cfg.lr)


def groups(cfg: FidelityConfig, methods: dict) -> list[dict]:
    """``methods`` split by ``cfg.method_groups`` (in their order; empty groups dropped)."""
    named = [name for group in cfg.method_groups for name in group]
    unknown = sorted(set(named) - set(ENTRIES) - set(list_methods()))
    if unknown:
        raise ConfigError(f"method_groups: unknown {unknown}; valid: the methods' names")
    out = [
        {name: methods[name] for name in group if name in methods} for group in cfg.method_groups
    ] or [{}]
    out[-1].update({name: pair for name, pair in methods.items() if name not in named})
    return [group for group in out if group]


def entries(cfg: FidelityConfig) -> dict[str, tuple[str, str]]:
    """``{name: (training method, serving mode)}``; a registered method serves directly."""
    if not cfg.seeds:
        raise ConfigError("seeds: give at least one seed")
    valid = sorted(set(list_methods()) | set(ENTRIES))
    out = {}
    for name in cfg.methods:
        if name not in valid:
            raise ConfigError(f"methods: unknown {name!r}; valid: {', '.join(valid)}")
        out[name] = ENTRIES.get(name, (name, "direct"))
    for name in cfg.protocols:
        PROTOCOLS.get(name)
    return out


class SeedRun:
    """One protocol and seed: trains what the methods need, scores every evaluation set."""

    def __init__(
        self,
        protocol: Protocol,
        optim: Optim,
        cfg: FidelityConfig,
        seed: int,
        cache: Path | None = None,
    ):
        self.protocol, self.cfg, self.seed = protocol, cfg, seed
        self.trainer = SequenceTrainer(protocol.train, optim, seed, cfg.method_options, cache)
        self._features: dict[tuple[int, str], np.ndarray] = {}
        self._fits: dict[str, Transformations] = {}
        self._upper: dict[str, list[float]] = {}

    def queries(self, models, split_name: str) -> list[np.ndarray]:
        split = self.protocol.evals[split_name]
        for model in models:
            if (id(model), split_name) not in self._features:
                self._features[id(model), split_name] = features(model, split.images)
        return [self._features[id(m), split_name] for m in models]

    def upper_self_tests(self, split_name: str) -> list[float]:
        """M(t, t) of the independently trained models: the update gain's M(up, up)."""
        if split_name not in self._upper:
            labels = EvalSet(labels=self.protocol.evals[split_name].labels)
            queries = self.queries(self.trainer.sequence("independent"), split_name)
            self._upper[split_name] = [
                score("identification", q, q, labels, "cosine") for q in queries
            ]
        return self._upper[split_name]

    def method(self, training: str, mode: str, save: Path | None, name: str) -> dict:
        models = self.trainer.sequence(training)
        if mode != "direct" and training not in self._fits:
            self._fits[training] = Transformations(
                models, self.protocol.train, self.cfg.fct, self.seed
            )
        out = {}
        for split_name, split in self.protocol.evals.items():
            queries = self.queries(models, split_name)
            served, extra = COMPAT.get(mode)(
                queries, split.images, split.labels, self._fits.get(training)
            )
            metrics = run_metrics(served, self.upper_self_tests(split_name))
            if "backfill" in extra:
                extra["backfill_mean"] = combine(extra["backfill"], mean_leaf)
            if split.scores:  # beside 1:N top-1: verification, class-mean templates
                extra["scores"] = {
                    protocol: score_metrics(served, protocol, eval_set)
                    for protocol, eval_set in split.scores.items()
                }
            records = self.trainer.records(training)
            if records is not None:  # epochs run against the cap; curves kept apart
                extra["training"] = [
                    {k: v for k, v in r.items() if k != "val_top1"} for r in records
                ]
            out[split_name] = {**metrics, **extra}
            if save is not None:
                save_served(save / f"{split_name}_seed{self.seed}_{name}.npz", served)
        return out


def save_served(path: Path, served) -> None:
    """The features one matrix was computed from (``q{t}``, ``g{t}_{k}``, ``labels``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"q{t}": q for t, q in enumerate(served.queries)}
    arrays.update({f"g{t}_{k}": g for (t, k), g in served.galleries.items()})
    np.savez(path, labels=served.labels, **arrays)


def run_seed(
    name: str,
    cfg: FidelityConfig,
    methods: dict,
    save: Path | None,
    seed: int,
    cache: Path | None = None,
) -> dict:
    """One protocol and seed, start to end, for ``methods`` (a group of them): each method's
    numbers per evaluation set, the sets' descriptions and the task's timing. Runs in its own
    process when ``processes > 1``; ``cache``: the models shared with the seed's other groups."""
    torch.set_num_threads(cfg.threads)
    spec = getattr(cfg, name)
    start = time.perf_counter()
    protocol = PROTOCOLS.get(name)(spec, seed)
    seed_run = SeedRun(protocol, optim(cfg, name), cfg, seed, cache)
    numbers: dict[str, dict] = {}
    curves: dict[str, list] = {}
    for entry, (training, mode) in methods.items():
        where = None if save is None else save / name
        for split_name, values in seed_run.method(training, mode, where, entry).items():
            numbers.setdefault(split_name, {})[entry] = values
        records = seed_run.trainer.records(training)
        if records is not None:
            curves[entry] = [r["val_top1"] for r in records]
    seconds = time.perf_counter() - start
    log.info(
        "%s seed %d, %s: %.0f s (%d models trained, %d loaded)",
        name,
        seed,
        ", ".join(methods),
        seconds,
        seed_run.trainer.trained,
        seed_run.trainer.loaded,
    )
    return {
        "protocol": name,
        "seed": seed,
        "numbers": numbers,
        "curves": curves,
        "splits": {
            split_name: {
                "kind": split.kind,
                "description": split.description,
                "steps": list(protocol.train.steps),
            }
            for split_name, split in protocol.evals.items()
        },
        "timing": {
            "seed": seed,
            "methods": list(methods),
            "seconds": seconds,
            "models_trained": seed_run.trainer.trained,
            "models_loaded": seed_run.trainer.loaded,
            "training_seconds": seed_run.trainer.train_seconds,
            "machine": machine_info().get("cpu_model") or machine_info()["processor"],
        },
    }


class TaskRecords:
    """The finished tasks of a run, one JSON file each, so that a killed run resumes where it
    stopped and seeds can be added later (``--seeds 2 3 4`` with the same ``--out``): a task
    whose file is there, written under the same configuration, is read instead of run. The
    configuration a file was written under is everything but the seeds and the process layout,
    which do not change a task's numbers; a file of another configuration is refused."""

    LAYOUT = ("seeds", "processes", "threads")

    def __init__(self, folder: Path, cfg: FidelityConfig) -> None:
        self.folder = folder
        self.config = {k: v for k, v in to_dict(cfg).items() if k not in self.LAYOUT}

    NAME_BYTES = 200  # a file name stays under the 255 bytes of common file systems

    def path(self, name: str, seed: int, group: dict) -> Path:
        """``<protocol>-seed<seed>-<method>+<method>....json``; a group whose names would make
        it too long is named by its first method, its size and a digest of them all."""
        stem = f"{name}-seed{seed}-{'+'.join(group)}"
        if len(stem.encode()) > self.NAME_BYTES:
            digest = hashlib.sha256("+".join(group).encode()).hexdigest()[:16]
            stem = f"{name}-seed{seed}-{next(iter(group))}+{len(group) - 1}-more-{digest}"
        return self.folder / f"{stem}.json"

    def load(self, name: str, seed: int, group: dict) -> dict | None:
        path = self.path(name, seed, group)
        if not path.exists():
            return None
        record = json.loads(path.read_text())
        if record["config"] != self.config:
            raise ConfigError(
                f"{path}: a task of another configuration; give another --out or remove "
                f"{self.folder}"
            )
        log.info("%s seed %d, %s: read from %s", name, seed, ", ".join(group), path)
        result = record["result"]
        result["timing"]["read_from_file"] = True  # the report counts it apart from this run
        return result

    def write(self, name: str, seed: int, group: dict, result: dict) -> None:
        path = self.path(name, seed, group)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps({"config": self.config, "result": result}))
        partial.replace(path)


def run_seeds(
    cfg: FidelityConfig, methods: dict, save: Path | None, records: TaskRecords | None = None
) -> list[dict]:
    """Every (protocol, seed, method group) task, in ``cfg.processes`` processes of
    ``cfg.threads`` torch threads each (small convnets train faster as two 1-thread processes
    than as one 2-thread one). The first group's tasks are queued first, the longest protocol's
    seeds first, so the models the later groups share with it are usually trained by then. A
    task's numbers do not depend on which process ran it, when, or what it found in the cache;
    ``records``: tasks finished before are read, and each task is written as it finishes."""
    with tempfile.TemporaryDirectory(prefix="fidelity-models-") as cache:
        tasks = [
            (name, cfg, group, save, seed, Path(cache) / f"{name}-seed{seed}")
            for group in groups(cfg, methods)
            for name in cfg.protocols
            for seed in cfg.seeds
        ]
        done = {
            i: result
            for i, task in enumerate(tasks)
            if records is not None
            and (result := records.load(task[0], task[4], task[2])) is not None
        }
        todo = [i for i in range(len(tasks)) if i not in done]

        def finished(i: int, result: dict) -> None:
            done[i] = json.loads(json.dumps(result))  # as a rerun would read it back
            if records is not None:
                records.write(tasks[i][0], tasks[i][4], tasks[i][2], result)

        if cfg.processes == 1 or len(todo) <= 1:
            for i in todo:
                finished(i, run_seed(*tasks[i]))
            return [done[i] for i in range(len(tasks))]
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            min(cfg.processes, len(todo)),
            mp_context=context,
            initializer=_worker_init,
            initargs=(os.getpid(),),
        ) as pool:
            futures = {pool.submit(run_seed, *tasks[i]): i for i in todo}
            for future in as_completed(futures):
                finished(futures[future], future.result())
        return [done[i] for i in range(len(tasks))]


def _worker_init(parent: int) -> None:
    """A seed process logs like the parent and exits when the parent is gone (a killed run
    leaves no orphans training on)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def collect(done: list[dict], methods: dict) -> dict:
    """``{protocol/split: summary}`` from the tasks' results, seeds and methods in the config's
    order; each run gains ``kept`` (:func:`re_embedding_share`), derived here from its matrix
    so that the tasks' records stay what the tasks wrote."""
    out: dict[str, dict] = {}
    for pair in done:
        for split_name, meta in pair["splits"].items():
            key = f"{pair['protocol']}/{split_name}"
            split = out.setdefault(
                key,
                {
                    **meta,
                    "description": f"{pair['protocol']}: {meta['description']}",
                    "methods": {},
                },
            )
            for entry, values in pair["numbers"][split_name].items():
                split["methods"].setdefault(
                    entry,
                    {
                        "training_method": methods[entry][0],
                        "serving": methods[entry][1],
                        "runs": [],
                    },
                )["runs"].append({**values, "kept": re_embedding_share(values["matrix"])})
    for split in out.values():
        split["methods"] = {
            entry: split["methods"][entry] for entry in methods if entry in split["methods"]
        }  # the config's order, not the groups'
        for entry in split["methods"].values():
            entry["summary"] = combine(entry["runs"], summary_leaf)
    return out


def estimate(cfg: FidelityConfig, methods: dict) -> dict[str, float]:
    """Rough seconds per protocol, all seeds: the image passes the plan trains (counted with
    the same sharing, nothing trained) x one pass's measured cost here x :data:`OVERHEAD`."""
    out = {}
    for name in cfg.protocols:
        spec, plan = getattr(cfg, name), optim(cfg, name)
        protocol = PROTOCOLS.get(name)(spec, cfg.seeds[0])
        counter = PassCounter(protocol.train, plan, cfg.seeds[0])
        for training in ["independent"] + [training for training, _ in methods.values()]:
            counter.sequence(training)
        per_pass = seconds_per_pass(protocol.train, plan)
        out[name] = counter.passes * per_pass * OVERHEAD * len(cfg.seeds)
        log.info(
            "%s: %d models, %d image passes per seed, %.1f ms per pass: ~%.0f s",
            name,
            counter.trained,
            counter.passes,
            1000 * per_pass,
            out[name],
        )
    return out


def run(cfg: FidelityConfig, save: Path | None = None, records: TaskRecords | None = None) -> dict:
    torch.set_num_threads(cfg.threads)
    methods = entries(cfg)
    guess = estimate(cfg, methods)
    log.info(
        "estimated %.1f CPU-min, about %.1f min wall in %d processes",
        sum(guess.values()) / 60,
        sum(guess.values()) / 60 / cfg.processes,
        cfg.processes,
    )
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    done = run_seeds(cfg, methods, save, records)
    timing = {"estimated_s": guess, "protocols": {}}
    for pair in done:
        timing["protocols"].setdefault(pair["protocol"], []).append(pair["timing"])
    timing["measured_s"] = time.perf_counter() - start
    timing["cpu_s"] = _cpu_seconds() - cpu_start
    curves: dict[str, dict] = {}  # {protocol: {method: {seed: [per model: val top-1 per epoch]}}}
    for pair in done:
        for entry, per_model in pair["curves"].items():
            curves.setdefault(pair["protocol"], {}).setdefault(entry, {})[pair["seed"]] = per_model
    log.info(
        "measured %.1f min, %.1f CPU-min (estimated %.1f)",
        timing["measured_s"] / 60,
        timing["cpu_s"] / 60,
        sum(guess.values()) / 60,
    )
    return {
        "benchmark": "fidelity",
        "machine": machine_info(),
        "config": to_dict(cfg),
        "protocols": collect(done, methods),
        "training_curves": curves,
        "timing": timing,
    }


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the seed processes)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML file with FidelityConfig keys")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default 0 1 2 3 4)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for tests")
    parser.add_argument("--out", default="benchmarks/results/fidelity_cpu.json")
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--save-features", help="directory for the features of every matrix")
    parser.add_argument("--estimate", action="store_true", help="print the time estimate only")
    parser.add_argument(
        "--tasks", help="folder of the finished tasks, read on a rerun (default: OUT.tasks)"
    )
    parser.add_argument("overrides", nargs="*", help="key=value, e.g. mnist5k.epochs=2")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    overrides = (QUICK if args.quick else []) + list(args.overrides)
    if args.seeds:
        overrides.append(f"seeds={json.dumps(args.seeds)}")
    cfg = load_config(FidelityConfig, args.config, overrides)
    if args.estimate:
        torch.set_num_threads(cfg.threads)
        guess = estimate(cfg, entries(cfg))
        result = {
            "estimated_s": guess,
            "estimated_total_s": sum(guess.values()),
            "estimated_wall_s": sum(guess.values()) / cfg.processes,
        }
        emit(result, None)
        return result
    records = TaskRecords(Path(args.tasks or f"{args.out}.tasks"), cfg)
    result = run(cfg, Path(args.save_features) if args.save_features else None, records)
    emit(result, args.out)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown(result))
    return result


if __name__ == "__main__":
    main()
