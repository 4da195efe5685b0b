"""Markdown tables of a ``benchmarks/fidelity.py`` result (its JSON, as a dict).

Each cell is ``mean ± sd [min, max]`` over seeds (just the value for one seed; ``-`` where
nothing was measured). ECC is shown as ``passed/seeds``.
"""

from __future__ import annotations


def fmt(summary: dict | None, digits: int = 1, spread: bool = True) -> str:
    if summary is None:
        return "-"
    if "pass_rate" in summary:
        return f"{round(summary['pass_rate'] * summary['n'])}/{summary['n']}"
    text = f"{summary['mean']:.{digits}f}"
    if summary["sd"] is not None:
        text += f" ± {summary['sd']:.{digits}f}"
        if spread:
            text += f" [{summary['min']:.{digits}f}, {summary['max']:.{digits}f}]"
    return text


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def summary_table(methods: dict) -> list[str]:
    header = ["method", "AA %", "AC", "ECC all pairs", "update gain", "NFR % served",
              "NFR % of old-correct, served", "NFR % after backfill"]
    rows = []
    for name, method in methods.items():
        s = method["summary"]
        mean = s["upgrade_mean"]
        rows.append([
            name, fmt(s["AA"]), fmt(s["AC"], 2), fmt(s["ecc_all"]), fmt(mean["update_gain"], 2),
            fmt(mean["served"]["nfr"]), fmt(mean["served"]["nfr_of_old_correct"]),
            fmt(mean["backfilled"]["nfr"]),
        ])
    return _table(header, rows)


def matrix_table(methods: dict) -> list[str]:
    first = next(iter(methods.values()))["summary"]["matrix"]
    cells = [(t, k) for t in range(len(first)) for k in range(t + 1)]
    header = ["method"] + [f"M({t + 1},{k + 1})" for t, k in cells]
    rows = []
    for name, method in methods.items():
        s = method["summary"]
        row = [name]
        for t, k in cells:
            text = fmt(s["matrix"][t][k], spread=False)
            if k < t:
                text += f" ({fmt(s['ecc'][t][k])})"
            row.append(text)
        rows.append(row)
    return _table(header, rows)


def backfill_table(methods: dict) -> list[str]:
    header = ["method", "order", "AUC top-1 %", "AUC mAP %", "rho(sigma, error) gallery",
              "rho(sigma, error) h's training rows"]
    rows = []
    for name, method in methods.items():
        mean = method["summary"].get("backfill_mean")
        if mean is None:
            continue
        for order in ("uncertainty", "random", "oracle"):
            first = order == "uncertainty"
            rows.append([
                name, order, fmt(mean["auc_top1"][order]), fmt(mean["auc_mean_ap"][order]),
                fmt(mean["spearman_gallery"], 2) if first else "",
                fmt(mean["spearman_fit_rows"], 2) if first else "",
            ])
    return _table(header, rows) if rows else []


def markdown(result: dict) -> str:
    seeds = result["config"]["seeds"]
    lines = [
        "# Fidelity benchmark", "",
        f"Seeds {seeds}; cells are mean ± sd [min, max] over seeds; M(t,k) = top-1 % of model "
        "t's queries against model k's gallery (ECC passes/seeds in brackets); per-upgrade "
        "measures are averaged over the upgrades of a seed first. Machine: "
        f"{result['machine'].get('cpu_model', result['machine']['processor'])}, "
        f"{result['config']['processes']} processes of {result['config']['threads']} torch "
        f"thread(s); {result['timing']['measured_s'] / 60:.1f} min wall, "
        f"{result['timing'].get('cpu_s', float('nan')) / 60:.1f} CPU-min.",
    ]
    for name, protocol in result["protocols"].items():
        lines += ["", f"## {name}: {protocol['kind']}", "", protocol["description"], ""]
        lines += summary_table(protocol["methods"]) + [""]
        lines += matrix_table(protocol["methods"])
        backfill = backfill_table(protocol["methods"])
        lines += ([""] + backfill) if backfill else []
    return "\n".join(lines) + "\n"
