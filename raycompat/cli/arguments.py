"""The argument conventions every ``raycompat`` subcommand shares.

- Argument types that fail as usage errors, exit 2: :func:`duration_s`, :func:`positive_int`,
  :func:`as_of`.
- The gallery is the first positional argument of every command that names one
  (:func:`add_gallery`: ``raycompat versions mnist``, ``raycompat search mnist --ids 17``,
  ``raycompat index build mnist --version v1``).
- ``--debug`` and ``--verbose`` are accepted before or after the subcommand
  (:func:`global_flags`); ``--version`` looks the version up only when asked.
- Every subcommand parser is a :class:`CommandParser`.

``--store`` and its S3 options are in :mod:`raycompat.cli.store_options`. Imports stay light:
``--help`` loads neither torch nor Ray.
"""

from __future__ import annotations

import argparse
import sys

from raycompat.cli.errors import DEBUG_ENV, DEBUG_FLAG

STORE = "outputs/upgrade/store"  # the examples' store: what `python jobs/upgrade.py` writes
GALLERY_HELP = "a gallery of the store (an unknown name lists those that exist)"
RAY_ADDRESS_HELP = (
    "the Ray cluster to use: an address, 'auto' (the cluster `ray start` left on this machine) "
    "or 'local' (a private Ray that ends with the job or command, even a killed one); default: "
    "RAY_ADDRESS (set by `ray job submit`), else 'local' (docs/cluster.md, 'Which Ray a job "
    "uses')"
)
_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> float:
    """``"24h"``, ``"90m"``, ``"2d"``, ``"30s"`` or plain seconds -> seconds."""
    unit = text[-1:].lower()
    number = text[:-1] if unit in _DURATION else text
    try:
        value = float(number) * _DURATION.get(unit, 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration like 24h, 90m or 3600"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be >= 0")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (``--nprobe``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return value


def as_of(text: str) -> str:
    """``--as-of``, checked by argparse (a usage error, exit 2) and passed on as given."""
    from raycompat.store.formats import parse_as_of

    try:
        parse_as_of(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


# ---- the gallery -----------------------------------------------------------------------------


def add_gallery(p: argparse.ArgumentParser, help: str = GALLERY_HELP) -> None:
    """GALLERY, the first positional argument."""
    p.add_argument("gallery", help=help)


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser, with a habit plain argparse lacks.

    - Positionals and options mix in any order (``parse_intermixed_args``) where a variadic
      positional follows another (``search mnist --model m1 a.png b.png``): argparse alone
      would give the images to the first chunk of positionals, empty, and refuse the rest.
    """

    _inside = False  # parse_known_intermixed_args calls parse_known_args twice itself

    def parse_known_args(self, args=None, namespace=None):
        if self._inside:
            return super().parse_known_args(args, namespace)
        args = list(sys.argv[1:] if args is None else args)
        if not self._intermixed():
            namespace, extras = super().parse_known_args(args, namespace)
        else:
            self._inside = True
            try:
                namespace, extras = self.parse_known_intermixed_args(args, namespace)
            finally:
                self._inside = False
        return namespace, extras

    def _intermixed(self) -> bool:
        positionals = self._get_positional_actions()
        return len(positionals) > 1 and any(a.nargs == argparse.ZERO_OR_MORE for a in positionals)


# ---- flags of every command ------------------------------------------------------------------


def package_version() -> str:
    """The installed package's version (``importlib.metadata``; no torch, no Ray)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("raycompat")
    except PackageNotFoundError:  # a checkout used without `pip install -e .`
        return "unknown (not installed)"


class VersionAction(argparse.Action):
    """``--version``: looks the version up only when asked (the metadata scan of every
    installed distribution costs ~70 ms, which ``--help`` should not pay)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {package_version()}")  # stdout, as argparse's own "version"
        parser.exit()


def global_flags() -> argparse.ArgumentParser:
    """``--debug`` and ``--verbose``, a parent of the top parser and of every subcommand."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        DEBUG_FLAG,
        action="store_true",
        default=argparse.SUPPRESS,  # so a subcommand's default cannot reset the top-level flag
        help=f"show the traceback of an error (or set {DEBUG_ENV}=1)",
    )
    flags.add_argument(
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show our debug log lines too (weights read, datasets opened...)",
    )
    return flags


def json_flag() -> argparse.ArgumentParser:
    """``--json``, a parent of every command whose :class:`~raycompat.cli.command.Command` has
    ``as_json``."""
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="JSON instead of a table")
    return as_json
