"""Which Ray a job or command uses: one rule for every entry point (docs/cluster.md, "Which Ray a
job uses").

1. ``--address A`` (or the config's ``ray_address``): that cluster; ``auto`` is Ray's own word
   for the cluster ``ray start`` left on this machine, ``local`` a private Ray.
2. Else ``RAY_ADDRESS``: what ``ray job submit`` sets for its entrypoint, so a submitted job
   runs on the cluster it was submitted to.
3. Else a private local Ray that ends with the job or command.

Why private by default, where ``ray.init()`` would join "the latest cluster" it finds: on a
shared machine that is whichever user's cluster started last, and its jobs list then shows our
driver (issue 52, item 4). A cluster is joined only when named. The first line of every job and
command that starts Ray names the one it uses: where, nodes, CPUs and GPUs.
"""

from __future__ import annotations

import logging
import os

LOCAL = "local"  # a private Ray, even where RAY_ADDRESS is set
AUTO = "auto"  # the cluster `ray start` left on this machine

log = logging.getLogger("raycompat.ray")


def resolve_address(address: str | None) -> str:
    """The address the rule gives: ``address``, else ``RAY_ADDRESS``, else :data:`LOCAL`."""
    return address or os.environ.get("RAY_ADDRESS") or LOCAL


def cluster_line(address: str) -> str:
    """``Ray: <which>: N node(s), C CPU(s), G GPU(s)`` of the Ray this process is connected to,
    ``address`` being what it was started or joined with."""
    import ray

    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    resources = ray.cluster_resources()
    if address == LOCAL:
        where = "a private local Ray that ends with this process"
    else:
        where = f"the cluster at {ray.get_runtime_context().gcs_address} (address {address!r})"
    return (
        f"Ray: {where}: {nodes} node(s), {resources.get('CPU', 0):g} CPU(s), "
        f"{resources.get('GPU', 0):g} GPU(s)"
    )


def announce(address: str) -> None:
    """Log :func:`cluster_line` (the job's or command's line naming its Ray)."""
    log.info(cluster_line(address))
