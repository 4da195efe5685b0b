"""Sweep compatibility trade-offs with Ray Tune over the training driver.

The recipe is :mod:`raycompat.cli.jobs.tune` (also the console script ``raycompat-tune``);
this file keeps ``python jobs/tune.py`` and ``ray job submit ... -- python jobs/tune.py``
working from a checkout, installed or not.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from raycompat.cli.interpreter import job_module  # noqa: E402

job = job_module("tune")  # a Python without raycompat's requirements: one line, exit 2
main = job.main

__all__ = ["main"]

if __name__ == "__main__":
    job.run()
