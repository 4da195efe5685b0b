"""Table formats: existing tables adopted in place as versions, versions exported as tables.

- :mod:`~raycompat.store.formats.adopt`: plan, summarize and publish an adoption; each file is
  checked by :mod:`~raycompat.store.formats.adopt_scan` (a Ray task per file or group).
- :mod:`~raycompat.store.formats.snapshot`: which format a folder holds and the files of its
  snapshot, read by :mod:`~raycompat.store.formats.adopt_delta` or
  :mod:`~raycompat.store.formats.adopt_iceberg`.
- :mod:`~raycompat.store.formats.external`: an adopted version's files, pinned by its record and
  read in place (the store's core reads versions through it).
- :mod:`~raycompat.store.formats.export`: a version written out as a Delta or Iceberg table
  (:mod:`~raycompat.store.formats.export_delta`, :mod:`~raycompat.store.formats.export_iceberg`).

No Ray here, and ``deltalake`` and ``pyiceberg`` are imported only when a table of their format
is read or written. The names below are imported from their modules on first use (PEP 562):
the store's core imports ``external`` while ``gallery`` is itself being imported, so this
package may not import ``adopt`` or ``export`` (which import the gallery) when it loads.
"""

from __future__ import annotations

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "adopt": (
            "AdoptOptionError",
            "AdoptionPlan",
            "FileReport",
            "plan_adoption",
            "publish_adopted",
            "register_adopted",
            "summarize",
        ),
        "adopt_scan": ("proven_unique", "scan_file"),
        "export": ("ExportOptionError", "export_version"),
        "snapshot": ("UnsupportedTableError", "parse_as_of"),
    },
)
