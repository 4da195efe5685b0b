"""raycompat: upgrade the embedding model of a retrieval gallery without backfilling it.

The packages are the API (docs/api.md); the one name here is the way into a gallery from a
Python program: :func:`open_gallery` (``raycompat/service/gallery.py``), a :class:`Gallery`
searched many times from an index loaded once, following the store's serving records.
Exported lazily: ``import raycompat`` imports none of the packages.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__, {"service.gallery": ("Gallery", "open_gallery")}
)
