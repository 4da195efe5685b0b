"""Where an upgrade run's numbers fall in the committed multi-seed range (issue 25).

``benchmarks/fidelity.py`` trains every method on several seeds under the demo's protocol and
commits the spread (``benchmarks/results/fidelity_cpu.json``, docs/fidelity.md). A single run
of the demo says little on its own; this module lines up the cells of the run that have an
exact counterpart in the benchmark and says, for each, whether it falls inside the 95%
prediction interval of the committed seeds (``m ± t s sqrt(1 + 1/n)``,
:func:`~raycompat.metrics.intervals.prediction_interval`): where one more run like the seeds
lands 19 times in 20. The seeds' ``[min, max]`` is shown beside it but is not the test: a new
run falls outside five seeds' range one time in three.

A cell has a counterpart only when the run used the benchmark's protocol (same data, steps,
open-set digits, epochs, batch, learning rate and head) and the model pair is one the benchmark
trains the same way: every candidate scored against the first model of the history (the
benchmark's shared first model), with the candidate's own training method (FCT trains its model
independently); and each baseline likewise. Cells of later pairs (a model trained against a
refused one, FCT's ``h`` across two versions) are not comparable and are not shown.
Ray-free: the job calls :func:`committed_lines` after its report is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raycompat.metrics.intervals import prediction_interval

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fidelity_cpu.json"
# The training method the benchmark names a model by (FCT's new model is trained independently).
TRAINED_AS = {"fct": "independent"}
CELLS = (("cross", "M({new}, {old})", 1, 0), ("old_self", "M({old}, {old})", 0, 0),
         ("new_self", "M({new}, {new})", 1, 1))


@dataclass(frozen=True)
class Comparison:
    """One cell of the run and the benchmark's seeds for it (percent): ``low``, ``high`` the
    95% prediction interval of one more run, ``seeds_min``, ``seeds_max`` the seeds' range."""

    label: str
    method: str
    value: float
    low: float
    high: float
    mean: float
    seeds: int
    seeds_min: float
    seeds_max: float

    @property
    def inside(self) -> bool:
        return self.low <= self.value <= self.high

    def line(self) -> str:
        where = "inside" if self.inside else ("below" if self.value < self.low else "above")
        return (f"{self.label} = {self.value:.2f}: {where} the 95% prediction interval "
                f"[{self.low:.2f}, {self.high:.2f}] of {self.seeds} seeds (mean {self.mean:.2f}, "
                f"seeds {self.seeds_min:.2f}-{self.seeds_max:.2f}; {self.method})")


def protocol_key(cfg) -> str | None:
    """The benchmark protocol the upgrade config ran (``"mnist5k/open_set"``), or None when it
    differs from every committed one in anything that moves the numbers."""
    t = cfg.training
    steps = [u.classes for u in cfg.upgrades]
    same = (
        t.data.name == "mnist5k" and t.eval.split == "open_set"
        and list(t.eval.test_classes or []) == [7, 8, 9] and steps == [5, 6, 7]
        and t.epochs == 2 and t.batch_size == 64 and t.optim.name == "adam"
        and abs(t.optim.lr - 2e-3) < 1e-12 and t.model.backbone == "lenetpp"
        and t.model.head == "dsimplex" and t.model.num_classes == 10
    )
    return "mnist5k/open_set" if same else None


def compare(outcomes, cfg, results: dict) -> list[Comparison]:
    """Every comparable cell of ``outcomes`` (the run's :class:`~raycompat.upgrade.report.Outcome`
    list) against ``results`` (the benchmark's JSON)."""
    key = protocol_key(cfg)
    split = results.get("protocols", {}).get(key) if key else None
    if split is None or not outcomes:
        return []
    first = cfg.upgrades[0].model_version
    position = {u.model_version: i for i, u in enumerate(cfg.upgrades)}
    out = []
    for outcome in outcomes:
        direct = (outcome.evidence or {}).get("direct")
        if not direct or direct.get("against") != first:
            continue
        t = position.get(outcome.model_version)
        runs = {outcome.model_version: (TRAINED_AS.get(outcome.method, outcome.method), direct)}
        for method, evidence in (outcome.baselines or {}).items():
            if method in split["methods"]:
                runs[f"{method} ({outcome.model_version}'s baseline)"] = (method, evidence)
        for name, (method, evidence) in runs.items():
            out += _cells(split["methods"].get(method), method, name, first, t, evidence)
    return out


def _cells(entry, method, new, old, t, evidence) -> list[Comparison]:
    if entry is None or t is None:
        return []
    matrix = entry["summary"]["matrix"]
    out = []
    for field, label, row, col in CELLS:
        cell = matrix[t * row][t * col]
        if cell is None or evidence.get(field) is None:
            continue
        interval = prediction_interval(cell["mean"], cell["sd"], cell["n"])
        if interval is None:  # one seed: nothing to say where another run lands
            continue
        low, high = max(interval[0], 0.0), min(interval[1], 100.0)  # a score is a percentage
        out.append(Comparison(label.format(new=new, old=old), method, 100.0 * evidence[field],
                              low, high, cell["mean"], cell["n"], cell["min"], cell["max"]))
    return out


def committed_lines(outcomes, cfg, path: Path = RESULTS) -> list[str]:
    """The lines the job prints: one per comparable cell, or one saying why there are none."""
    if not path.exists():
        return [f"no committed multi-seed range to compare with ({path} is not here)"]
    results = json.loads(path.read_text())
    seeds = results.get("config", {}).get("seeds", [])
    if protocol_key(cfg) is None:
        return ["no committed multi-seed range for this config's protocol (the benchmark "
                "covers the embedded MNIST-5k open-set history; docs/fidelity.md)"]
    head = (f"this run against the committed results of {len(seeds)} seeds "
            f"({path.name}, mnist5k/open_set):")
    return [head] + [c.line() for c in compare(outcomes, cfg, results)]
