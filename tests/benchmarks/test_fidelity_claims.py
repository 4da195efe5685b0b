"""benchmarks/fidelity_claims.py: each paper's claim read seed by seed from task files, on
hand-made tasks whose outcome is worked out here."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import benchmark_modules

GROUPS = [["independent", "fct", "lwf"], ["bct", "cores", "dsimplex_hoc", "nifcl_avg", "nifcl_rw"]]


@pytest.fixture(scope="module")
def claims():
    yield from benchmark_modules("fidelity_claims")


def run(m11: float, m21: float, verification: float = 0.0, templates: float = 0.0) -> dict:
    matrix = [[m11, None], [m21, m11 + 5]]
    return {
        "matrix": matrix,
        "AC": 0.0,
        "scores": {
            "verification": {"matrix": matrix, "AC": verification},
            "templates": {"matrix": matrix, "AC": templates},
        },
    }


def write_task(folder, seed: int, group: int, runs: dict[str, dict]) -> None:
    task = {
        "config": {"method_groups": GROUPS},
        "result": {"seed": seed, "numbers": {"open_set": runs, "closed_set": runs}},
    }
    name = f"regime-seed{seed}-{'+'.join(GROUPS[group])}.json"
    (folder / name).write_text(json.dumps(task))


def seed_tasks(folder, seed: int, cores_verification: float, fct_m21: float) -> None:
    write_task(folder, seed, 0, {
        "independent": run(60.0, 1.0),
        "fct": run(60.0, fct_m21),
        "lwf": run(60.0, 58.0, verification=0.33),
    })  # fmt: skip
    write_task(folder, seed, 1, {
        "bct": run(59.0, 55.0, verification=0.67),
        "cores": run(50.0, 45.0, verification=cores_verification),
        "dsimplex_hoc": run(48.0, 47.0, templates=1.0),
        "nifcl_avg": run(59.0, 54.0, verification=1.0),
        "nifcl_rw": run(59.0, 53.0, verification=0.67),
    })  # fmt: skip


def test_each_claim_holds_on_the_seeds_its_numbers_say(claims, tmp_path):
    seed_tasks(tmp_path, 0, cores_verification=1.0, fct_m21=61.0)
    seed_tasks(tmp_path, 1, cores_verification=0.33, fct_m21=59.0)
    write_task(tmp_path, 2, 0, {"independent": run(60.0, 1.0)})  # one group only: not counted
    seeds = claims.load_seeds(tmp_path)
    assert list(seeds) == [0, 1]
    held = {row["claim"]: row["holds_on"] for row in claims.read(seeds)}
    assert list(held.values()) == [
        [0],  # CoReS 1.0 above BCT 0.67 and LwF 0.33 on seed 0 only
        [],  # CoReS's first model 50 below the learned head's 60
        [0, 1],  # HOC's templates AC 1.0 above CoReS's 0.0
        [0],  # h(old) 61 above old/old 60 on seed 0, 59 below it on seed 1
        [0],
        [0, 1],  # NI-FCL's weaker variant 0.67 equals BCT's 0.67: a tie holds
    ]
    table = claims.markdown(claims.read(seeds), [0, 1])
    assert "| cores 1.00/0.33; bct 0.67/0.67; lwf 0.33/0.33 | 1 of 2 |" in table
    assert "h(old) 61.0/59.0; old/old 60.0/60.0 | 1 of 2 |" in table


def test_a_folder_without_a_whole_seed_is_one_line(claims, tmp_path, capsys):
    write_task(tmp_path, 0, 0, {"independent": run(60.0, 1.0)})
    assert claims.main([str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"fidelity_claims.py: {tmp_path}: no seed has all its tasks\n"
    )
