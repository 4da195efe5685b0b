"""Upgrade a gallery's embedding model: train, evaluate, decide, publish, report.

The recipe is :mod:`raycompat.cli.jobs.upgrade` (also the console script ``raycompat-upgrade``);
this file keeps ``python jobs/upgrade.py`` and ``ray job submit ... -- python jobs/upgrade.py``
working from a checkout, installed or not.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from raycompat.cli.interpreter import job_module  # noqa: E402

job = job_module("upgrade")  # a Python without raycompat's requirements: one line, exit 2
main = job.main

__all__ = ["main"]

if __name__ == "__main__":
    job.run()
