"""Records about models, kept beside the galleries and never rewritten.

- :mod:`~raycompat.store.catalog.models`: the models and the gallery version each may query
  (:class:`~raycompat.store.catalog.models.Catalog`).
- :mod:`~raycompat.store.catalog.retired`: a tombstone per retired model.
- :mod:`~raycompat.store.catalog.decisions`: every upgrade judgement of a model, per attempt.
"""
