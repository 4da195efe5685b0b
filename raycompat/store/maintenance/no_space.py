"""A full disk, recognised in what the libraries that write raise, and its one-line error.

pyarrow raises an ``OSError`` with errno ENOSPC; faiss a ``RuntimeError`` (``write error in
FILE: ... (No space left on device)``) and delta-rs a ``DeltaError`` or ``OSError`` (``... (os
error 28)``), neither with an errno. The writers that clean up after a full disk (``raycompat
index build``: ``index/version_index.py``; ``raycompat export``: ``formats/export_delta.py``)
ask :func:`no_space_left`, remove their own partial files and raise :class:`NoSpaceError`
naming the path, instead of the storage hint the CLI gives other ``OSError`` s ("check --store,
--endpoint-url and the credentials"), which a full disk does not fit.
"""

from __future__ import annotations

import errno
import os

from raycompat.errors import StoreError

_NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"


class NoSpaceError(StoreError):
    """The disk filled while a writer wrote; the message names where, and what the writer
    removed. Exit 1 (a data error: nothing the user typed is wrong)."""


def no_space_left(error: BaseException) -> bool:
    """Whether ``error`` says the device is full: errno ENOSPC, or, from a library that keeps
    no errno (faiss, delta-rs), the C library's message for it or Rust's ``os error 28``."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    text = str(error)
    return _NO_SPACE in text or f"(os error {errno.ENOSPC})" in text
