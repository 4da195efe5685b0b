"""What a sweep leaves behind: a table of every trial, the best config as a ready YAML, and a
compatibility-vs-accuracy plot with the Pareto front marked."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.fs as pafs

from raycompat.cluster.tune.fct import backfill_of, split_params, transformation_of
from raycompat.cluster.tune.space import trial_overrides
from raycompat.config import load_config, save_config
from raycompat.config.fct import FCTSpec
from raycompat.config.train import TrainConfig
from raycompat.config.tune import SweepConfig
from raycompat.io.credentials import save_private_figure, scrub, write_private

logger = logging.getLogger(__name__)

METRICS = ("objective", "AC", "AA", "ACA", "self_test", "cross_test", "old_self_test")
FCT_METRICS = ("stored_cross_test",)  # FCT sweeps: M(T, T-1) before h
BACKFILL_METRICS = (  # FCT sweeps with a backfill section (tune.fct.backfill_metrics)
    "backfill_auc",
    "backfill_auc_mean_ap",
    "backfill_top1_at_budget",
    "backfill_budget_for_target",
    "backfill_random_auc",
)


def trial_table(results, sweep: SweepConfig) -> pd.DataFrame:
    """One row per trial: its parameters, status and final validation metrics."""
    rows = []
    for result in results:
        metrics = result.metrics or {}
        final = bool(metrics.get("final"))
        status = "ERROR" if result.error else ("TERMINATED" if final else "STOPPED")
        row = {"trial": Path(result.path).name if result.path else None, "status": status}
        row.update({f"param:{s.key}": result.config.get(s.key) for s in sweep.space})
        row.update({m: metrics.get(m) if final else None for m in METRICS})
        if sweep.transformation is not None:
            row.update({m: metrics.get(m) if final else None for m in FCT_METRICS})
        if sweep.backfill is not None:
            row.update({m: metrics.get(m) if final else None for m in BACKFILL_METRICS})
        row["error"] = scrub(error_line(result.error)) if result.error else None
        row["run_path"] = metrics.get("run_path") if final else None
        rows.append(row)
    return pd.DataFrame(rows)


def error_line(error: BaseException) -> str:
    """The exception's own message: the last line of Ray's wrapped traceback."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(error).__name__


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Boolean mask of points no other point beats in both ``x`` and ``y`` (both maximised)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    mask = np.ones(len(x), dtype=bool)
    for i in range(len(x)):
        dominated = (x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))
        mask[i] = not dominated.any()
    return mask


def best_params(table: pd.DataFrame, sweep: SweepConfig) -> dict | None:
    done = table[table["status"] == "TERMINATED"].dropna(subset=["objective"])
    if done.empty:
        return None
    best = done.loc[done["objective"].idxmax()]
    return {s.key: _plain(best[f"param:{s.key}"]) for s in sweep.space}


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def write_best_config(sweep: SweepConfig, params: dict, path: Path) -> TrainConfig:
    training = trial_overrides(split_params(params)[0])
    cfg = load_config(TrainConfig, sweep.base, [*sweep.overrides, *training])
    # A searched run.inject_failure (the fault-injection test hook) says how the trial ran, not
    # what it trained: the best config must train without it.
    run = dataclasses.replace(cfg.run, name=f"{sweep.name}-best", inject_failure=None)
    cfg = dataclasses.replace(cfg, run=run)
    chosen = ", ".join(f"{k}={v}" for k, v in params.items())
    save_config(
        cfg,
        path,
        header=f"# Run: python jobs/train.py --config {path}\n"
        f"# Best trial of sweep {sweep.name!r} by {sweep.objective} ({chosen}).\n",
    )
    fct = transformation_of(sweep, params)
    write_best_upgrade(
        cfg, fct, chosen, sweep, path.with_name("best_upgrade.yaml"), backfill_of(sweep, params)
    )
    return cfg


def write_best_upgrade(
    cfg: TrainConfig,
    fct: FCTSpec | None,
    chosen: str,
    sweep: SweepConfig,
    path: Path,
    backfill=None,
) -> None:
    """The best trial as a ready ``jobs/upgrade.py`` config (its scenario as a history, FCT
    upgrades with the trial's transformation and, from a backfill sweep, its partial
    backfill)."""
    from raycompat.config.upgrade import history_from_training
    from raycompat.methods.catalog import method_entry

    try:
        upgrade = history_from_training(cfg, f"{sweep.name}-best", fct=fct)
    except ValueError as err:  # e.g. model replacements: no history equivalent
        logger.warning("no best_upgrade.yaml for sweep %s: %s", sweep.name, err)
        return
    for entry in upgrade.upgrades[1:]:
        if backfill is not None and method_entry(entry.method).needs_transformation:
            entry.partial_backfill = dataclasses.replace(backfill)
    save_config(
        upgrade,
        path,
        header=f"# Run: python jobs/upgrade.py --config {path}\n"
        f"# Best trial of sweep {sweep.name!r} by {sweep.objective} ({chosen}), as an upgrade "
        "history.\n",
    )


def plot_tradeoff(table: pd.DataFrame, path: Path, x: str = "AC", y: str = "AA") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = table.dropna(subset=[x, y])
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    if not done.empty:
        front = pareto_front(done[x].to_numpy(), done[y].to_numpy())
        ax.scatter(done[x][~front], done[y][~front], color="0.6", label="trial")
        order = np.argsort(done[x].to_numpy()[front])
        ax.plot(
            done[x].to_numpy()[front][order],
            done[y].to_numpy()[front][order],
            "o-",
            color="tab:red",
            label="Pareto front",
        )
        for _, row in done.iterrows():
            ax.annotate(row["trial"][-5:] if row["trial"] else "", (row[x], row[y]), fontsize=6)
        ax.legend()
    else:  # a sweep scored on another objective: an empty plot says so (legend() would warn)
        ax.text(0.5, 0.5, f"no trial reported {x} and {y}", ha="center", transform=ax.transAxes)
    ax.set_xlabel(f"{x} (compatibility, validation)")
    ax.set_ylabel(f"{y} (accuracy, validation)")
    fig.tight_layout()
    save_private_figure(fig, path)
    plt.close(fig)


def write_outputs(results, sweep: SweepConfig, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    table = trial_table(results, sweep)
    # The table names every trial's run path: private, as the configs are.
    write_private(out / "trials.csv", table.to_csv(index=False))
    write_private(out / "trials.parquet", table.to_parquet(index=False))
    plot_tradeoff(table, out / "tradeoff.png")
    params = best_params(table, sweep)
    if params is not None:
        write_best_config(sweep, params, out / "best_config.yaml")
    counts = table["status"].value_counts().to_dict()
    return {"trials": len(table), "status": counts, "best": params, "output_dir": str(out)}


def publish_outputs(results, sweep: SweepConfig) -> dict:
    """Write the outputs into ``<storage_path>/<name>/results`` (through a local temporary
    folder, uploaded, when the sweep lives on S3)."""
    from raycompat.cluster.tune.sweep import is_remote, sweep_path, sweep_storage

    if not is_remote(sweep):
        return write_outputs(results, sweep, Path(sweep_path(sweep)) / "results")
    fs, base = sweep_storage(sweep)
    destination = f"{base}/{sweep.name}/results"
    with tempfile.TemporaryDirectory() as tmp:
        summary = write_outputs(results, sweep, Path(tmp))
        fs.create_dir(destination, recursive=True)
        pafs.copy_files(
            tmp, destination, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs
        )
    return {**summary, "output_dir": f"{sweep_path(sweep)}/results"}
