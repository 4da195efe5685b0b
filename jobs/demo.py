"""Compatibility demo on MNIST-5k (pure PyTorch core, no Ray needed).

    python jobs/demo.py [--config configs/demo_mnist.yaml] [key=value ...]

The upgrade job (``jobs/upgrade.py``) replaces this as the main entry point in a later issue.
"""

from raycompat.cli.demo import RESUMES, main
from raycompat.cli.errors import run_main

if __name__ == "__main__":
    run_main(main, resumes=RESUMES)
