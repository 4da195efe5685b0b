"""raycompat.index.stdout: what C code prints inside ``stdout_to_stderr`` goes to stderr."""

from __future__ import annotations

import ctypes
import os

from raycompat.index.stdout import stdout_to_stderr

LIBC = ctypes.CDLL(None)


def test_c_printing_inside_the_block_goes_to_stderr(capfd):
    print("before", flush=False)
    with stdout_to_stderr():
        os.write(1, b"raw fd write\n")
        LIBC.printf(b"C printf\n")
    print("after")
    LIBC.fflush(None)
    out, err = capfd.readouterr()
    assert out == "before\nafter\n"
    assert "raw fd write" in err and "C printf" in err
