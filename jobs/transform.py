"""Write a new gallery version with Ray Data: FCT transformation, extraction or identity upgrade.

The recipe is :mod:`raycompat.cli.jobs.transform` (also the console script ``raycompat-transform``);
this file keeps ``python jobs/transform.py`` and ``ray job submit ... -- python jobs/transform.py``
working from a checkout, installed or not.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from raycompat.cli.interpreter import job_module  # noqa: E402

job = job_module("transform")  # a Python without raycompat's requirements: one line, exit 2
main = job.main

__all__ = ["main"]

if __name__ == "__main__":
    job.run()
