"""Reading a store without writing to it: part files, vector columns, listings and lookups.

- :mod:`~raycompat.store.read.parquet`: part-file reads that name the file on every failure.
- :mod:`~raycompat.store.read.vectors`: a stored vector column as float32, float16 widened.
- :mod:`~raycompat.store.read.listing`: a gallery's versions as rows (``raycompat versions``).
- :mod:`~raycompat.store.read.lookup`: a name that names nothing, as a one-line error.
- :mod:`~raycompat.store.read.status`: what is being written now (``raycompat status``).

The checks every table passes on read are the table's own: :mod:`raycompat.store.schema`.
"""
