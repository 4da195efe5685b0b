"""Each seed paper's claim, read seed by seed from the finished tasks of the `regime` protocol
(docs/fidelity.md, "The `regime` run"): the numbers a claim rests on, per seed, and
on how many seeds it holds. No claim is made here; the docs make one only with 5 seeds.

    .venv/bin/python benchmarks/fidelity_claims.py \
        benchmarks/results/fidelity_regime_cpu.json.tasks [--json]

A seed counts only when both method groups of it have finished. Scores are top-1 (%) or AC of
``benchmarks/fidelity.py``'s tasks; open-set unless the claim says closed-set.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def load_seeds(folder: Path, protocol: str = "regime") -> dict[int, dict]:
    """``{seed: {split: {method: run}}}`` of every seed whose tasks are all there (both
    method groups), the methods of its groups merged."""
    seeds: dict[int, dict] = defaultdict(lambda: defaultdict(dict))
    groups: dict[int, int] = defaultdict(int)
    expected = 0
    for path in sorted(folder.glob(f"{protocol}-seed*-*.json")):
        task = json.loads(path.read_text())
        result = task["result"]
        expected = len(task["config"]["method_groups"])
        groups[result["seed"]] += 1
        for split, runs in result["numbers"].items():
            seeds[result["seed"]][split].update(runs)
    return {seed: dict(seeds[seed]) for seed in sorted(seeds) if groups[seed] == expected}


def top1(run: dict, row: int, col: int, score: str | None = None) -> float:
    """M(row+1, col+1) of a run's matrix (identification) or of one of its ``scores``."""
    matrix = run["scores"][score]["matrix"] if score else run["matrix"]
    return matrix[row][col]


def ac(run: dict, score: str | None = None) -> float:
    return run["scores"][score]["AC"] if score else run["AC"]


@dataclass(frozen=True)
class Claim:
    """A paper's claim: the values it compares on one seed, and whether it holds there."""

    text: str
    values: Callable[[dict], dict[str, float]]
    holds: Callable[[dict[str, float]], bool]
    unit: str = "AC"  # or "top-1"


def _verification_ac(*methods: str) -> Callable[[dict], dict[str, float]]:
    return lambda seed: {m: ac(seed["open_set"][m], "verification") for m in methods}


def _fct_top1(split: str) -> Callable[[dict], dict[str, float]]:
    """FCT's new model on ``h(old gallery)`` (M(2,1)) and the old model on its own (M(1,1))."""
    return lambda seed: {
        "h(old)": top1(seed[split]["fct"], 1, 0),
        "old/old": top1(seed[split]["fct"], 0, 0),
    }


CLAIMS = (
    Claim(
        "CoReS more compatible than BCT and LwF (1:1 verification AC)",
        _verification_ac("cores", "bct", "lwf"),
        lambda v: v["cores"] > max(v["bct"], v["lwf"]),
    ),
    Claim(
        "CoReS's first model as good as a learned head's (top-1 M(1,1))",
        lambda seed: {
            "cores": top1(seed["open_set"]["cores"], 0, 0),
            "learned head": top1(seed["open_set"]["independent"], 0, 0),
        },
        lambda v: v["cores"] >= v["learned head"],
        "top-1",
    ),
    Claim(
        "d-Simplex-HOC more compatible than CoReS (class-mean templates AC)",
        lambda seed: {m: ac(seed["open_set"][m], "templates") for m in ("dsimplex_hoc", "cores")},
        lambda v: v["dsimplex_hoc"] > v["cores"],
    ),
    *(
        Claim(
            f"FCT's h(old) above old on old{where} (top-1 M(2,1) vs M(1,1))",
            _fct_top1(split),
            lambda v: v["h(old)"] > v["old/old"],
            "top-1",
        )
        for split, where in (("closed_set", ", closed-set"), ("open_set", ""))
    ),
    Claim(
        "NI-FCL about as compatible as BCT (1:1 verification AC)",
        _verification_ac("nifcl_avg", "nifcl_rw", "bct"),
        lambda v: min(v["nifcl_avg"], v["nifcl_rw"]) >= v["bct"],
    ),
)


def read(seeds: dict[int, dict]) -> list[dict]:
    """Per claim: its values on each seed, and the seeds it holds on."""
    out = []
    for claim in CLAIMS:
        values = {seed: claim.values(numbers) for seed, numbers in seeds.items()}
        held = [seed for seed, v in values.items() if claim.holds(v)]
        out.append({"claim": claim.text, "unit": claim.unit, "values": values, "holds_on": held})
    return out


def markdown(rows: list[dict], seeds: list[int]) -> str:
    heading = " / ".join(str(s) for s in seeds)
    lines = [
        f"| Paper claim (open-set unless stated) | Seeds {heading} | Holds on |",
        "|---|---|---|",
    ]
    for row in rows:
        names = next(iter(row["values"].values())).keys() if row["values"] else ()
        digits = 1 if row["unit"] == "top-1" else 2
        cells = "; ".join(
            f"{name} " + "/".join(f"{row['values'][s][name]:.{digits}f}" for s in seeds)
            for name in names
        )
        lines.append(f"| {row['claim']} | {cells} | {len(row['holds_on'])} of {len(seeds)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", type=Path, help="the folder of finished tasks (OUT.tasks)")
    parser.add_argument("--json", action="store_true", help="JSON instead of a markdown table")
    args = parser.parse_args(argv)
    seeds = load_seeds(args.tasks)
    if not seeds:
        print(f"fidelity_claims.py: {args.tasks}: no seed has all its tasks", file=sys.stderr)
        return 1
    rows = read(seeds)
    if args.json:
        print(json.dumps({"seeds": list(seeds), "claims": rows}, indent=1))
    else:
        print(markdown(rows, list(seeds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
