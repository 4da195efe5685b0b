"""Maintenance of a store: what may be deleted, when, and how a store proves it is one.

- :mod:`~raycompat.store.maintenance.marker`: the store marker and its registered galleries.
- :mod:`~raycompat.store.maintenance.retention`: how old an unnamed file must be before gc may
  delete it, and the commit horizon that follows from it.
- :mod:`~raycompat.store.maintenance.gc`: plan and collect what killed jobs, rebuilt indexes and
  old versions leave (``raycompat gc``).
- :mod:`~raycompat.store.maintenance.no_space`: a full disk, recognised, and the writer's partial
  files removed.
"""
