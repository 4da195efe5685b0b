"""``raycompat promote | rollback | revoke | retire`` and what ``search`` and ``history`` make of
them: exit 0, 2 for usage errors, 1 for data errors; one line each (issue 23, item 4)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from raycompat.cli.app import main
from tests.serving import test_served_log
from tests.serving.test_served_log import served_copy

served_template = test_served_log.served_template  # the session's template store, a fixture


@pytest.fixture
def root(served_template, tmp_path) -> str:
    """Gallery g: v1 (m1), v2 and v3 (m2), v4 (m1); m1, m2 and m3 query v1 by their grants."""
    return served_copy(served_template, tmp_path)


@pytest.fixture
def queries(tmp_path) -> str:
    path = str(tmp_path / "q.npy")
    np.save(path, np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32))
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def searched(capsys, root: str, queries: str) -> tuple[int, str]:
    """``search --vectors`` with m2: the version it searched, or the error line."""
    code, out, err = run(
        capsys, "search", "g", "--store", root, "--model", "m2", "--vectors",
        queries, "-k", "2", "--json",
    )  # fmt: skip
    return code, json.loads(out)["gallery_version"] if code == 0 else err


def test_promote_rollback_and_revoke_switch_what_search_uses(root, queries, capsys):
    assert searched(capsys, root, queries) == (0, "v1")  # no alias: the grant, as before
    code, out, _ = run(capsys, "promote", "g", "--model", "m2", "--version", "v3", "--store", root)
    assert code == 0 and out.startswith("m2 serves g v3 (was v1; change 1;")
    assert searched(capsys, root, queries) == (0, "v3")
    code, out, _ = run(capsys, "rollback", "g", "--model", "m2", "--store", root, "--json")
    assert code == 0 and json.loads(out)["record"]["gallery_version"] == "v1"
    assert searched(capsys, root, queries) == (0, "v1")
    assert run(capsys, "revoke", "g", "--model", "m2", "--store", root)[0] == 0
    code, err = searched(capsys, root, queries)
    assert (
        code == 1 and err.count("\n") == 1 and "'m2' may not query gallery 'g': revoked at" in err
    )


def test_retire_is_honoured_by_search_and_refuses_promotes(root, queries, capsys):
    code, out, _ = run(capsys, "retire", "m2", "--store", root, "--reason", "replaced by m3")
    assert code == 0 and out.startswith("model m2 was retired at ")
    code, err = searched(capsys, root, queries)
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("raycompat: error: model m2 was retired at ") and "replaced by m3" in err
    code, _, err = run(capsys, "promote", "g", "--model", "m2", "--version", "v2", "--store", root)
    assert code == 1 and "refusing to promote it to g v2" in err


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (["promote", "gg", "--model", "m2", "--version", "v2"], 1, "did you mean 'g'?"),
        (["promote", "g", "--model", "m22", "--version", "v2"], 1, "did you mean 'm2'?"),
        (["promote", "g", "--model", "m2", "--version", "v4"], 2, "it may serve v1, v2, v3"),
        (["retire", "m9"], 1, "model 'm9' is not registered"),
        (["rollback", "g", "--model", "m2"], 1, "has nothing to roll back to"),
        (["revoke", "g", "--model", "m9"], 1, "nothing to revoke"),
    ],
)
def test_errors_are_one_line_with_their_exit_status(root, capsys, argv, status, message):
    code, out, err = run(capsys, *argv, "--store", root)
    assert (code, out, err.count("\n")) == (status, "", 1) and message in err


def test_usage_of_each_command_exits_2_and_its_help_shows_an_example(tmp_path, capsys):
    for argv in (["promote", "g", "--model", "m2"], ["retire"], ["rollback", "g", "--store", "s"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
    capsys.readouterr()
    assert run(capsys, "revoke", "g", "--model", "m1", "--store", str(tmp_path / "no"))[0] == 2
    with pytest.raises(SystemExit):
        main(["promote", "--help"])
    # the example works on the demo's store (tests/cli/test_alias.py runs it there)
    assert "example: raycompat promote mnist --model m1 --version v1" in capsys.readouterr().out


def test_history_shows_what_each_model_serves_and_every_alias_change(root, capsys):
    main(["promote", "g", "--model", "m2", "--version", "v2", "--store", root])
    main(["revoke", "g", "--model", "m1", "--store", root])
    main(["retire", "m3", "--store", root])
    capsys.readouterr()
    code, out, _ = run(capsys, "history", "g", "--store", root, "--json")
    history = json.loads(out)
    assert code == 0 and "corrupt" not in history
    rows = {r["model_version"]: (r["serves"], r["source"]) for r in history["serving"]}
    assert rows["m2"] == ("v2", "alias 1")
    assert rows["m1"][0] is None and "revoked at" in rows["m1"][1]
    assert rows["m3"][0] is None and "model m3 was retired at" in rows["m3"][1]
    changes = [(a["model_version"], a["action"], a["gallery_version"]) for a in history["aliases"]]
    assert changes == [("m2", "promote", "v2"), ("m1", "revoke", None)]
    code, out, _ = run(capsys, "history", "g", "--store", root)
    assert code == 0 and "\nserving\n" in out and "\nalias changes\n" in out
    assert "revoke" in out and "promote" in out
