"""The Ray layer: everything that imports Ray lives under this package (docs/architecture.md)."""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "console": ("init_ray",),
        "service": ("SearchService", "search_application"),
    },
)
