"""The commit protocol: how staged files become a published version (docs/store.md, "Invariants").

- :mod:`~raycompat.store.commit.lease`: one live writer per staging area, and the generation
  (fencing token) every mutating step carries.
- :mod:`~raycompat.store.commit.staging`: write part files under a staging prefix, verify, commit.
- :mod:`~raycompat.store.commit.part_record`: what each writer says it wrote, one record per part.
- :mod:`~raycompat.store.commit.checks`: what a commit checks before publishing (every row, or
  only the part records).
- :mod:`~raycompat.store.commit.publish`: the one create-if-absent write of a version record that
  makes a version visible, for a commit and an adoption alike.
"""
