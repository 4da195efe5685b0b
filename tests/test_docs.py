"""Every command in README.md and docs/*.md runs as written (issue 23), and the shipped configs'
paths exist or are written by a documented command.

Each shell block (```bash) carries one marker, the line right before its fence; a block
without one fails ``test_every_shell_block_is_marked``:

    <!-- runnable -->                       run with `bash -e`, as written
    <!-- runnable: fixture=demo_store -->   ... in a store the demo's own job wrote (toy size)
    <!-- not-run: KIND: why -->             not run; KIND is one of NOT_RUN

A runnable block runs in a fresh temporary directory that links every top-level entry of the
checkout except ``outputs/`` (so ``configs/...``, ``jobs/...`` and ``.venv/bin/...`` resolve as
written, and what the commands write stays in the temporary directory), with the project's
venv first on ``PATH`` (``python``, ``raycompat``, ``raycompat-upgrade``). A fixture adds what
the block reads (``FIXTURES``). A not-run block is not run, but each of its job commands
(``python jobs/<job>.py ...`` or ``raycompat-<job> ...``, also behind ``ray job submit ...
--``) runs with ``--print-config``: its config file and overrides must validate.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.demo_store import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent  # the environment running the tests: `python`, `raycompat`
SHELL_FENCE = re.compile(r"^```(bash|sh|shell|console|zsh)\b")
MARKER = re.compile(r"^<!-- (runnable|not-run)(?::\s*(.*?))?\s*-->$")
NOT_RUN = {
    "cluster": "needs a Ray cluster (`ray start`, `ray job submit`, `ray up`)",
    "aws": "creates or reads cloud resources",
    "minutes": "a full job, test suite or benchmark: minutes to hours",
    "synopsis": "a command's form with placeholders, not a command",
}
JOB = re.compile(
    r"^(python jobs/(upgrade|train|tune|transform)\.py|raycompat-(upgrade|train|tune|transform))\b"
)
TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    """A fenced shell block: where it is, its marker line and its text."""

    path: Path
    line: int  # of the opening fence, 1-based
    marker: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str | None:
        found = MARKER.match(self.marker)
        return found.group(1) if found else None

    @property
    def options(self) -> str:
        found = MARKER.match(self.marker)
        return (found.group(2) or "") if found else ""


def shell_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if SHELL_FENCE.match(lines[i]):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            marker = lines[i - 1].strip() if i else ""
            blocks.append(Block(path, i + 1, marker, "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return blocks


BLOCKS = [block for path in DOCS for block in shell_blocks(path)]


def marker_problem(block: Block) -> str | None:
    """What is wrong with the block's marker, or None."""
    if block.kind is None:
        return f"{block.where}: no marker (<!-- runnable --> or <!-- not-run: KIND: why -->)"
    if not block.text.strip():
        return f"{block.where}: empty block"
    if block.kind == "not-run":
        kind, _, why = block.options.partition(":")
        if kind.strip() not in NOT_RUN or not why.strip():
            return f"{block.where}: not-run needs 'KIND: why', KIND one of {', '.join(NOT_RUN)}"
        return None
    for option in block.options.split():
        key, _, value = option.partition("=")
        if key != "fixture" or value not in FIXTURES:
            return f"{block.where}: unknown option {option!r} (fixture={'|'.join(FIXTURES)})"
    return None


def fixtures_of(block: Block) -> list[str]:
    return [o.partition("=")[2] for o in block.options.split() if o.startswith("fixture=")]


def commands(text: str) -> list[str]:
    """The block's commands, one per string: continuation lines joined, comment lines dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]


def print_config_command(command: str) -> str | None:
    """``command`` as a ``--print-config`` check when it runs a job on a concrete config (the
    ``ray job submit ... --`` prefix, a trailing comment and a ``[key.sub=value ...]`` synopsis
    dropped); None for any other command or a config with a placeholder (``configs/<x>.yaml``)."""
    if command.startswith("ray job submit "):
        command = command.partition(" -- ")[2]
    command = re.sub(r"\s+#\s.*$", "", command)
    command = re.sub(r"\s+\[[^\]'\"]*\.\.\.\s*\]", "", command)
    if not JOB.match(command) or "<" in command:
        return None
    return f"{command} --print-config"


# -- fixtures: what a runnable block finds in its directory ------------------------------------


def workdir(tmp_path: Path, fixtures: list[str], demo_stores: dict[str, Path]) -> Path:
    """A directory that looks like the checkout (every top-level entry but ``outputs/`` linked)
    holding copies of ``fixtures``."""
    work = tmp_path / "checkout"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name != "outputs":
            (work / entry.name).symlink_to(entry)
    for name in fixtures:
        shutil.copytree(demo_stores[name], work, symlinks=True, dirs_exist_ok=True)
    return work


def run_bash(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAYCOMPAT_", "RAY_ADDRESS", "VIRTUAL_ENV"))
    }
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def failure(block: Block, script: str, done: subprocess.CompletedProcess) -> str:
    return (
        f"{block.where} (exit {done.returncode}):\n{script}\n--- stdout\n"
        f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )


# -- the tests ----------------------------------------------------------------------------------


def test_every_shell_block_is_marked():
    assert len(BLOCKS) >= 20  # the parser finds the blocks (an unclosed fence would raise)
    problems = [p for p in map(marker_problem, BLOCKS) if p]
    assert not problems, "\n".join(problems)


def test_a_wrong_marker_is_named():
    block = Block(ROOT / "README.md", 3, "", "make demo")
    assert "README.md:3: no marker" in marker_problem(block)
    for marker in (
        "<!-- not-run: cluster -->",
        "<!-- not-run: slow: why -->",
        "<!-- runnable: fixture=nope -->",
    ):
        assert marker_problem(Block(ROOT / "README.md", 3, marker, "make demo"))
    assert marker_problem(Block(ROOT / "README.md", 3, "<!-- runnable -->", "make demo")) is None


def test_job_commands_become_print_config_checks():
    submit = (
        "ray job submit --working-dir . -- python jobs/upgrade.py --config "
        "configs/upgrade_mnist.yaml epochs=1  # a comment"
    )
    assert print_config_command(submit) == (
        "python jobs/upgrade.py --config configs/upgrade_mnist.yaml epochs=1 --print-config"
    )
    synopsis = "python jobs/transform.py --config configs/transform_fct.yaml [key.sub=value ...]"
    assert print_config_command(synopsis).endswith("transform_fct.yaml --print-config")
    assert print_config_command("python jobs/tune.py --config configs/<x>.yaml") is None
    assert print_config_command("ray up cluster.yaml") is None
    assert commands("a \\\n    b  # c\n# d\ne") == ["a b  # c", "e"]


RUNNABLE = [b for b in BLOCKS if b.kind == "runnable"]
CHECKED = [
    b for b in BLOCKS if b.kind == "not-run" and any(map(print_config_command, commands(b.text)))
]


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.where)
def test_runnable_block_runs_as_written(block, demo_stores, tmp_path):
    done = run_bash(block.text, workdir(tmp_path, fixtures_of(block), demo_stores))
    assert done.returncode == 0, failure(block, block.text, done)
    assert "Traceback" not in done.stderr, failure(block, block.text, done)


@pytest.mark.parametrize("block", CHECKED, ids=lambda b: b.where)
def test_job_commands_of_a_not_run_block_validate(block, demo_stores, tmp_path):
    checks = [c for c in map(print_config_command, commands(block.text)) if c]
    script = "\n".join(checks)
    done = run_bash(script, workdir(tmp_path, [], demo_stores))
    assert done.returncode == 0, failure(block, script, done)


def test_the_core_example_runs_as_written():
    """README's Python example (it once used names it never defined)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The core in a few lines") :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md (The core in a few lines)", "exec"), scope)
    assert set(scope["terms"]) >= {"ce", "nce", "loss"}
    assert scope["terms"]["loss"].requires_grad


# -- the shipped configs' paths -----------------------------------------------------------------

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# Keys whose value a job reads (inputs); every other path in a config is an output the job writes.
INPUT_KEYS = ("model", "transformation", "side_info_transformation", "base", "weights")
# Local inputs no file of the checkout holds: the documented command that writes each, and the
# fixture that writes the same files the same way.
MADE_BY = {"outputs/upgrade/store/_models/m1": ("make demo", "demo_store")}


def input_paths(node, key: str = "") -> list[tuple[str, str]]:
    """``(dotted key, path)`` of every input path of a parsed YAML config."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in input_paths(v, f"{key}{k}.")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in input_paths(v, f"{key}{i}.")]
    name = key.rstrip(".").rsplit(".", 1)[-1]
    return [(key.rstrip("."), node)] if name in INPUT_KEYS and isinstance(node, str) else []


def path_problem(config: str, key: str, path: str, demo_stores: dict[str, Path]) -> str | None:
    """None when ``path`` is a placeholder of the user's bucket, the user's data on the
    cluster's nodes (``/mnt/...``), a file of the checkout, or written by a documented command."""
    if path.startswith("s3://REPLACE_ME_BUCKET/") or path.startswith("/mnt/"):
        return None
    if (ROOT / path).exists():
        return None
    if path not in MADE_BY:
        return f"{config} {key}: {path} does not exist and no documented command writes it"
    command, fixture = MADE_BY[path]
    documented = any(command in commands(b.text) for b in BLOCKS)
    if not documented or not (demo_stores[fixture] / path / "model.json").is_file():
        return f"{config} {key}: {path} is not written by the documented `{command}`"
    return None


def test_config_paths_exist_or_are_written_by_a_documented_command(demo_stores):
    import yaml

    problems = [
        path_problem(config.name, key, path, demo_stores)
        for config in CONFIGS
        for key, path in input_paths(yaml.safe_load(config.read_text()))
    ]
    assert not [p for p in problems if p], "\n".join(filter(None, problems))
    assert path_problem("x.yaml", "model", "runs/step1/model", demo_stores)  # the check can fail


def test_the_extract_config_fits_the_model_make_demo_writes(demo_stores, tmp_path):
    """configs/transform_extract_mnist.yaml reads m1 of the demo store; a wrong width is one
    line naming the key and both widths, before Ray starts (exit 2)."""
    work = workdir(tmp_path, ["demo_store"], demo_stores)
    job = "python jobs/transform.py --config configs/transform_extract_mnist.yaml"
    done = run_bash(f"{job} target.width=2", work)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[-1] == (
        "transform.py: error: configs/transform_extract_mnist.yaml: target.width: 2, but model "
        "outputs/upgrade/store/_models/m1 embeds 9-d features (its model.json: lenetpp + "
        "dsimplex); set target.width=9"
    ), done.stderr
    assert "Ray" not in done.stderr and "Traceback" not in done.stderr
    import yaml

    shipped = yaml.safe_load((ROOT / "configs" / "transform_extract_mnist.yaml").read_text())
    assert shipped["target"]["width"] == 9  # as shipped, it fits
