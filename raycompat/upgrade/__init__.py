"""The upgrade job's pieces: config, evaluation and decision (pure), report, and the Ray-layer
stages (``steps``, ``history``) that ``jobs/upgrade.py`` runs in order. See docs/upgrade.md."""
