"""What a training run says per epoch: a console line, and one line of ``metrics.jsonl``.

- Rank 0 logs :func:`epoch_line` at INFO after an epoch's report:
  ``synthetic-cl2r/step_2 epoch 3/10: ce=1.234 hoc=0.05 loss=1.284 | 812 img/s | ETA 95s``
  (the epoch counted from 1, the epoch's mean loss terms, the images per second of its
  training passes over all workers, and the time left at the mean pace of the epochs this
  attempt has run). Not after every epoch: through a :class:`~raycompat.progress.Ticker`,
  the first epoch's line, the line of an epoch that ends 10 s or more after the last line,
  and always the last epoch's (FCT's 30 transformation epochs of a few seconds in all: two
  lines); where the job's console is a terminal, a progress bar instead, drawn by the driver
  from Ray's ``tqdm_ray`` messages, and the last line. Everything an epoch measured goes to
  the run directory.
- :class:`MetricsLog`, a Ray Train callback on the controller, appends rank 0's full report of
  every epoch as one JSON line (plus ``"step"``: the Ray Train run it belongs to) to
  ``<run.storage_path>/<run.name>/metrics.jsonl``, through the run's filesystem (local or S3).
  An epoch retrained after a failure appears again: the later line is the one kept.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping

import ray.train
from ray.experimental import tqdm_ray

from raycompat.io import run_storage as storage
from raycompat.progress import Ticker

METRICS_FILE = "metrics.jsonl"


def epoch_line(
    name: str,
    epoch: int,
    epochs: int,
    terms: Mapping[str, float],
    images_per_s: float,
    eta_s: float,
) -> str:
    """``<name> epoch E/N: <term>=<value> ... loss=<value> | X img/s | ETA Ns``.

    ``epoch`` counts from 0 (as in checkpoints) and is shown from 1; ``terms`` are the epoch's
    mean loss terms, ``loss`` (their weighted total) shown last.
    """
    ordered = [k for k in terms if k != "loss"] + (["loss"] if "loss" in terms else [])
    values = " ".join(f"{k}={terms[k]:.4g}" for k in ordered)
    return (
        f"{name} epoch {epoch + 1}/{epochs}: {values} | {images_per_s:.0f} img/s | ETA {eta_s:.0f}s"
    )


class EpochClock:
    """Wall time per epoch of this attempt, for the ETA: from ``first`` (the epoch it started
    or resumed at) to ``epochs``."""

    def __init__(self, first: int, epochs: int) -> None:
        self.first, self.epochs, self.start = first, epochs, time.perf_counter()

    def eta_s(self, epoch: int) -> float:
        """Seconds left after ``epoch`` (0-based) has finished."""
        done = epoch + 1 - self.first
        per_epoch = (time.perf_counter() - self.start) / max(done, 1)
        return per_epoch * max(self.epochs - epoch - 1, 0)


def epoch_ticker(logger: logging.Logger, name: str, epochs: int, rank: int) -> Ticker:
    """The console of a run's ``epochs`` epochs left: rank 0's bar where the job's console is
    a terminal (Ray's ``tqdm_ray``: a worker's bar is drawn by the driver); lines elsewhere."""
    return Ticker(logger, epochs, name, unit="epoch", bar=tqdm_ray.tqdm if rank == 0 else None)


def epoch_status(name: str, terms: Mapping[str, float]) -> str:
    """The bar's label: ``<name> loss=<value>``, the epoch's total loss (``h_loss`` of
    FastFill's h) and ``val`` where a plateau rule watches it; every term where none is a
    total (FCT's ``h_mse``). The last epoch's line has them all."""
    keys = [k for k in terms if k == "loss" or k.endswith("_loss") or k == "val"] or list(terms)
    shown = " ".join(f"{k}={terms[k]:.4g}" for k in keys)
    return f"{name} {shown}".rstrip()


def log_epoch(ticker: Ticker, name, epoch, epochs, terms, metrics, clock, last: bool) -> None:
    """Rank 0's :func:`epoch_line` after ``epoch`` through ``ticker`` (``last``: the run ends
    with it), its rate the epoch's ``images_per_s`` and its ETA from ``clock``."""
    line = epoch_line(name, epoch, epochs, terms, metrics["images_per_s"], clock.eta_s(epoch))
    ticker.step(line, last=last, status=epoch_status(name, terms))


def images_per_s(images: int, seconds: float) -> float:
    """Throughput of an epoch's training passes (0 for an epoch that trained nothing)."""
    return images / seconds if images and seconds > 0 else 0.0


class MetricsLog(ray.train.UserCallback):
    """Ray Train callback (runs on the controller): rank 0's report of every epoch as one JSON
    line of ``path`` (``<run path>/metrics.jsonl``), tagged with ``step``."""

    def __init__(self, fs, path: str, step: str) -> None:
        self.fs, self.path, self.step = fs, path, step

    def after_report(self, run_context, metrics: list[dict], checkpoint) -> None:
        if metrics:
            line = json.dumps({"step": self.step, **metrics[0]}, default=float)
            storage.append_line(self.fs, self.path, line)
