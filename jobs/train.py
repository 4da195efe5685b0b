"""Train a sequence of compatible models with Ray Train and grow their compatibility matrix.

The recipe is :mod:`raycompat.cli.jobs.train` (also the console script ``raycompat-train``);
this file keeps ``python jobs/train.py`` and ``ray job submit ... -- python jobs/train.py``
working from a checkout, installed or not.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from raycompat.cli.jobs.train import main, run  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    run()
