"""The Ray layer: everything that imports Ray lives under this package (docs/architecture.md)."""
