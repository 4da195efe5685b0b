"""Named registries of builders (timm / open_clip style).

Every family of pluggable pieces (backbones, heads, compatibility methods, side-information
models, distances, datasets) has one :class:`Registry`. Behaviour is picked by a registered name,
never by string matching inside a training loop, and an unknown name is an error that lists the
valid names and the nearest one (``unknown compatibility method 'bctt'; valid names: ...; did you
mean 'bct'?``). That hint, :func:`did_you_mean`, is the one every message about a name that
names nothing ends with (a config key, a method option, a config file, a gallery, a model).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from raycompat.errors import UsageError

__all__ = ["Registry", "UnknownNameError", "did_you_mean"]

T = TypeVar("T")


def did_you_mean(names: str | Iterable[str], known: Iterable[str], prefix: str = "") -> str:
    """``"; did you mean 'x'?"``: for each of ``names`` (one name, or several), the closest of
    ``known`` (``difflib.get_close_matches``, cutoff 0.6), shown with ``prefix`` in front
    (``"training."``); ``""`` when none is close, so a message may always end with it."""
    known = list(known)
    names = [names] if isinstance(names, str) else list(names)
    close = [m for n in names for m in difflib.get_close_matches(n, known, n=1)]
    return f"; did you mean {' or '.join(repr(prefix + m) for m in close)}?" if close else ""


class UnknownNameError(UsageError, KeyError):
    """Raised when a name is not registered; the message lists the registered names and the
    nearest one (:func:`did_you_mean`)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0])


class Registry(Generic[T]):
    """A mapping from names to builders of one family.

    >>> heads = Registry("head")
    >>> @heads.register("linear")
    ... def linear(**kw): ...
    >>> heads.names()
    ['linear']
    """

    def __init__(self, family: str) -> None:
        self.family = family
        self._builders: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def decorator(builder: Callable[..., T]) -> Callable[..., T]:
            if name in self._builders:
                raise ValueError(f"{self.family} {name!r} is already registered")
            self._builders[name] = builder
            return builder

        return decorator

    def register_path(self, name: str, target: str) -> None:
        """Register ``"package.module:attribute"``, imported at its first :meth:`get`: a family
        whose members import torch can be listed, and its names checked, without torch."""
        if name in self._builders:
            raise ValueError(f"{self.family} {name!r} is already registered")
        self._builders[name] = target  # type: ignore[assignment]

    def get(self, name: str) -> Callable[..., T]:
        try:
            builder = self._builders[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.family} {name!r}; valid names: {', '.join(self.names())}"
                + did_you_mean(str(name), self.names())
            ) from None
        if isinstance(builder, str):
            module, _, attribute = builder.partition(":")
            builder = self._builders[name] = getattr(importlib.import_module(module), attribute)
        return builder

    def create(self, name: str, /, **kwargs: Any) -> T:
        return self.get(name)(**kwargs)

    def names(self) -> list[str]:
        return sorted(self._builders)

    def __contains__(self, name: object) -> bool:
        return name in self._builders

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, {self.names()})"
