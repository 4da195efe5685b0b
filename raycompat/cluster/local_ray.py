"""Ray for one CLI command: the cluster it names, or a local one that ends with the command.

``ray.init()`` without an address starts a local head whose GCS and raylet die with the
driver (Ray sets ``PR_SET_PDEATHSIG`` on them), but the dashboard and runtime-env agents, the
raylet's children, outlive a SIGKILLed driver: they see the raylet die and then wait on the
dead GCS to report it (issue 37: a killed ``raycompat adopt`` left them running). So
:func:`ray_for_command` starts the local head in a helper process with a process group of its
own (this module run as ``__main__``): the helper runs ``ray.init()``, writes the GCS address
on its stdout and reads a pipe from the command until it closes, which the kernel does however
the command ends (return, exception, SIGKILL). It then sends SIGTERM to every process of the
head: its descendants (the raylet puts each worker in a process group of its own) and its
process group (which also holds any process orphaned earlier), waits up to :data:`GRACE_S`
for them and sends SIGKILL to what is left, itself last: what Ray's own
``ray_process_reaper.py`` does to the driver's group where prctl is missing. The command
connects to the head as a second driver.

POSIX only (process groups); ``tests/cluster/test_local_ray.py`` SIGKILLs a running adopt.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import ray

from raycompat.cluster.which_ray import LOCAL, announce, resolve_address
from raycompat.errors import DataError

GRACE_S = 1.0  # between the SIGTERM and the SIGKILL of the head's processes


class LocalRayError(DataError, RuntimeError):
    """The local Ray head did not start; the message ends with what its helper wrote."""


@contextmanager
def ray_for_command(address: str | None) -> Iterator[None]:
    """Ray initialized for the ``with`` block of a command, as
    :mod:`raycompat.cluster.which_ray`'s rule says: the cluster at ``address`` or
    ``RAY_ADDRESS`` (which lives on), else (or with ``address="local"``) a local head that ends
    with the block or with this process, however it ends; no dashboard, the workers' output
    kept off the command's console, Ray's own "Connecting to ..." line too, and one line naming
    the Ray used. A Ray this process already initialized is used as it is."""
    if ray.is_initialized():
        yield
        return
    address = resolve_address(address)
    with ExitStack() as stack:
        where = stack.enter_context(local_head()) if address == LOCAL else address
        ray.init(
            address=where,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        stack.callback(ray.shutdown)  # before the head ends: the stack unwinds backwards
        announce(address)
        yield


@contextmanager
def local_head() -> Iterator[str]:
    """The GCS address of a local Ray head run by a helper process (module docstring); the
    head ends when the block does, or when this process dies."""
    with tempfile.TemporaryFile() as log:
        helper = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,  # its end here closes with this process, even on SIGKILL
            stdout=subprocess.PIPE,
            stderr=log,
            process_group=0,  # a group of its own, in this session: what it kills at the end
        )
        try:
            address = helper.stdout.readline().decode().strip()
            helper.stdout.close()
            if not address:
                helper.wait()
                log.seek(0)
                said = log.read().decode(errors="replace").strip().splitlines()
                raise LocalRayError(f"the local Ray did not start: {' | '.join(said[-3:])}")
            yield address
        finally:
            helper.stdin.close()
            helper.wait()  # it ends the head, then itself: GRACE_S later


def _serve_head() -> None:
    """The helper: start a local head, write its GCS address, and end the head once stdin
    closes (or ``ray.init`` fails)."""
    try:
        # "local": a new head, never a cluster another command or `ray start` left running
        # (ray.init() without an address joins the latest one it finds on this machine)
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
        print(ray.get_runtime_context().gcs_address, flush=True)
        sys.stdin.buffer.read()  # until the command's end of the pipe closes
    finally:
        _end_head()


def _end_head() -> None:
    """SIGTERM to this process's descendants and group, SIGKILL to those left after
    ``GRACE_S``, and to the group last (this process included)."""
    import psutil  # after ray: the copy Ray ships (ray/thirdparty_files), as Ray imports it

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # this process sends the SIGKILL
    head = psutil.Process().children(recursive=True)
    for process in head:
        _signal(process, signal.SIGTERM)
    os.killpg(0, signal.SIGTERM)
    _, alive = psutil.wait_procs(head, timeout=GRACE_S)
    for process in alive:
        _signal(process, signal.SIGKILL)
    os.killpg(0, signal.SIGKILL)


def _signal(process, signum: int) -> None:
    """``process.send_signal``, which checks the pid was not reused; one already gone is fine."""
    import psutil

    try:
        process.send_signal(signum)
    except psutil.NoSuchProcess:
        pass


if __name__ == "__main__":
    _serve_head()
