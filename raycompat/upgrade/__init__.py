"""The upgrade job's Ray-free pieces: evaluation and decision (pure), report, lock, backfill
evaluation. Its config is :mod:`raycompat.config.upgrade`; the stages that ``jobs/upgrade.py``
runs in order are in :mod:`raycompat.cluster.upgrade` (Ray layer). See docs/upgrade.md."""
