"""``raycompat alias set | rollback | list`` and ``search --alias``: exit 0, 2 for an
incompatible pair or a usage error, 1 for data errors; one line each; the ``--help`` examples
of ``alias set`` and ``promote`` work on the store ``make demo`` writes (issue 40, item 2)."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest

from raycompat.cli.commands import REGISTRY
from raycompat.cli.commands.alias import ACTIONS
from tests.cli import test_promotion
from tests.cli.test_promotion import run

# test_promotion's fixtures: gallery g of test_served_log.served_store, and two 4-d query vectors
served_template, root, queries = (
    test_promotion.served_template,
    test_promotion.root,
    test_promotion.queries,
)


def alias_search(capsys, root: str, queries: str, alias: str = "prod") -> tuple[int, dict | str]:
    code, out, err = run(
        capsys, "search", "g", "--store", root, "--alias", alias, "--vectors", queries,
        "-k", "2", "--json",
    )  # fmt: skip
    return code, json.loads(out) if code == 0 else err


def test_set_list_search_and_rollback_an_alias(root, queries, capsys):
    code, out, _ = run(capsys, "alias", "set", "g", "prod", "--version", "v2", "--model", "m2",
                       "--store", root)  # fmt: skip
    assert code == 0 and out.startswith("alias prod of g points at (v2, m2): v2 is m2's own")
    code, out, _ = run(capsys, "alias", "set", "g", "prod", "--version", "v4", "--model", "m3",
                       "--store", root)  # fmt: skip
    assert code == 0 and "was (v2, m2); change 2; `raycompat alias rollback g prod`" in out
    code, found = alias_search(capsys, root, queries)
    assert code == 0 and (found["gallery_version"], found["model"], found["alias"]) == (
        "v4", "m3", "prod",
    )  # fmt: skip
    code, out, _ = run(capsys, "alias", "list", "g", "--store", root)
    assert code == 0 and out.splitlines()[2].split()[:6] == ["prod", "v4", "m3", "compatible",
                                                             "2", "(v2,"]  # fmt: skip
    code, out, _ = run(capsys, "alias", "rollback", "g", "prod", "--store", root, "--json")
    assert code == 0 and json.loads(out)["record"]["gallery_version"] == "v2"
    assert alias_search(capsys, root, queries)[1]["gallery_version"] == "v2"
    code, out, _ = run(capsys, "history", "g", "--store", root, "--json")
    changes = [(a["alias"], a["action"], a["seq"]) for a in json.loads(out)["named_aliases"]]
    assert changes == [("prod", "set", 1), ("prod", "set", 2), ("prod", "rollback", 3)]
    code, out, _ = run(capsys, "history", "g", "--store", root)
    named = out.split("named aliases (`raycompat alias`)\n", 1)[1].splitlines()
    assert code == 0 and [row.split()[:5] for row in named[2:5]] == [
        ["prod", "1", "set", "v2", "m2"],
        ["prod", "2", "set", "v4", "m3"],
        ["prod", "3", "rollback", "v2", "m2"],
    ]
    assert "pid " in named[2]  # who wrote it


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (["alias", "set", "g", "prod", "--version", "v2", "--model", "m1"], 2,
         "alias prod may not point at (v2, m1) on g: v2 holds m2's features"),
        (["alias", "set", "g", "prod", "--version", "v9", "--model", "m1"], 1,
         "gallery 'g' has no version 'v9'"),
        (["alias", "rollback", "g", "prod"], 1, "gallery 'g' has no alias 'prod'"),
        (["search", "g", "--alias", "prod", "--ids", "v1-0"], 1, "gallery 'g' has no alias"),
        (["search", "g", "--alias", "prod", "--model", "m1", "--ids", "v1-0"], 2,
         "--alias names the version and the query model"),
    ],
)  # fmt: skip
def test_errors_are_one_line_with_their_exit_status(root, capsys, argv, status, message):
    code, out, err = run(capsys, *argv, "--store", root)
    assert (code, out, err.count("\n")) == (status, "", 1) and message in err, err


def _example(command) -> list[str]:
    """A command's ``--help`` example as argv, without the leading ``raycompat``."""
    return shlex.split(command.example)[1:]


def test_the_help_examples_work_on_the_demo_store(demo_stores, tmp_path, monkeypatch, capsys):
    """After ``make demo`` and the documented backfill of m2 (``tests/demo_store.py``'s copy of
    that store): m1 serves v1, m2 v2 (its backfill). ``alias set``'s example, a swap to
    (v1, m1) and back, and promote's example after a revoke, as their ``--help`` prints
    them."""
    shutil.copytree(demo_stores["demo_store_backfilled"], tmp_path, symlinks=True,
                    dirs_exist_ok=True)  # fmt: skip
    monkeypatch.chdir(tmp_path)  # the examples name outputs/upgrade/store
    alias_set, rollback, listing = (_example(a) for a in ACTIONS)
    assert run(capsys, *alias_set)[0] == 0  # prod -> (v2, m2)
    swap = ["alias", "set", "mnist", "prod", "--version", "v1", "--model", "m1", "--store"]
    code, out, _ = run(capsys, *swap, "outputs/upgrade/store")
    assert code == 0 and "(v1, m1): m1's grant (extracted) (was (v2, m2)" in out
    assert run(capsys, *rollback)[0] == 0
    code, out, _ = run(capsys, *listing)
    assert code == 0 and json.loads(out)["aliases"][0]["gallery_version"] == "v2"
    code, out, _ = run(capsys, "search", "mnist", "--alias", "prod", "--ids", "17", "-k", "2",
                       "--store", "outputs/upgrade/store")  # fmt: skip
    assert code == 0 and out.startswith("gallery mnist version v2 (extracted for model m2, alias")
    refused = {"m2": (2, "m2 may search v2"), "m3": (1, "model 'm3' is not registered")}
    for model, (want, why) in refused.items():  # the toy demo trains no m3
        argv = [*swap[:5], "v1", "--model", model, "--store", "outputs/upgrade/store"]
        code, _, err = run(capsys, *argv)
        assert code == want and why in err, err
    revoke = _example(REGISTRY["revoke"])  # m1 stops serving; promote's example serves it again
    assert run(capsys, *revoke)[0] == 0
    code, out, _ = run(capsys, *_example(REGISTRY["promote"]))
    assert code == 0 and out.startswith("m1 serves mnist v1 (was nothing;"), out
    assert run(capsys, *_example(REGISTRY["rollback"]))[0] == 0
