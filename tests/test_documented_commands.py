"""Every documented job command runs as written (issue 40): each ``python jobs/<job>.py ...`` and
``ray job submit ... -- python jobs/<job>.py ...`` of README.md and docs/*.md, with ``--dry-run``
appended (the job validates its config, resolves and checks every input and output location,
prints the plan and exits 0, writing nothing; docs/cluster.md, "Paths of a submitted job").

- ``python jobs/...`` runs in a directory that looks like the checkout, beside what ``make demo``
  writes (tests/test_docs.py's ``workdir``, conftest's ``demo_stores``);
- ``ray job submit ...`` runs from the checkout against a real ``ray start --head`` (the
  submitted-history test's ``ray_head``, tests/cluster/upgrade/test_job.py) named by
  ``RAY_ADDRESS``, as docs/cluster.md sets it, and must end ``raycompat: exit 0 (ok)``.

Commands of ``<!-- runnable -->`` blocks run as written in tests/test_docs.py. A command that
cannot run here is listed in ``CANNOT_RUN`` with the reason.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.cluster.upgrade.test_job import ANSI, ray_head  # noqa: F401 (the fixture)
from tests.test_docs import BLOCKS, ROOT, commands, run_bash, workdir

JOB_COMMAND = re.compile(
    r"^(ray job submit .* -- )?python jobs/(upgrade|train|tune|transform|deploy)\.py"
)
CANNOT_RUN = {
    "python jobs/transform.py --config configs/transform_fct.yaml [key.sub=value ...]": (
        "a synopsis ([key.sub=value ...]), not a command"
    ),
    "ray job submit --working-dir . -- python jobs/transform.py --config "
    "configs/transform_fct.yaml": "reads h and the gallery from your bucket and /mnt on a cluster",
    "ray job submit --working-dir . -- python jobs/deploy.py --config configs/deploy_demo.yaml "
    '--output-root "$PWD"': (
        "serves the store `make demo` writes; tests/cluster/test_service.py submits it to a real "
        "head against a store of its own"
    ),
}
PLACEHOLDER = "configs/<x>.yaml"  # a form for your own config: not a command


def documented() -> list[str]:
    """The job commands of every block not run as written elsewhere (comments dropped)."""
    found = []
    for block in BLOCKS:
        if block.kind == "runnable":
            continue
        for command in commands(block.text):
            command = re.sub(r"\s+#\s.*$", "", command)
            if JOB_COMMAND.match(command) and command not in found:
                found.append(command)
    return found


COMMANDS = documented()
RUN = [c for c in COMMANDS if c not in CANNOT_RUN and PLACEHOLDER not in c]
DIRECT = [c for c in RUN if c.startswith("python ")]
SUBMITTED = [c for c in RUN if c.startswith("ray job submit ")]


def test_the_documented_commands_are_found_and_every_exception_is_still_documented():
    assert len(DIRECT) >= 5 and len(SUBMITTED) >= 3, COMMANDS
    assert set(CANNOT_RUN) <= set(COMMANDS), set(CANNOT_RUN) - set(COMMANDS)


@pytest.mark.parametrize("command", DIRECT, ids=lambda c: c.replace('"', "'"))
def test_a_documented_job_command_runs_as_written(command, demo_stores, tmp_path):
    done = run_bash(f"{command} --dry-run", workdir(tmp_path, ["demo_store"], demo_stores))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("dry run:"), done.stdout


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("command", SUBMITTED, ids=lambda c: c.replace('"', "'"))
def test_a_documented_submission_runs_as_written(command, ray_head):  # noqa: F811
    """About 9 s each on 2 cores, mostly Ray starting the job's supervisor and driver (run
    together, they took longer)."""
    address, env, _ = ray_head
    done = subprocess.run(
        ["bash", "-e", "-c", f"{command} --dry-run"],
        cwd=ROOT,
        env={**env, "RAY_ADDRESS": address},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    shown = ANSI.sub("", done.stdout)
    assert done.returncode == 0, shown[-4000:]
    assert "dry run: the config is valid" in shown and "raycompat: exit 0 (ok)" in shown, shown
