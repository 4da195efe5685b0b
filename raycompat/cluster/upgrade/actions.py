"""What an upgrade decision does to the store: publish a model, extract, transform, or
partially backfill (Ray Data).

:class:`Publisher` carries out one :class:`~raycompat.upgrade.policy.Decision`. Every write is
gated: a version is committed only after ``verify`` has checked the staged rows against the
model that will query them (a failed check aborts the staging area and turns the decision into a
refusal that says why), and a model is registered only with its grant.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from raycompat.cluster.pipelines import extract_version, transform_version
from raycompat.cluster.pipelines.backfill import partial_backfill_version
from raycompat.cluster.upgrade import steps
from raycompat.config.upgrade import (
    PartialBackfillSpec,
    UpgradeConfig,
    UpgradeSpec,
    gallery_version_of,
    partial_backfill_of,
)
from raycompat.errors import VerificationError
from raycompat.store import GalleryStore, VersionInfo
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.transformations import Fit
from raycompat.upgrade.evaluate import EvalData
from raycompat.upgrade.policy import Decision

log = logging.getLogger(__name__)

RELATION = {
    "initial": "extracted",
    "compatible": "compatible",
    "transform": "transformed",
    "backfill": "extracted",
    # h(current) with some rows re-extracted: served like a transformed version; the grant's
    # evidence says how much was re-extracted ("partial_backfill")
    "partial_backfill": "transformed",
    # the stored gallery as it is, searched through the candidate's fitted query map
    "adapt": "adapted",
}


@dataclass
class Candidate:
    """A trained candidate, judged against the gallery: what :meth:`Publisher.carry_out` needs."""

    position: int  # its entry in the history (names the version it may write)
    spec: UpgradeSpec
    directory: str  # its local model files (and ``h.*`` for FCT)
    features: np.ndarray  # (N, d) test features
    current: VersionInfo  # the gallery version it was judged against
    written: VersionInfo | None  # its version, when an earlier run wrote it and stopped
    old_self: float  # M(old, old): the gallery model's self-test that a rewrite must beat
    proof: dict  # the evidence its grant carries ("direct", "transformed", ...)
    parent: str  # the gallery model's version
    query_map: Fit | None = None  # procrustes, affine, adapter: stored with its grant


class Publisher:
    def __init__(
        self, cfg: UpgradeConfig, store: GalleryStore, catalog: Catalog, data: EvalData
    ) -> None:
        self.cfg, self.store, self.catalog, self.data = cfg, store, catalog, data
        self.gallery = cfg.store.gallery

    def carry_out(self, decision: Decision, candidate: Candidate) -> tuple[Decision, str | None]:
        """Write the version ``decision`` asks for (unless an earlier run wrote it), then
        register the candidate with its grant. Returns the decision (a refusal when the written
        version failed its check) and the version the candidate queries (None if refused)."""
        if decision.action == "refuse":
            return decision, None
        try:
            version, proof = self._write_version(decision.action, candidate)
        except VerificationError as err:
            log.error("%s: %s", candidate.spec.model_version, err)
            return Decision(
                "refuse",
                f"{decision.reason}; but the written version failed its "
                f"check before publishing: {err}",
            ), None
        self.publish(
            candidate.spec,
            candidate.parent,
            candidate.directory,
            candidate.features.shape[1],
            version,
            RELATION[decision.action],
            {"reason": decision.reason, **proof},
            candidate.query_map if decision.action == "adapt" else None,
        )
        return decision, version

    def act(self, position, spec, decision: Decision, *fields) -> tuple[Decision, str | None]:
        """:meth:`carry_out` with the candidate given field by field, as 0.2 called it:
        ``position, spec, decision``, then :class:`Candidate`'s other fields in order."""
        return self.carry_out(decision, Candidate(position, spec, *fields))

    def _write_version(self, action: str, c: Candidate) -> tuple[str, dict]:
        """The version the candidate will query under ``action``, written unless ``c.written``
        holds it already, and the evidence its grant carries. ``compatible``: the current one."""
        if action not in ("transform", "backfill", "partial_backfill"):
            return c.current.version, c.proof
        version = gallery_version_of(self.cfg, c.position)
        if action == "partial_backfill":
            backfilled = self._partial_backfill_evidence(c, version)
            return version, {**c.proof, "partial_backfill": backfilled}
        if c.written is None:  # else an earlier run wrote it and stopped before the grant
            if action == "transform":
                self.transform(c.spec, c.directory, c.features, c.current, version, c.old_self)
            else:
                self.extract(c.spec, c.directory, c.features, version)
        return version, c.proof

    def _partial_backfill_evidence(self, c: Candidate, version: str) -> dict:
        """Partially backfill ``version`` (unless ``c.written`` holds it); the grant's
        ``partial_backfill`` evidence: budget, order and rows re-extracted."""
        backfill = partial_backfill_of(c.spec, self.cfg.policy)
        if c.written is None:
            extracted = self.partial_backfill(
                c.spec, backfill, c.directory, c.features, c.current, version, c.old_self
            )
        else:  # an earlier run published it and stopped before the grant; the pipeline
            # commits exactly round(budget * rows) extracted rows
            extracted = int(np.rint(backfill.budget * c.written.rows))
        return {"budget": backfill.budget, "order": backfill.order, "extracted": extracted}

    def publish(
        self, spec, parent, directory, width, version, relation, evidence, query_map=None
    ) -> None:
        """Model files, record and grant (each create-if-absent: a rerun is a no-op); with
        ``query_map``, the map is stored beside the version and the grant names it
        (``serving/query_adapters.py``)."""
        record = ModelRecord(
            spec.model_version,
            "",
            width,
            spec.method,
            parent,
            run=f"{self.cfg.name}-{spec.model_version}",
        )
        grant = QueryGrant(self.gallery, version, spec.model_version, relation, evidence)
        steps.publish_model(self.catalog, record, directory, grant, query_map)

    def _staged_test_rows(self, staging) -> np.ndarray | None:
        """The staged vectors of the test images, in test order; None (logged) when the gallery
        does not hold them, which leaves the staged data to the commit's own checks."""
        staged = steps.rows_of(staging.filesystem, staging.files(), self.data.rows, staging.uri)
        if staged is None:
            log.warning("%s does not hold the test images: checked by commit only", staging.uri)
        return staged

    def extract(self, spec, directory: str, features: np.ndarray, version: str) -> None:
        """Embed the gallery images into ``version``; published only if the staged vectors of
        the test images are the model's features (cosine >= 0.999)."""
        width = features.shape[1]
        expected = F.normalize(torch.from_numpy(features), dim=1).numpy()

        def verify(staging) -> None:
            staged = self._staged_test_rows(staging)
            if staged is None:
                return
            cosine = np.sum(F.normalize(torch.from_numpy(staged), dim=1).numpy() * expected, 1)
            if cosine.min() < 0.999:
                staging.abort()
                raise VerificationError(
                    f"{staging.uri}: row {self.data.rows[cosine.argmin()]} is not the model's "
                    f"embedding of that image (cosine {cosine.min():.4f})"
                )

        target = VersionInfo(
            version,
            spec.model_version,
            width,
            self.cfg.normalized,
            f"{version} = extract({spec.model_version})",
        )
        extract_version(
            self.store,
            self.gallery,
            target,
            directory,
            self.cfg.gallery_images,
            self.cfg.pipeline,
            staging_name=f"upgrade-{spec.model_version}",
            verify=verify,
        )

    def _beats_old_self_test(self, features: np.ndarray, old_self: float, rows: str):
        """A ``verify`` hook: the new model's queries against the staged rows of the test
        images must beat the old self-test (FCT's criterion), else the staging is aborted."""

        def verify(staging) -> None:
            staged = self._staged_test_rows(staging)
            if staged is None:
                return
            cross = self.data.score(features, staged)
            log.info(
                "%s: M(new, staged) = %.2f%% vs old self-test %.2f%%",
                staging.uri,
                cross * 100,
                old_self * 100,
            )
            if not cross > old_self:
                staging.abort()
                raise VerificationError(
                    f"{staging.uri}: the new model's queries against the {rows} rows score "
                    f"{cross:.2%}, not above the old self-test {old_self:.2%}"
                )

        return verify

    def transform(
        self,
        spec,
        directory: str,
        features: np.ndarray,
        current: VersionInfo,
        version: str,
        old_self: float,
    ) -> None:
        """``version = h(current)``; published only if the new model's queries against the
        staged rows of the test images beat the old self-test (FCT's criterion)."""
        verify = self._beats_old_self_test(features, old_self, "transformed")
        target = VersionInfo(
            version,
            spec.model_version,
            features.shape[1],
            False,
            f"{version} = h_{spec.model_version}({current.version})",
        )
        transform_version(
            self.store,
            self.gallery,
            current.version,
            target,
            directory,
            None,
            self.cfg.pipeline,
            f"upgrade-{spec.model_version}",
            verify,
        )

    def partial_backfill(
        self,
        spec,
        backfill: PartialBackfillSpec,
        directory: str,
        features: np.ndarray,
        current: VersionInfo,
        version: str,
        old_self: float,
    ) -> int:
        """``version = h(current)`` with ``backfill.budget`` of its rows re-extracted by the new
        model (from the gallery images), most uncertain first (FastFill) or in random order;
        published only if the new model's queries against the staged rows of the test images
        beat the old self-test. Returns the number of rows re-extracted."""
        target = VersionInfo(
            version,
            spec.model_version,
            features.shape[1],
            False,  # h's rows are not normalised, so neither are the extracted ones
            f"{version} = partial_backfill({current.version})",  # the pipeline adds the rest
        )
        result = partial_backfill_version(
            self.store,
            self.gallery,
            current.version,
            target,
            directory,
            directory,
            self.cfg.gallery_images,
            backfill.budget,
            order=backfill.order,
            seed=self.cfg.training.seed,
            options=self.cfg.pipeline,
            staging_name=f"upgrade-{spec.model_version}",
            verify=self._beats_old_self_test(features, old_self, "partially backfilled"),
        )
        log.info(
            "%s: %s published, %d rows re-extracted",
            spec.model_version,
            result["version"].version,
            result["extracted"],
        )
        return int(result["extracted"])
