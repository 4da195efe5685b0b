"""One entry of an upgrade history, end to end: train, evaluate, decide, act (the Ray layer).

:class:`Upgrader` keeps what the history has produced so far (every evaluated model's test
features, in order) and runs one entry at a time:

- already granted in the catalog (an earlier run published it): nothing is redone; its features
  are re-read from the stored model so it keeps its row in the matrix;
- the store has no version yet: the initial model is trained and the gallery extracted with it;
- otherwise the candidate is trained against the model the gallery is stored in, scored, and
  the decision (:mod:`raycompat.upgrade.policy`) is carried out.

Every write is gated: a version is committed only after ``verify`` has checked the staged rows
against the model that will query them, and a model is registered only with its grant.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from raycompat.methods import METHODS
from raycompat.pipelines import extract_version, load_transformation, transform_version
from raycompat.store import GalleryStore, VersionInfo
from raycompat.store.catalog import Catalog, ModelRecord, QueryGrant
from raycompat.store.errors import VerificationError
from raycompat.train.export import load_exported_model
from raycompat.train.fct_fit import transform_features
from raycompat.upgrade import steps
from raycompat.upgrade.config import UpgradeConfig, gallery_version_of
from raycompat.upgrade.evaluate import (
    EvalData,
    evidence,
    evidence_on_classes,
    model_features,
)
from raycompat.upgrade.policy import Decision, decide
from raycompat.upgrade.report import Outcome

log = logging.getLogger(__name__)

RELATION = {
    "initial": "extracted",
    "compatible": "compatible",
    "transform": "transformed",
    "backfill": "extracted",
}


class Upgrader:
    def __init__(
        self, cfg: UpgradeConfig, store: GalleryStore, catalog: Catalog, data: EvalData
    ) -> None:
        self.cfg, self.store, self.catalog, self.data = cfg, store, catalog, data
        self.gallery = cfg.store.gallery
        self.work = os.path.abspath(os.path.join(cfg.work_dir, cfg.name))
        self.order: list[str] = []
        self.features: dict[str, np.ndarray] = {}

    # ---- bookkeeping -------------------------------------------------------------------------

    def _add(self, name: str, features: np.ndarray) -> None:
        if name not in self.features:
            self.order.append(name)
        self.features[name] = features

    def load_registered(self) -> None:
        """Every model the catalog already holds gets its row, in registration order."""
        for record in self.catalog.models():
            self._add(record.model_version, self.stored_features(record.model_version))

    def stored_features(self, model_version: str) -> np.ndarray:
        """Test features of a registered model, from its stored files (cached in the work dir)."""
        cache = os.path.join(self.work, "features", f"{model_version}.npy")
        if os.path.isfile(cache):
            return np.load(cache, allow_pickle=False)
        parent = steps.parent_of(self.catalog, model_version, self.work)
        features = model_features(load_exported_model(parent.directory)[0], self.data)
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        np.save(cache, features)
        return features

    def features_2d(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        labels = np.asarray(self.data.eval_set.labels)
        return {n: (f, labels) for n, f in self.features.items() if f.shape[1] == 2}

    def _train(self, spec, method: str, parent, suffix: str = "") -> tuple[str, np.ndarray]:
        name = f"{self.cfg.name}-{spec.model_version}{suffix}"
        train_cfg = steps.train_config(self.cfg, spec, method, name, parent)
        directory = steps.train_candidate(
            train_cfg, os.path.join(self.work, "candidates", spec.model_version + suffix)
        )
        return directory, steps.test_features(directory)

    # ---- one entry ---------------------------------------------------------------------------

    def run(self, position: int) -> Outcome:
        spec = self.cfg.upgrades[position]
        grant = steps.existing_grant(self.catalog, self.gallery, spec.model_version)
        if grant is not None:
            return self._resumed(spec, grant)
        versions = self.store.versions(self.gallery)
        mine = [v for v in versions if v.model_version == spec.model_version]
        others = [v for v in versions if v.model_version != spec.model_version]
        if not others:
            return self._initial(position, spec, mine[0] if mine else None)
        return self._upgrade(position, spec, others[-1], mine[0] if mine else None)

    def _resumed(self, spec, grant: QueryGrant) -> Outcome:
        log.info(
            "%s: already published (%s %s); nothing to do",
            spec.model_version,
            grant.relation,
            grant.gallery_version,
        )
        self._add(spec.model_version, self.stored_features(spec.model_version))
        record = self.catalog.model(spec.model_version)
        # "extracted" is the initial model's grant (no parent) or a backfill's (a parent).
        action = {"compatible": "compatible", "transformed": "transform"}.get(
            grant.relation, "initial" if record.parent is None else "backfill"
        )
        return Outcome(
            spec.model_version,
            spec.method,
            spec.classes,
            action,
            grant.evidence.get("reason", ""),
            record.parent,
            grant.gallery_version,
            {k: v for k, v in grant.evidence.items() if isinstance(v, dict)},
            resumed=True,
        )

    def _initial(self, position: int, spec, mine: VersionInfo | None) -> Outcome:
        seconds: dict[str, float] = {}
        t = time.perf_counter()
        directory, features = self._train(spec, spec.method, None)
        seconds["train"] = time.perf_counter() - t
        self._add(spec.model_version, features)
        version = gallery_version_of(self.cfg, position)
        self_test = self.data.score(features, features)
        reason = f"initial model: the gallery is extracted with it (self-test {self_test:.4f})"
        t = time.perf_counter()
        if mine is None:  # else an earlier run published it and stopped before registering
            self._extract(spec, directory, features, version)
        self._publish(
            spec,
            None,
            directory,
            features.shape[1],
            version,
            "extracted",
            {"reason": reason, "self_test": self_test},
        )
        seconds["publish"] = time.perf_counter() - t
        return Outcome(
            spec.model_version,
            spec.method,
            spec.classes,
            "initial",
            reason,
            gallery_version=version,
            seconds=seconds,
        )

    def _upgrade(
        self, position: int, spec, current: VersionInfo, mine: VersionInfo | None
    ) -> Outcome:
        seconds: dict[str, float] = {}
        parent = steps.parent_of(self.catalog, current.model_version, self.work)
        t = time.perf_counter()
        directory, features = self._train(spec, spec.method, parent)
        seconds["train"] = time.perf_counter() - t

        # Evaluate against what the service searches: the stored rows of the test images when
        # the gallery holds them, else the gallery model's features.
        t = time.perf_counter()
        old = self.stored_features(parent.model_version)
        self._add(parent.model_version, old)
        gallery = steps.version_rows(self.store, self.gallery, current.version, self.data.rows)
        gallery = old if gallery is None else gallery
        old_self = self.data.score(old, gallery)
        direct = evidence(self.data, features, gallery, old_self, parent.model_version)
        self._add(spec.model_version, features)
        seconds["evaluate"] = time.perf_counter() - t

        t = time.perf_counter()
        baselines = {}
        for method in spec.baselines:
            _, base_features = self._train(spec, method, parent, suffix=f"-{method}")
            baselines[method] = evidence(
                self.data, base_features, gallery, old_self, parent.model_version
            ).as_dict()
            seen = evidence_on_classes(
                self.data, parent.classes, base_features, gallery, old, parent.model_version
            )
            if seen is not None:
                baselines[f"{method}, classes < {parent.classes} only"] = seen.as_dict()
        if spec.baselines:
            seconds["baselines"] = time.perf_counter() - t

        fct = None
        if METHODS.get(spec.method).needs_transformation:
            t = time.perf_counter()
            steps.train_fct(self.cfg, spec, parent, directory, current.normalized, self.work)
            h = load_transformation(directory)
            fct = evidence(
                self.data,
                features,
                transform_features(h, gallery),
                old_self,
                parent.model_version,
                transformed=True,
            )
            seconds["fct"] = time.perf_counter() - t
        decision = decide(direct, fct, self.cfg.policy)
        log.info("%s: %s (%s)", spec.model_version, decision.action, decision.reason)
        proof = {"direct": direct.as_dict(), **({"transformed": fct.as_dict()} if fct else {})}
        seen = evidence_on_classes(
            self.data, parent.classes, features, gallery, old, parent.model_version
        )
        if seen is not None:  # reported, not decisive: the service searches every image
            proof["seen_classes"] = {**seen.as_dict(), "classes": parent.classes}

        t = time.perf_counter()
        decision, version = self._act(
            position,
            spec,
            decision,
            directory,
            features,
            current,
            mine,
            old_self,
            proof,
            parent.model_version,
        )
        seconds["publish"] = time.perf_counter() - t
        return Outcome(
            spec.model_version,
            spec.method,
            spec.classes,
            decision.action,
            decision.reason,
            parent.model_version,
            version,
            proof,
            baselines,
            seconds,
        )

    # ---- actions -----------------------------------------------------------------------------

    def _act(
        self,
        position,
        spec,
        decision: Decision,
        directory,
        features,
        current,
        mine,
        old_self,
        proof,
        parent,
    ) -> tuple[Decision, str | None]:
        if decision.action == "refuse":
            return decision, None
        version = current.version
        try:
            if decision.action == "transform":
                version = gallery_version_of(self.cfg, position)
                if mine is None:
                    self._transform(spec, directory, features, current, version, old_self)
            elif decision.action == "backfill":
                version = gallery_version_of(self.cfg, position)
                if mine is None:
                    self._extract(spec, directory, features, version)
        except VerificationError as err:
            log.error("%s: %s", spec.model_version, err)
            return Decision(
                "refuse",
                f"{decision.reason}; but the written version failed its "
                f"check before publishing: {err}",
            ), None
        self._publish(
            spec,
            parent,
            directory,
            features.shape[1],
            version,
            RELATION[decision.action],
            {"reason": decision.reason, **proof},
        )
        return decision, version

    def _publish(self, spec, parent, directory, width, version, relation, evidence) -> None:
        """Model files, record and grant (each create-if-absent: a rerun is a no-op)."""
        record = ModelRecord(
            spec.model_version,
            "",
            width,
            spec.method,
            parent,
            run=f"{self.cfg.name}-{spec.model_version}",
        )
        grant = QueryGrant(self.gallery, version, spec.model_version, relation, evidence)
        steps.publish_model(self.catalog, record, directory, grant)

    def _staged_test_rows(self, staging) -> np.ndarray | None:
        """The staged vectors of the test images, in test order; None (logged) when the gallery
        does not hold them, which leaves the staged data to the commit's own checks."""
        staged = steps.rows_of(staging.filesystem, staging.files(), self.data.rows, staging.uri)
        if staged is None:
            log.warning("%s does not hold the test images: checked by commit only", staging.uri)
        return staged

    def _extract(self, spec, directory: str, features: np.ndarray, version: str) -> None:
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

    def _transform(
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

        def verify(staging) -> None:
            staged = self._staged_test_rows(staging)
            if staged is None:
                return
            cross = self.data.score(features, staged)
            log.info(
                "%s: M(new, staged) = %.4f vs old self-test %.4f", staging.uri, cross, old_self
            )
            if not cross > old_self:
                staging.abort()
                raise VerificationError(
                    f"{staging.uri}: the new model's queries against the transformed rows score "
                    f"{cross:.4f}, not above the old self-test {old_self:.4f}"
                )

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
