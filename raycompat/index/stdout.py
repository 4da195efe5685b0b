"""Keep a program's stdout its own while faiss runs: faiss prints from C++ with ``printf``.

faiss prints some progress past ``sys.stdout`` (``IO_FLAG_ONDISK_SAME_DIR: updating ondisk
filename ...`` when it loads an on-disk index, ``resizing ...`` when it grows a data file);
:func:`stdout_to_stderr` sends it to stderr around those calls, so ``raycompat search --json``
writes only its JSON to stdout. This module imports no faiss.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_LIBC = ctypes.CDLL(None)  # the process's C library: its fflush empties printf's buffer


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Within the block, what this process writes to its stdout file descriptor (1) goes to
    stderr: faiss prints from C++ with ``printf``, past ``sys.stdout``. Python's and C's stdout
    buffers are flushed on entry and exit, so earlier output keeps its place and nothing printed
    inside reaches stdout later. Other threads' stdout writes in the block go to stderr too."""
    if sys.stdout is not None:
        sys.stdout.flush()
    _LIBC.fflush(None)
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all: nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        _LIBC.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
