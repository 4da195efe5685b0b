"""Train a sequence of compatible models with Ray Train and grow their compatibility matrix.

The recipe is :mod:`raycompat.cli.jobs.train` (also the console script ``raycompat-train``);
this file keeps ``python jobs/train.py`` and ``ray job submit ... -- python jobs/train.py``
working from a checkout, installed or not.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from raycompat.cli.interpreter import job_module  # noqa: E402

job = job_module("train")  # a Python without raycompat's requirements: one line, exit 2
main = job.main

__all__ = ["main"]

if __name__ == "__main__":
    job.run()
