"""Markdown tables of a ``benchmarks/fidelity.py`` result (its JSON, as a dict).

Each cell is ``mean ± sd [lo, hi]`` over seeds, ``[lo, hi]`` the 95% confidence interval of
the mean (Student's t with n - 1 degrees of freedom; just the value for one seed; ``-`` where
nothing was measured). ECC is shown as ``passed/seeds``. A protocol trained to convergence
(``regime``) adds the epochs each model ran against its cap, and the verification and
class-mean-template scores beside 1:N top-1, each table headed by the score it uses.
"""

from __future__ import annotations

from raycompat.metrics.intervals import mean_interval


def interval(summary: dict, level: float = 0.95) -> tuple[float, float]:
    """The ``level`` confidence interval of the mean: ``mean ± t sd / sqrt(n)``
    (:func:`raycompat.metrics.intervals.mean_interval`)."""
    return mean_interval(summary["mean"], summary["sd"], summary["n"], level)


def fmt(summary: dict | None, digits: int = 1, spread: bool = True, sd: bool = True) -> str:
    """``mean ± sd [lo, hi]`` (module docstring); ``sd``/``spread`` False leave out the sd /
    the interval."""
    if summary is None:
        return "-"
    if "pass_rate" in summary:
        return f"{round(summary['pass_rate'] * summary['n'])}/{summary['n']}"
    text = f"{summary['mean']:.{digits}f}"
    if summary["sd"] is not None:
        if sd:
            text += f" ± {summary['sd']:.{digits}f}"
        if spread:
            low, high = interval(summary)
            text += f" [{low:.{digits}f}, {high:.{digits}f}]"
    return text


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def summary_table(methods: dict) -> list[str]:
    header = [
        "method",
        "AA %",
        "AC",
        "ECC all pairs",
        "update gain",
        "NFR % served",
        "NFR % of old-correct, served",
        "NFR % after backfill",
    ]
    rows = []
    for name, method in methods.items():
        s = method["summary"]
        mean = s["upgrade_mean"]
        rows.append(
            [
                name,
                fmt(s["AA"]),
                fmt(s["AC"], 2),
                fmt(s["ecc_all"]),
                fmt(mean["update_gain"], 2),
                fmt(mean["served"]["nfr"]),
                fmt(mean["served"]["nfr_of_old_correct"]),
                fmt(mean["backfilled"]["nfr"]),
            ]
        )
    return _table(header, rows)


def matrix_table(methods: dict, score: str | None = None) -> list[str]:
    """Every ``M(t, k)`` with its ECC passes; ``score``: another score's (``summary.scores``)."""

    def pick(method: dict) -> dict:
        summary = method["summary"]
        return summary if score is None else summary["scores"][score]

    first = pick(next(iter(methods.values())))["matrix"]
    cells = [(t, k) for t in range(len(first)) for k in range(t + 1)]
    header = ["method"] + [f"M({t + 1},{k + 1})" for t, k in cells]
    rows = []
    for name, method in methods.items():
        s = pick(method)
        row = [name]
        for t, k in cells:
            text = fmt(s["matrix"][t][k], spread=False)
            if k < t:
                text += f" ({fmt(s['ecc'][t][k])})"
            row.append(text)
        rows.append(row)
    return _table(header, rows)


def kept_table(methods: dict) -> list[str]:
    """Per method, ``M(t, k) / M(t, t)`` for every ``k < t`` and its mean over them: the share
    of a full re-embedding's top-1 kept by serving the older gallery (``summary.kept``)."""
    first = next(iter(methods.values()))["summary"]["kept"]["matrix"]
    cells = [(t, k) for t in range(len(first)) for k in range(t)]
    header = ["method"] + [f"M({t + 1},{k + 1})/M({t + 1},{t + 1})" for t, k in cells]
    rows = [
        [name]
        + [fmt(method["summary"]["kept"]["matrix"][t][k], sd=False) for t, k in cells]
        + [fmt(method["summary"]["kept"]["mean"], sd=False)]
        for name, method in methods.items()
    ]
    return _table(header + ["mean"], rows)


SCORES = {
    "identification": "1:N top-1 identification (the compatibility criterion's score)",
    "verification": "1:1 verification, 10-fold threshold (CoReS' score)",
    "templates": "1:N search of class-mean templates (IAM-CL2R's, HOC's score)",
}


def score_table(methods: dict, score: str) -> list[str]:
    """AA, AC and ECC on every pair under ``score`` (``summary.scores``)."""
    rows = []
    for name, method in methods.items():
        s = method["summary"]["scores"][score]
        rows.append([name, fmt(s["AA"]), fmt(s["AC"], 2), fmt(s["ecc_all"])])
    return _table(["method", "AA %", "AC", "ECC all pairs"], rows)


def training_table(methods: dict) -> list[str]:
    """Per model: epochs run (mean over seeds) against the cap, the epoch kept, the seeds that
    stopped on the plateau; and the last model's cumulative epochs (a warm start's inherited
    ones counted)."""
    first = next(iter(methods.values()))["summary"]["training"]
    header = ["method"] + [f"model {t + 1}: run / cap (kept)" for t in range(len(first))]
    header += ["stopped on plateau", f"model {len(first)}: cumulative"]
    rows = []
    for name, method in methods.items():
        models = method["summary"]["training"]
        row = [name]
        for m in models:
            row.append(
                f"{fmt(m['epochs_run'], spread=False)} / {round(m['cap']['mean'])} "
                f"({fmt(m['best_epoch'], spread=False)})"
            )
        plateaus = sum(m["stopped"]["counts"].get("plateau", 0) for m in models)
        row += [
            f"{plateaus}/{sum(m['stopped']['n'] for m in models)} models",
            fmt(models[-1]["epochs_cumulative"], spread=False),
        ]
        rows.append(row)
    return _table(header, rows)


def backfill_table(methods: dict) -> list[str]:
    header = [
        "method",
        "order",
        "AUC top-1 %",
        "AUC mAP %",
        "rho(sigma, error) gallery",
        "rho(sigma, error) h's training rows",
    ]
    rows = []
    for name, method in methods.items():
        mean = method["summary"].get("backfill_mean")
        if mean is None:
            continue
        for order in ("uncertainty", "random", "oracle"):
            first = order == "uncertainty"
            rows.append(
                [
                    name,
                    order,
                    fmt(mean["auc_top1"][order]),
                    fmt(mean["auc_mean_ap"][order]),
                    fmt(mean["spearman_gallery"], 2) if first else "",
                    fmt(mean["spearman_fit_rows"], 2) if first else "",
                ]
            )
    return _table(header, rows) if rows else []


def _kept_tasks(result: dict) -> str:
    """What the header's time leaves out when tasks were read from earlier runs' files: their
    count, their own seconds and the machines they name (files written before a task recorded
    its machine name none)."""
    tasks = [t for runs in result["timing"]["protocols"].values() for t in runs]
    kept = [t for t in tasks if t.get("read_from_file")]
    if not kept:
        return ""
    machines = sorted({t["machine"] for t in kept if t.get("machine")})
    named = f" on {', '.join(machines)}" if machines else ""
    unnamed = sum(not t.get("machine") for t in kept)
    return (
        f" {len(kept)} of {len(tasks)} tasks were read from the files earlier runs kept "
        f"({sum(t['seconds'] for t in kept) / 60:.1f} min of their own{named}"
        + (f"; {unnamed} name no machine" if unnamed else "")
        + "); the time above is this run's."
    )


def markdown(result: dict) -> str:
    seeds = result["config"]["seeds"]
    lines = [
        "# Fidelity benchmark",
        "",
        f"Seeds {seeds}; cells are mean ± sd [95% confidence interval of the mean] over seeds; "
        "M(t,k) = top-1 % of model t's queries against model k's gallery (ECC passes/seeds in "
        "brackets); per-upgrade measures are averaged over the upgrades of a seed first. Machine: "
        f"{result['machine'].get('cpu_model', result['machine']['processor'])}, "
        f"{result['config']['processes']} processes of {result['config']['threads']} torch "
        f"thread(s); {result['timing']['measured_s'] / 60:.1f} min wall, "
        f"{result['timing'].get('cpu_s', float('nan')) / 60:.1f} CPU-min.{_kept_tasks(result)}",
    ]
    for name, protocol in result["protocols"].items():
        methods = protocol["methods"]
        first = next(iter(methods.values()))["summary"]
        lines += ["", f"## {name}: {protocol['kind']}", "", protocol["description"], ""]
        if "training" in first:
            lines += (
                [
                    "Epochs per model (mean ± sd over seeds; cap = the budget; kept = the "
                    "best validation epoch):",
                    "",
                ]
                + training_table(methods)
                + [""]
            )
            lines += [f"Score: {SCORES['identification']}.", ""]
        lines += summary_table(methods) + [""]
        lines += matrix_table(methods)
        lines += ["", "Share of a full re-embedding's top-1 kept, in %:", ""]
        lines += kept_table(methods)
        backfill = backfill_table(methods)
        lines += ([""] + backfill) if backfill else []
        for score in first.get("scores", {}):
            lines += ["", f"### {name}, {SCORES[score]}", ""]
            lines += score_table(methods, score) + [""] + matrix_table(methods, score)
    return "\n".join(lines) + "\n"


def readme_table(result: dict, key: str) -> str:
    """The README's table of one protocol (``"mnist5k/open_set"``) of any number of steps T:
    per method the old self-test M(1,1), each later model's queries against the first gallery
    M(t,1), the last self-test M(T,T), ECC
    over all pairs and the negative flips as served, each ``mean [lo, hi]`` over seeds with
    ``[lo, hi]`` the 95% confidence interval of the mean (:func:`interval`).
    ``tests/benchmarks/test_fidelity.py`` holds the README to this output of the committed
    JSON."""
    methods = result["protocols"][key]["methods"]
    steps = len(next(iter(methods.values()))["summary"]["matrix"])  # T models: M(1,1)..M(T,T)
    pairs = [(0, 0)] + [(t, 0) for t in range(1, steps)] + [(steps - 1, steps - 1)]
    header = ["method", *(f"M({t + 1},{k + 1})" for t, k in pairs)]
    header += ["ECC, all pairs", "NFR % served"]
    rows = []
    for name, method in methods.items():
        s = method["summary"]
        cells = [s["matrix"][t][k] for t, k in pairs]
        rows.append(
            [name]
            + [fmt(c, sd=False) for c in cells]
            + [fmt(s["ecc_all"]), fmt(s["upgrade_mean"]["served"]["nfr"], sd=False)]
        )
    return "\n".join(_table(header, rows)) + "\n"


if __name__ == "__main__":  # python benchmarks/_fidelity_report.py RESULT.json [PROTOCOL]
    import json
    import sys

    loaded = json.loads(open(sys.argv[1]).read())
    print(readme_table(loaded, sys.argv[2]) if len(sys.argv) > 2 else markdown(loaded), end="")


SPLIT_NAMES = {"mnist5k": "MNIST", "synthetic": "synth.", "open_set": "open",
               "closed_set": "closed"}  # fmt: skip


def maps_table(result: dict) -> str:
    """docs/fidelity.md's table of the maps run (``fidelity_maps.yaml``): per entry and split,
    the last model's queries against the first gallery ``M(T,1)`` and the share of a full
    re-embedding kept (``summary.kept``'s mean over the pairs), each ``mean [lo, hi]`` over
    seeds; a last row with the first model's own ``M(1,1)``, the bar ECC sets for ``M(T,1)``.
    ``tests/benchmarks/test_fidelity.py`` holds the docs to this output of the committed JSON."""
    protocols = result["protocols"]
    splits = [(key, "/".join(SPLIT_NAMES.get(p, p) for p in key.split("/"))) for key in protocols]
    entries = list(next(iter(protocols.values()))["methods"])
    steps = len(protocols[splits[0][0]]["methods"][entries[0]]["summary"]["matrix"])
    last = f"M({steps},1)"
    header = ["entry"] + [f"{name} {last}" for _, name in splits]
    header += [f"{name} kept %" for _, name in splits]
    rows = []
    for entry in entries:
        summaries = [protocols[key]["methods"][entry]["summary"] for key, _ in splits]
        rows.append(
            [entry]
            + [fmt(s["matrix"][steps - 1][0], sd=False) for s in summaries]
            + [fmt(s["kept"]["mean"], sd=False) for s in summaries]
        )
    own = [protocols[key]["methods"][entries[0]]["summary"]["matrix"][0][0] for key, _ in splits]
    rows.append(["M(1,1)"] + [fmt(c, sd=False) for c in own] + ["-"] * len(splits))
    return "\n".join(_table(header, rows)) + "\n"
