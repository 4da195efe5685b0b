"""One ``raycompat`` subcommand, defined once: :class:`Command`.

A command module (``raycompat/cli/commands/<group>.py``) defines each of its commands as one
``Command``: its name, ``--help`` line and example, the function adding its arguments, its
handler and its renderer. ``raycompat/cli/commands/__init__.py`` registers every group's
commands, and ``raycompat/cli/app.py`` builds the parser from that registry and dispatches.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from raycompat.cli.errors import RESTARTS

PROG = "raycompat"  # the console script, the prefix of every error line
Handler = Callable[[argparse.Namespace], "dict | str"]


@dataclass(frozen=True)
class Command:
    """A subcommand.

    Attributes:
        name: what follows ``raycompat`` on the command line.
        help: its line in ``raycompat --help``.
        add_arguments: adds its arguments to its parser (a
            :class:`~raycompat.cli.arguments.CommandParser`).
        handler: ``args -> dict | str``: a ``str`` is printed as is; a ``dict`` as JSON with
            ``--json`` (or without a renderer), else through ``render``. A ``dict`` with
            ``"corrupt"`` records exits 1.
        render: ``dict -> str``, the text a person reads (aligned tables, ``cli/tables.py``).
        example: a command line starting ``raycompat ``, the last line of its ``--help``.
        description: its ``--help`` text (default: the help line).
        as_json: takes ``--json`` (JSON instead of a table); False where the command adds it
            itself or has no JSON form.
        check: ``args -> message | None``, run before the handler: a message is a usage error,
            one line, exit 2 (what argparse cannot say, e.g. "images, --vectors or --ids").
        resumes: what rerunning it does after a Ctrl-C, the end of its one line
            ``raycompat: interrupted; <resumes>`` (exit 130, ``cli/errors.py``).
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Handler
    render: Callable[[dict], str] | None = None
    example: str | None = None
    description: str | None = None
    as_json: bool = True
    check: Callable[[argparse.Namespace], str | None] | None = None
    resumes: str = RESTARTS

    def help_text(self) -> str:
        """Its ``--help`` text: the description (or help line), then the example."""
        text = self.description or textwrap.fill(self.help, 78)
        return f"{text}\n\nexample: {self.example}" if self.example else text


def command_group(
    name: str,
    help: str,
    actions: tuple[Command, ...],
    *,
    description: str,
    render: Callable[[dict], str] | None = None,
    resumes: str = RESTARTS,
) -> Command:
    """A command whose first argument names one of ``actions`` (``raycompat index build``,
    ``raycompat alias set``): each action a subparser with its own arguments, ``--json`` and
    example; the group's handler dispatches to the action named."""
    from raycompat.cli.arguments import global_flags

    dest = f"{name}_command"
    handlers = {action.name: action.handler for action in actions}
    names = ",".join(handlers)

    def add_actions(p: argparse.ArgumentParser) -> None:
        sub = p.add_subparsers(dest=dest, required=True, metavar=f"{{{names}}}")
        for action in actions:
            parser = sub.add_parser(
                action.name,
                help=action.help,
                description=f"{action.help}\n\nexample: {action.example}",
                parents=[global_flags()],  # --debug/--verbose after the action too
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
            action.add_arguments(parser)

    def dispatch(args: argparse.Namespace) -> dict | str:
        return handlers[getattr(args, dest)](args)

    return Command(
        name,
        help,
        add_actions,
        dispatch,
        render,
        example=actions[0].example,
        description=description,
        as_json=False,  # each action takes --json itself
        resumes=resumes,
    )
