"""Names a user typed that name nothing: a one-line error listing the names that exist and the
nearest one (:func:`raycompat.registry.did_you_mean`, the hint every unknown name gets).

Every ``raycompat`` command looks up the galleries, models and versions it was given through
:func:`check_gallery`, :func:`model_record` and :func:`version_record`, so ``--gallery mnst``
answers ``no gallery 'mnst' in ROOT: galleries are mnist; did you mean 'mnist'?``
(:class:`~raycompat.errors.NotInStoreError`, exit 1 as before) instead of a missing grant.
A record that exists but cannot be read is still a
:class:`~raycompat.errors.CorruptFileError` (exit 1).
:func:`choices` is the tail of any such message (``report`` uses it for run folders).
"""

from __future__ import annotations

from collections.abc import Sequence

from raycompat.errors import (
    CorruptFileError,
    ManifestError,
    NotInStoreError,
    StoreError,
    UnsafePathError,
)
from raycompat.registry import did_you_mean
from raycompat.store.catalog.models import Catalog, ModelRecord
from raycompat.store.gallery import GalleryStore
from raycompat.store.manifest import VersionInfo


def choices(name: str, known: Sequence[str], plural: str) -> str:
    """``"<plural> are a, b; did you mean 'a'?"`` (the hint only when one is close)."""
    return f"{plural} are {', '.join(known) or '(none)'}{did_you_mean(name, known)}"


def unknown_name(what: str, name: str, known: Sequence[str], plural: str) -> NotInStoreError:
    """``"<what>: <plural> are ...; did you mean ...?"`` (exit 1)."""
    return NotInStoreError(f"{what}: {choices(name, known, plural)}")


def check_gallery(store: GalleryStore, gallery: str) -> None:
    """Raise :class:`NotInStoreError` unless ``gallery`` has a published version."""
    known = store.galleries()
    if gallery not in known:
        raise unknown_name(f"no gallery {gallery!r} in {store.uri()}", gallery, known, "galleries")


def model_record(catalog: Catalog, model_version: str) -> ModelRecord:
    """The registered model's record; an unregistered name lists the registered ones."""
    try:
        return catalog.model(model_version)
    except (CorruptFileError, UnsafePathError):
        raise
    except StoreError:
        known = [m.model_version for m in catalog.models_report()[0]]
        what = f"model {model_version!r} is not registered in {catalog.store.uri()}"
        raise unknown_name(what, model_version, known, "registered models") from None


def version_record(store: GalleryStore, gallery: str, version: str) -> VersionInfo:
    """The published version's record, after :func:`check_gallery`; an unknown version lists
    the gallery's versions."""
    check_gallery(store, gallery)
    try:
        return store.version(gallery, version)
    except (CorruptFileError, UnsafePathError):
        raise
    except ManifestError:
        known = [info.version for info in store.versions_report(gallery)[0]]
        if version in known:
            raise
        what = f"gallery {gallery!r} has no version {version!r}"
        raise unknown_name(what, version, known, "its versions") from None
