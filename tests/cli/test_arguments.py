"""Every option of every ``raycompat`` subcommand has help text, and every subcommand an example
that parses (``raycompat/cli/commands/``; issue 23, item 4).

The walk reads argparse's own tables (``_actions``, the subparsers' ``choices``), so it checks
every subcommand in the parser, whoever added it, nested ones (``index build``) included.
"""

from __future__ import annotations

import argparse
import shlex

import pytest

from raycompat.cli.app import main, parser
from raycompat.cli.arguments import package_version
from raycompat.cli.commands import REGISTRY

EXAMPLE = "example: raycompat "


def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: sub for action in actions for name, sub in action.choices.items()}


def walk(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(path, parser)`` for ``p`` and every subcommand below it, depth first."""
    yield path, p
    for name, sub in _subcommands(p).items():
        yield from walk(sub, (*path, name))


def problems(top: argparse.ArgumentParser) -> list[str]:
    """Options without help, commands without a help line or an ``example: raycompat <cmd>``
    line, and examples that do not parse."""
    found = []
    for path, p in walk(top):
        where = " ".join(("raycompat", *path))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                lines = {a.dest: a.help for a in action._choices_actions}
                found += [f"{where} {n}: no help line" for n in action.choices if not lines.get(n)]
            elif not action.help or action.help == argparse.SUPPRESS:
                found.append(f"{where} {'/'.join(action.option_strings) or action.dest}: no help")
        if path and _example(p, path) is None:
            found.append(f"{where}: no '{EXAMPLE}{' '.join(path)} ...' line in its description")
        elif path and not _subcommands(p):
            found += _parse_problem(top, _example(p, path))
    return found


def _example(p: argparse.ArgumentParser, path: tuple[str, ...]) -> str | None:
    want = EXAMPLE + " ".join(path)
    lines = [line.strip() for line in (p.description or "").splitlines()]
    return next((line for line in lines if line.startswith(want)), None)


def _parse_problem(top: argparse.ArgumentParser, example: str) -> list[str]:
    argv = shlex.split(example.removeprefix("example: "))[1:]
    try:
        top.parse_args(argv)
    except SystemExit:
        return [f"{example!r} does not parse"]
    return []


def test_every_option_has_help_and_every_command_a_parsing_example():
    top = parser()
    assert set(_subcommands(top)) >= set(REGISTRY)  # the walk sees the whole registry
    assert problems(top) == []


def test_the_walk_catches_a_missing_help_example_or_a_broken_example():
    top = argparse.ArgumentParser(prog="raycompat")
    sub = top.add_subparsers(dest="command")
    bare = sub.add_parser("bare")  # no help line, no example
    bare.add_argument("--store")  # no help
    wrong = sub.add_parser("wrong", help="h", description="example: raycompat wrong --nope")
    wrong.add_argument("--store", help="h")
    found = problems(top)
    assert "raycompat bare: no help line" in found
    assert "raycompat bare --store: no help" in found
    assert any(p.startswith("raycompat bare: no 'example: raycompat bare") for p in found)
    assert "'example: raycompat wrong --nope' does not parse" in found


def test_subcommand_help_ends_with_its_example(capsys):
    with pytest.raises(SystemExit) as done:
        main(["galleries", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "example: raycompat galleries --store " in out


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"raycompat {package_version()}"
    assert package_version()[0].isdigit()  # installed (`pip install -e .`), not "unknown"


@pytest.mark.parametrize(
    "argv, positionals",
    [
        ("search g a.png b.png --model m", {"gallery": "g", "images": ["a.png", "b.png"]}),
        ("search g --model m a.png b.png", {"gallery": "g", "images": ["a.png", "b.png"]}),
        ("search g --ids 1 2 --model m", {"gallery": "g", "images": [], "ids": ["1", "2"]}),
        ("adopt g s3://b/t --version v --model m", {"gallery": "g", "uri": "s3://b/t"}),
        ("export g /tmp/t --version v --format delta", {"gallery": "g", "target": "/tmp/t"}),
        ("index build g --version v", {"gallery": "g"}),
    ],
)
def test_the_gallery_is_the_first_positional_of_every_command(argv, positionals):
    """One convention (issue 39): GALLERY first, as versions, history, promote and index take it;
    positionals and options mix."""
    args = vars(parser().parse_args([*argv.split(), "--store", "s"]))
    assert {key: args[key] for key in positionals} == positionals


@pytest.mark.parametrize(
    "command", ["search --ids 1 --model m", "export --version v --format delta /tmp/t"]
)
def test_the_older_gallery_flag_is_refused(command, capsys):
    """``--gallery G`` is gone (no release ever took it); naming it is a usage error."""
    with pytest.raises(SystemExit) as done:
        main([*command.split(), "--gallery", "g", "--store", "s"])
    assert done.value.code == 2 and "--gallery" in capsys.readouterr().err


def test_a_missing_gallery_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        main(["search", "--ids", "1", "--model", "m", "--store", "s"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "the following arguments are required: gallery" in err
