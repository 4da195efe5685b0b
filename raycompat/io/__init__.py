"""One I/O layer: local and S3 paths, credentials, run storage and weight files (no Ray).

:func:`filesystem` (:mod:`.uri`) opens every local and S3 path with one storage-options
setting; :func:`open_backend` (:mod:`.filesystems`) is the store's backend with conditional
writes; :func:`load_weights` (:mod:`.weights`, torch) reads a model's weight file. The names
load at their first use (the CLI's startup and the config checks import this package).
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "uri": ("filesystem", "fsspec_filesystem", "native_s3_options", "open_uri", "split_uri"),
        "filesystems": ("BACKENDS", "open_backend"),
        "credentials": ("redact", "scrub"),
        "weights": ("WeightsMismatchError", "load_state_dict", "load_weights"),
    },
)
