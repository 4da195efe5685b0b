"""The upgrade report: JSON, a heatmap, 2-D feature plots and a ``report.md`` (no Ray).

``write_report(directory, report)`` renders a :class:`Report` that the job filled in:
the history's compatibility matrix (rows query models, columns gallery models; cells that fail
ECC, M(t, k) <= M(k, k), are marked), AC/AA/ACA, one self/cross table per upgrade with its
baselines beside it (as the papers' tables) and its negative flips, for FCT upgrades whose
``h`` learned its uncertainty the partial-backfill curves (FastFill: accuracy against the
fraction of the gallery re-extracted, three orders), the decision and why, what was published,
and the timings of every stage.

One number per quantity: every score is shown in percent of the test queries, each matrix cell
is the number the decision used (the job scores the same arrays), and a score that is another
quantity says so in its label (a stored version that is not the model's own features, the
gallery model's classes only, a partial backfill on the test images).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from raycompat.config import dump_config
from raycompat.io.credentials import save_private_figure, write_private
from raycompat.metrics.compatibility import (
    CompatibilityMatrix,
    average_accuracy,
    average_compatibility,
    average_compatibility_accuracy,
)
from raycompat.upgrade.policy import SERVED


@dataclass
class Outcome:
    """One entry of the history: what was trained, what the evidence said, what was done."""

    model_version: str
    method: str
    classes: int
    action: str
    reason: str
    against: str | None = None  # the gallery model it was compared with
    gallery_version: str | None = None  # the version it may query (None if refused)
    evidence: dict = field(default_factory=dict)  # "direct" and, for FCT, "transformed"
    baselines: dict = field(default_factory=dict)  # method -> direct evidence
    seconds: dict = field(default_factory=dict)  # stage -> wall seconds
    resumed: bool = False  # already published by an earlier run: nothing done this time
    # FCT with an uncertain h: the backfill curves on the test images
    # (raycompat.upgrade.backfill_eval.backfill_evaluation); empty otherwise
    backfill: dict = field(default_factory=dict)


@dataclass
class Report:
    name: str
    protocol: str
    matrix: CompatibilityMatrix
    outcomes: list[Outcome]
    versions: list[dict]  # the gallery's versions after the run (raycompat versions)
    seconds: float = 0.0
    split: str = ""  # which images the tables use (closed- or open-set), one sentence

    def summary(self) -> dict:
        """Scores as fractions of the test queries (report.md shows them in percent); the
        matrix's cells above the diagonal were never measured: null."""
        n = len(self.matrix)
        matrix = [[float(v) for v in row] + [None] * (n - len(row)) for row in self.matrix.rows]
        out = {
            "name": self.name,
            "protocol": self.protocol,
            "split": self.split,
            "unit": "fraction",
            "matrix": matrix,
            "names": self.matrix.names,
            "decisions": {o.model_version: o.action for o in self.outcomes},
            "negative_flips": {
                o.model_version: dict(zip(FLIP_KEYS, flips, strict=True))
                for o in self.outcomes
                if (flips := served_flips(o)) is not None
            },
            "seconds": round(self.seconds, 1),
        }
        if len(self.matrix) > 1:
            out.update(
                AC=average_compatibility(self.matrix),
                AA=average_accuracy(self.matrix),
                ACA=average_compatibility_accuracy(self.matrix),
            )
        return out


FLIP_KEYS = ("negative_flip_rate", "negative_flip_rate_of_old_hits")


def served_flips(o: Outcome) -> tuple[float | None, float | None] | None:
    """``(NFR, NFR of old hits)`` of the gallery ``o``'s action serves the candidate
    (:data:`raycompat.upgrade.policy.SERVED`); for a refusal or failure, of the path it was
    judged on (h(gallery) for FCT, else the stored gallery). None without that evidence (the
    initial model, a record written before flips were counted)."""
    if not o.evidence:
        return None
    action = o.action
    if action not in SERVED:  # a refusal: the path it was judged on
        judged = {"transformed": "transform", "adapted": "adapt"}
        action = next((a for key, a in judged.items() if key in o.evidence), "compatible")
    which, field = SERVED[action]
    if which not in o.evidence or field not in o.evidence[which]:
        return None
    e = o.evidence[which]
    return e[field], e[f"{field}_of_old_hits"]


def _flips_cell(nfr: float | None, of_old_hits: float | None) -> str:
    """``NFR (NFR of old hits)`` in percent; ``-`` when not measured."""
    return "-" if nfr is None else f"{_pct(nfr)} ({_pct(of_old_hits)})"


def compatible_cells(array: np.ndarray) -> np.ndarray:
    """``ok[t, k]`` for ``k < t``: M(t, k) > M(k, k) (strict ECC); diagonal and upper are True."""
    ok = np.ones_like(array, dtype=bool)
    for t in range(len(array)):
        for k in range(t):
            ok[t, k] = bool(array[t, k] > array[k, k])
    return ok


def plot_matrix(matrix: CompatibilityMatrix, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    array = matrix.as_array()
    ok = compatible_cells(array)
    n = len(array)
    masked = np.ma.masked_where(np.triu(np.ones((n, n), bool), 1), array)
    fig, ax = plt.subplots(figsize=(1.3 * n + 2.2, 1.1 * n + 1.6))
    image = ax.imshow(masked, cmap="viridis", vmin=0.0, vmax=1.0)
    for t in range(n):
        for k in range(t + 1):
            label = f"{array[t, k] * 100:.1f}" + ("" if ok[t, k] else "\n✗ ECC")
            ax.text(
                k,
                t,
                label,
                ha="center",
                va="center",
                fontsize=9,
                color="white" if array[t, k] < 0.6 else "black",
            )
            if not ok[t, k]:
                ax.add_patch(
                    plt.Rectangle(
                        (k - 0.5, t - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5
                    )
                )
    ax.set_xticks(range(n), matrix.names, rotation=30)
    ax.set_yticks(range(n), matrix.names)
    ax.set_xlabel("gallery model")
    ax.set_ylabel("query model")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    save_private_figure(fig, path)
    plt.close(fig)


def plot_features_2d(features: np.ndarray, labels: np.ndarray, path: Path, title: str) -> None:
    """Scatter of 2-D features coloured by class (CoReS Fig. 7 style)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    colors = plt.get_cmap("tab10")
    for c in np.unique(labels):
        pts = features[labels == c]
        ax.scatter(pts[:, 0], pts[:, 1], s=3, color=colors(int(c) % 10), label=str(c), alpha=0.6)
    ax.set_aspect("equal")
    ax.set_title(title)
    ax.legend(markerscale=4, fontsize=7, loc="upper left")
    fig.tight_layout()
    save_private_figure(fig, path)
    plt.close(fig)


BACKFILL_ORDERS = {  # order -> (name, line style), drawn in reverse so FastFill's is on top
    "uncertainty": ("uncertainty (FastFill)", {"color": "tab:blue", "linewidth": 2}),
    "random": ("random", {"color": "tab:gray", "linestyle": ":"}),
    "oracle": ("oracle (true error)", {"color": "tab:green", "linestyle": "--"}),
}


def plot_backfill(backfill: dict, path: Path, title: str) -> None:
    """Top-1 and mAP against the fraction backfilled, one line per order (FastFill Fig. 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = np.asarray(backfill["fractions"]) * 100
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, metric, label in zip(axes, ("top1", "mean_ap"), ("top-1 (%)", "mAP (%)"), strict=True):
        for order, (name, style) in reversed(BACKFILL_ORDERS.items()):
            values = np.asarray(backfill["curves"][order][metric]) * 100
            ax.plot(fractions, values, marker="o", markersize=3, label=name, **style)
        budget = backfill["budget"] * 100
        ax.axvline(budget, color="black", linewidth=0.8, label=f"budget {budget:.0f}%")
        ax.set_xlabel("gallery backfilled (%)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_private_figure(fig, path)
    plt.close(fig)


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.2f}"


def _evidence_row(label: str, e: dict) -> str:
    gain = "-" if e.get("update_gain") is None else f"{e['update_gain']:.3f}"
    # evidence recorded before flips were counted has no such keys: "-"
    served = _flips_cell(e.get("negative_flip_rate"), e.get("negative_flip_rate_of_old_hits"))
    backfilled = _flips_cell(
        e.get("backfill_negative_flip_rate"), e.get("backfill_negative_flip_rate_of_old_hits")
    )
    return (
        f"| {label} | {_pct(e['old_self'])} | {_pct(e['cross'])} | {_pct(e['new_self'])} | "
        f"{'yes' if e['ecc'] else '**no**'} | {gain} | {served} | {backfilled} |"
    )


def _table(header: list[str], rows: list[str]) -> list[str]:
    """A Markdown table: ``header`` cells, then ``rows`` (each already a ``| ... |`` line)."""
    return ["| " + " | ".join(header) + " |", "| --- |" + " --- |" * (len(header) - 1), *rows]


def markdown(report: Report, files: dict[str, str]) -> str:
    """``report.md``: one section after another (``files``: kind -> file name, as written by
    :func:`write_report`)."""
    sections = (
        _header(report),
        _decisions_section(report),
        _matrix_section(report, files),
        _evidence_sections(report),
        _backfill_sections(report, files),
        _versions_section(report),
        _timings_section(report),
        _features_section(files),
    )
    return "\n".join(line for section in sections for line in section) + "\n"


def _header(report: Report) -> list[str]:
    lines = [f"# Upgrade report: {report.name}", ""]
    if report.split:
        lines += [f"Test images: {report.split}. Every table below uses them.", ""]
    return lines + [
        f"Protocol: {report.protocol} (top-1 %, rows: query model, columns: gallery model; "
        "✗ marks cells that fail ECC, M(t, k) <= M(k, k)). Wall time "
        f"{report.seconds:.0f} s.",
        "",
    ]


def _decisions_section(report: Report) -> list[str]:
    """What each entry of the history did, and why (resumed entries say by whom)."""
    rows = []
    for o in report.outcomes:
        earlier = "decided" if o.action in ("refuse", "failed") else "published"
        note = f" ({earlier} by an earlier run)" if o.resumed else ""
        flips = _flips_cell(*(served_flips(o) or (None, None)))
        rows.append(
            f"| {o.model_version} | {o.method} | {o.classes} | **{o.action}**{note} | "
            f"{o.gallery_version or '-'} | {flips} | {o.reason} |"
        )
    header = ["model", "method", "classes", "action", "queries", "NFR (of old hits)", "why"]
    note = (
        "NFR: the share of the test queries (%) that the old system, the gallery model's "
        "queries against its gallery, answered right at top-1 and the candidate answers wrong "
        "on the gallery the action serves it (for a refusal: the one it was judged on); in "
        "brackets, the same share of the queries the old system answered right."
    )
    return ["## Decisions", "", *_table(header, rows), "", note, ""]


def _matrix_section(report: Report, files: dict[str, str]) -> list[str]:
    """The lower triangle of M (top-1 %, ✗ where ECC fails), then AC/AA/ACA and the heatmap."""
    matrix, array = report.matrix, report.matrix.as_array()
    ok = compatible_cells(array)
    rows = []
    for t, name in enumerate(matrix.names):
        cells = [
            (f"{array[t, k] * 100:.2f}" + ("" if ok[t, k] else " ✗")) if k <= t else ""
            for k in range(len(matrix.names))
        ]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    lines = ["## Compatibility matrix", "", *_table(["query \\ gallery", *matrix.names], rows)]
    summary = report.summary()
    if "AC" in summary:
        lines += [
            "",
            f"AC = {summary['AC']:.3f}, AA = {summary['AA'] * 100:.2f}, "
            f"ACA = {summary['ACA'] * 100:.2f} (over the {len(matrix)} models above).",
        ]
    return lines + ["", f"![compatibility matrix]({files['matrix']})", ""]


def _evidence_sections(report: Report) -> list[str]:
    """One self/cross table per judged upgrade: the candidate, then its baselines."""
    lines = [
        "## Self- and cross-tests per upgrade",
        "",
        "M(old, old): the gallery model's self-test; M(new, old): the new model's queries "
        "against the gallery it would search; M(new, new): its self-test. NFR (%, of all test "
        "queries; in brackets, of those the old system answered right): what the old system "
        "(old queries, its gallery) answered right at top-1 and the new model's queries answer "
        "wrong, against the gallery of the M(new, old) column, and after a full backfill "
        "(its own re-extracted gallery, the M(new, new) column). Baselines are "
        "trained on the same data for comparison and never published.",
        "",
    ]
    header = [
        "model",
        "M(old, old)",
        "M(new, old)",
        "M(new, new)",
        "ECC",
        "update gain",
        "NFR (of old hits)",
        "NFR after backfill",
    ]
    for o in report.outcomes:
        if o.evidence:
            title = f"### {o.model_version} ({o.method}) against {o.against}"
            lines += [title, "", *_table(header, _evidence_rows(o)), ""]
    return lines


def _evidence_rows(o: Outcome) -> list[str]:
    candidate = f"{o.model_version} ({o.method})"
    direct = o.evidence["direct"]
    rows = [_evidence_row(f"{candidate}, {_stored_label(direct)}", direct)]
    if "seen_classes" in o.evidence:
        seen = o.evidence["seen_classes"]
        rows.append(_evidence_row(f"{candidate}, classes < {seen['classes']} only", seen))
    if "transformed" in o.evidence:
        rows.append(_evidence_row(f"{candidate}, h(gallery)", o.evidence["transformed"]))
    if "adapted" in o.evidence:  # procrustes, affine, adapter: the queries through the map
        a = o.evidence["adapted"]
        residual = a.get("relative_residual")
        fit = f"{a['kind']} map on {a['pairs']} pairs" + (
            f", relative residual {residual:.4f}" if residual is not None else ""
        )
        rows.append(_evidence_row(f"{candidate} through its {fit}, stored gallery", a))
    if "backfilled" in o.evidence:
        label = f"{candidate}, h(gallery) partially backfilled{_budget_label(o)}, test images"
        rows.append(_evidence_row(label, o.evidence["backfilled"]))
    return rows + [_evidence_row(f"baseline: {method}", e) for method, e in o.baselines.items()]


def _stored_label(e: dict) -> str:
    """The gallery the direct row is against: named by version when its rows are not the
    gallery model's own features (then M(old, old) is the old model against those rows)."""
    version = e.get("gallery")  # absent from evidence recorded before it was kept
    return (
        f"stored gallery {version} (not {e['against']}'s own features)"
        if version
        else ("stored gallery")
    )


def _budget_label(o: Outcome) -> str:
    if not o.backfill:
        return ""
    return f" ({o.backfill['budget']:.0%}, {o.backfill['order']} order)"


def _versions_section(report: Report) -> list[str]:
    rows = [
        f"| {v['version']} | {v['model_version']} | {v['rows']} | {v['lineage']} | "
        f"{', '.join(v['queried_by'])} |"
        for v in report.versions
    ]
    header = ["version", "model", "rows", "lineage", "queried by"]
    return ["## Gallery versions", "", *_table(header, rows), ""]


def _timings_section(report: Report) -> list[str]:
    """Wall seconds of each stage per entry (``-``: the stage did not run)."""
    rows = [
        f"| {o.model_version} | "
        + " | ".join(f"{o.seconds[s]:.1f}" if s in o.seconds else "-" for s in STAGES)
        + " |"
        for o in report.outcomes
    ]
    return ["## Timings (s)", "", *_table(["model", *STAGES], rows)]


def _features_section(files: dict[str, str]) -> list[str]:
    plots = [f for k, f in files.items() if k.startswith("features_")]
    return ["", "## 2-D features", ""] + [f"![{p}]({p})" for p in plots] if plots else []


STAGES = ("train", "baselines", "evaluate", "fct", "publish")
# Why the oracle can lose to random on top-1: measured in docs/backfill.md, "Why an order loses".
ORACLE_NOTE = (
    "The oracle is not the best order for top-1: a row's transformation error is not whether "
    "re-extracting it changes a top-1 answer. A re-extracted row lies nearer to the new "
    "model's queries than the h(old) rows around it and takes over the answers of nearby "
    "queries of any class; the rows h maps worst crowd into a few classes, whose re-extracted "
    "rows then capture the queries of classes that got none. So the oracle can score below "
    'random on top-1 while it beats random on mAP (docs/backfill.md, "Why an order loses").'
)


def _backfill_sections(report: Report, files: dict[str, str]) -> list[str]:
    """One "Partial backfill" table and plot per FCT upgrade whose h learned its uncertainty."""
    outcomes = [o for o in report.outcomes if o.backfill]
    if not outcomes:
        return []
    lines = [
        "## Partial backfill",
        "",
        f"On the test images ({report.split or 'the test split'}): the new model's queries "
        "against its gallery of the same images (identification, the query excluded by "
        "index) holding h(old) with a fraction re-extracted by the new model, in three orders: "
        "FastFill's (the rows h is least sure of first), random (the mean over a few "
        "seeds) and the oracle (the largest true error first, which needs the new features "
        "it would save). AUC: area under the curve over [0, 1]; at 0% it is M(new, h(old)), "
        "at 100% M(new, new). Here the budget is spent on the test images alone; the version "
        "the job writes spends it over the whole gallery, so its check (the decision row) can "
        "land elsewhere on the curve.",
        "",
        ORACLE_NOTE,
        "",
    ]
    names = [(order, name) for order, (name, _) in BACKFILL_ORDERS.items()]
    for o in outcomes:
        b = o.backfill
        seeds = ", ".join(map(str, b["random_seeds"]))
        header = [
            "order",
            "AUC top-1",
            "AUC mAP",
            f"top-1 at {b['budget']:.0%}",
            f"budget for {b['target']:.0%} of new/new top-1",
        ]
        lines += [
            f"### {o.model_version} ({o.method}): budget {b['budget']:.0%}, {b['order']} order",
            "",
            f"Random order: the mean over seeds {seeds}.",
            "",
            *_table(header, [_backfill_row(name, b["summary"][order]) for order, name in names]),
        ]
        key = f"backfill_{o.model_version}"
        lines += ["", f"![partial backfill of {o.model_version}]({files[key]})", ""]
    return lines


def _backfill_row(name: str, row: dict) -> str:
    need = row["budget_for_target"]
    return (
        f"| {name} | {_pct(row['auc_top1'])} | {_pct(row['auc_mean_ap'])} | "
        f"{_pct(row['top1_at_budget'])} | {'-' if need is None else f'{need:.0%}'} |"
    )


def write_report(
    directory: str | Path,
    report: Report,
    config: dict,
    features_2d: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> dict:
    """Write everything under ``directory``; returns ``{kind: file name}``.

    ``config`` (the merged job config) is written with its credentials redacted, and every
    file (text and PNG) with mode 0600: they name the store, the runs and the work folders.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "config": "config.yaml",
        "matrix_json": "matrix.json",
        "matrix": "matrix.png",
        "report_json": "report.json",
        "markdown": "report.md",
    }
    write_private(out / files["config"], dump_config(config))
    write_private(out / files["matrix_json"], report.matrix.to_json())
    plot_matrix(report.matrix, out / files["matrix"], f"{report.name}: {report.protocol}")
    for o in report.outcomes:
        if o.backfill:
            files[f"backfill_{o.model_version}"] = f"backfill_{o.model_version}.png"
            plot_backfill(
                o.backfill,
                out / files[f"backfill_{o.model_version}"],
                f"{o.model_version}: partial backfill on the test images",
            )
    for name, (feats, labels) in (features_2d or {}).items():
        files[f"features_{name}"] = f"features_{name}.png"
        plot_features_2d(feats, labels, out / files[f"features_{name}"], f"{name}: test features")
    body = {
        **report.summary(),
        "outcomes": [asdict(o) for o in report.outcomes],
        "versions": report.versions,
    }
    write_private(out / files["report_json"], json.dumps(body, indent=2, default=float))
    write_private(out / files["markdown"], markdown(report, files))
    return files
