"""One I/O layer: local and S3 paths, credentials, run storage and weight files (no Ray)."""
