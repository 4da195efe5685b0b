"""Deploy the search service on a Ray cluster (Ray Serve) and return; it serves until
``serve shutdown -y`` (the line it prints at the end).

The recipe is :mod:`raycompat.cli.jobs.deploy` (also the console script ``raycompat-deploy``);
this file keeps ``python jobs/deploy.py`` and ``ray job submit ... -- python jobs/deploy.py``
working from a checkout, installed or not.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from raycompat.cli.interpreter import job_module  # noqa: E402

job = job_module("deploy")  # a Python without raycompat's requirements: one line, exit 2
main = job.main

__all__ = ["main"]

if __name__ == "__main__":
    job.run()
