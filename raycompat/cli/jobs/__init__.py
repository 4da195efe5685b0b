"""The jobs' recipes, one module each, and their console scripts (``pyproject.toml``):

    raycompat-upgrade    raycompat.cli.jobs.upgrade     python jobs/upgrade.py
    raycompat-train      raycompat.cli.jobs.train       python jobs/train.py
    raycompat-transform  raycompat.cli.jobs.transform   python jobs/transform.py
    raycompat-tune       raycompat.cli.jobs.tune        python jobs/tune.py

Each defines ``main(argv=None)`` (load the config, build the pieces, run, write outputs) and
``run()``, the console script: ``main`` under ``run_main`` (one-line errors). ``jobs/*.py`` are
thin wrappers around them, so ``ray job submit ... -- python jobs/upgrade.py`` keeps working.
They import Ray inside ``main``, after the config is loaded and checked: ``--help`` and
``--print-config`` load neither torch nor Ray (``tests/cli/test_startup.py``).
"""
