"""A job submitted with ``ray job submit`` ends its log with its own exit status and why
(raycompat/cli/job_exit.py, through ``run_main``); run directly, it prints nothing extra.
The submission itself, a refusal seen by the submitter as exit 3, is in
tests/cluster/upgrade/test_job.py."""

from __future__ import annotations

import pytest

from raycompat.cli.errors import run_main
from raycompat.cli.job_entry import JOB_CONFIG_ENV
from raycompat.cli.job_exit import JobExit, exit_of
from raycompat.errors import ConfigError, DataError


def refuse(argv):
    raise JobExit(3, "refused: m2")


def bad_key(argv):
    raise ConfigError("epochs: expected int, got 'two'")


def bad_data(argv):
    raise DataError("step 3: non-finite loss")


def bug(argv):
    raise KeyError("oops")


def done(argv):
    return {"ok": True}


def exited(main) -> int:
    with pytest.raises(SystemExit) as exit_:
        run_main(main, [])
    return exit_.value.code


@pytest.mark.parametrize(
    "main, code, line",
    [
        (refuse, 3, "raycompat: exit 3 (refused: m2)"),
        (bad_key, 2, "raycompat: exit 2 (epochs: expected int, got 'two')"),
        (bad_data, 1, "raycompat: exit 1 (step 3: non-finite loss)"),
        (bug, 1, "raycompat: exit 1 (KeyError: 'oops')"),
    ],
)
def test_a_submitted_job_ends_its_log_with_its_status_and_reason(
    main, code, line, monkeypatch, capsys
):
    monkeypatch.setenv(JOB_CONFIG_ENV, '{"runtime_env": {}}')
    assert exited(main) == code
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == line
    if main is bug:
        assert "Traceback" in err  # printed before the line, as Python would at exit


def test_a_submitted_job_that_succeeds_says_so(monkeypatch, capsys):
    monkeypatch.setenv(JOB_CONFIG_ENV, '{"runtime_env": {}}')
    run_main(done, [])
    assert capsys.readouterr().out.splitlines()[-1] == "raycompat: exit 0 (ok)"


def test_a_job_run_directly_prints_no_exit_line(monkeypatch, capsys):
    monkeypatch.delenv(JOB_CONFIG_ENV, raising=False)
    assert exited(refuse) == 3
    run_main(done, [])
    out, err = capsys.readouterr()
    assert "raycompat: exit" not in out + err


def test_a_message_exit_gives_its_message_and_a_plain_status_its_generic_reason():
    assert exit_of(SystemExit("upgrade.py: error: digits is being upgraded")) == (
        1,
        "digits is being upgraded",
    )
    assert exit_of(SystemExit(3)) == (3, "refused")
    assert exit_of(SystemExit(0)) == (0, "ok")


@pytest.mark.ray
def test_a_job_leaves_running_a_ray_it_did_not_start(ray_local, monkeypatch, capsys):
    """A job run in a process already connected to Ray (a test session, a notebook) does not
    shut that Ray down at its exit line: a later ``ray.init`` would start a smaller one."""
    monkeypatch.setenv(JOB_CONFIG_ENV, '{"runtime_env": {}}')
    run_main(done, [])
    assert exited(refuse) == 3
    assert capsys.readouterr().out.splitlines()[-1] == "raycompat: exit 3 (refused: m2)"
    assert ray_local.is_initialized()
    assert ray_local.cluster_resources()["CPU"] == 4
