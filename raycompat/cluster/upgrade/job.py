"""One entry of an upgrade history, end to end: train, evaluate, decide, act (the Ray layer).

:class:`Upgrader` keeps what the history has produced so far (every evaluated model's test
features, in order: a :class:`~raycompat.upgrade.feature_cache.FeatureCache`) and runs one entry
at a time, as a plan of stages: what needs Ray or the store (training, fitting a map, reading
stored rows) is here, the scores are measured by the Ray-free
:class:`~raycompat.upgrade.evaluate.Reference`:

- already granted in the catalog (an earlier run published it): nothing is redone; its features
  are re-read from the stored model so it keeps its row in the matrix;
- refused or failed before under the same config (the standing attempt in
  ``<gallery>/_decisions/<model>/``, see :mod:`raycompat.store.catalog.decisions`): skipped, and the
  log says why, unless ``retry``;
- the store has no version yet: the initial model is trained and the gallery extracted with it;
- otherwise the candidate is trained against the model the gallery is stored in, scored, and
  the decision (:mod:`raycompat.upgrade.policy`) is carried out by
  :class:`~raycompat.cluster.upgrade.actions.Publisher`.

Every judgement is recorded as a new attempt (refused, failed or published); none is ever
replaced. A failure is not recorded once the model is granted (another job published it), and
with the job's ``lease`` (``raycompat.upgrade.lock``) nothing is recorded after it was lost.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from raycompat.cluster.train.fct_fit import transform_features, transform_with_uncertainty
from raycompat.cluster.upgrade import steps
from raycompat.cluster.upgrade.actions import Candidate, Publisher
from raycompat.config.upgrade import (
    UpgradeConfig,
    decision_digest,
    gallery_version_of,
    partial_backfill_of,
)
from raycompat.errors import StoreError
from raycompat.methods.catalog import method_entry
from raycompat.progress import Stages, plural
from raycompat.store import GalleryStore, VersionInfo
from raycompat.store.catalog.decisions import (
    DecisionConflictError,
    DecisionRecord,
    Decisions,
    standing,
)
from raycompat.store.catalog.models import Catalog, ModelRecord, QueryGrant
from raycompat.store.commit.lease import Lease
from raycompat.train.export import load_exported_model
from raycompat.transformations import load_transformation, save_transformation
from raycompat.upgrade.evaluate import (
    CandidateEvidence,
    EvalData,
    Parent,
    Reference,
    model_features,
)
from raycompat.upgrade.feature_cache import FeatureCache
from raycompat.upgrade.policy import Decision, decide, decide_adapted, gallery_map_decision
from raycompat.upgrade.report import Outcome

log = logging.getLogger(__name__)


class Upgrader:
    """Runs an upgrade history's entries (:meth:`run`, one position at a time) against one
    store and catalog, recording each judgement; :attr:`features` holds the matrix's rows."""

    def __init__(
        self,
        cfg: UpgradeConfig,
        store: GalleryStore,
        catalog: Catalog,
        data: EvalData,
        retry: bool = False,
        lease: Lease | None = None,
    ) -> None:
        self.cfg, self.store, self.catalog, self.data = cfg, store, catalog, data
        self.gallery = cfg.store.gallery
        self.publisher = Publisher(cfg, store, catalog, data)
        self.decisions = Decisions(store)
        self.retry = retry  # judge refused or failed entries again under an unchanged config
        self.lease = lease  # the job's (``raycompat.upgrade.lock``): checked before each record
        self.digest = ""  # of the entry being run (names its training runs)
        self.work = os.path.abspath(os.path.join(cfg.work_dir, cfg.name))
        # every evaluated model's test features, in matrix order, cached in the work dir
        self.features = FeatureCache(os.path.join(self.work, "features"))
        self.stages = Stages(len(cfg.upgrades))  # "[2/3] m2: training ..." before each stage

    # ---- bookkeeping -------------------------------------------------------------------------

    def load_registered(self) -> None:
        """Every model of this gallery's history the catalog already holds gets its row, in
        registration order: those the config names and those granted a version of the
        gallery. A model of another gallery is not loaded (its weights are not this job's),
        and one registered without weights (adopted) has no features to score: no row."""
        names = {u.model_version for u in self.cfg.upgrades}
        names |= {g.model_version for g in self.catalog.grants(self.gallery)}
        for record in self.catalog.models():
            if record.model_version in names:
                self._add_stored(record)

    def _add_stored(self, record: ModelRecord) -> None:
        """The registered model's row (its cached or stored features), unless it has none."""
        name = record.model_version
        if record.has_weights or self.features.is_cached(name):
            self.features.add(name, self.stored_features(name))
            return
        log.info("%s: registered without weights (adopted vectors): no row in the matrix", name)

    def stored_features(self, model_version: str) -> np.ndarray:
        """Test features of a registered model, from its stored files (cached in the work dir)."""
        cached = self.features.cached(model_version)
        if cached is not None:
            return cached
        parent = steps.parent_of(self.catalog, model_version, self.work)
        features = model_features(load_exported_model(parent.directory)[0], self.data)
        self.features.keep(model_version, features)
        return features

    def _say(self, spec, what: str) -> None:
        """Announce the next stage of ``spec``'s entry, before it starts."""
        self.stages.announce(spec.model_version, what)

    def _train(self, spec, method: str, parent, suffix: str = "") -> tuple[str, np.ndarray]:
        epochs = spec.epochs if spec.epochs is not None else self.cfg.training.epochs
        against = f"against {parent.model_version}" if parent else f"on {spec.classes} classes"
        name = f"{self.cfg.name}-{spec.model_version}-{self.digest[:8]}{suffix}"
        train_cfg = steps.train_config(self.cfg, spec, method, name, parent)
        if steps.trained_already(train_cfg):  # an interrupted run trained it: nothing to train
            self._say(spec, f"reading back the {method} model an earlier run trained {against}")
        else:
            budget = plural(epochs, "epoch")
            if self.cfg.training.stop.rule == "plateau":
                budget = f"to its validation plateau, at most {budget}"
            self._say(spec, f"training {method} {against} ({budget})")
        directory = steps.train_candidate(
            train_cfg, os.path.join(self.work, "candidates", spec.model_version + suffix)
        )
        return directory, steps.test_features(directory)

    # ---- one entry ---------------------------------------------------------------------------

    def run(self, position: int) -> Outcome:
        spec = self.cfg.upgrades[position]
        self.stages.begin(position + 1)
        grant = steps.existing_grant(self.catalog, self.gallery, spec.model_version)
        if grant is not None:
            return self._resumed(spec, grant)
        versions = self.store.versions(self.gallery)
        mine = [v for v in versions if v.model_version == spec.model_version]
        current = steps.gallery_before(versions, self.cfg.upgrades, position)
        self.digest = decision_digest(self.cfg, spec, self.digest_against(current))
        attempts = self.decisions.attempts(self.gallery, spec.model_version)
        prior, same = standing(attempts), standing(attempts, self.digest)
        if same is None and prior is not None and prior.against != self.digest_against(current):
            # judged against another gallery model than today's latest (a version published
            # since, an adopted table): unchanged if its config is, and then it stands
            if prior.digest == decision_digest(self.cfg, spec, prior.against):
                same = prior
        if same is not None and same.outcome != "published" and not self.retry:
            return self._skipped(spec, same)
        if prior is not None and prior.outcome != "published":
            why = "--retry" if same is not None else "its config changed"
            log.info("%s: %s before; judged again (%s)", spec.model_version, prior.outcome, why)
        try:
            if current is None:
                outcome = self._initial(position, spec, mine[0] if mine else None)
            else:
                outcome = self._upgrade(position, spec, current, mine[0] if mine else None)
        except Exception as error:
            self._record_failure(spec, f"{type(error).__name__}: {error}", current)
            raise
        refused = outcome.action == "refuse"
        if not refused and spec.model_version in self.features:
            self.features.keep(spec.model_version, self.features[spec.model_version])
        evidence = outcome.evidence if refused else {}
        self._record(spec, "refused" if refused else "published", outcome.reason, current, evidence)
        return outcome

    @staticmethod
    def digest_against(current) -> str | None:
        """The gallery model a decision against ``current`` (a version, or None) records."""
        return current and current.model_version

    def _record(self, spec, outcome: str, reason: str, current, evidence=None) -> None:
        """Record this judgement as the entry's next attempt (never over an earlier one)."""
        if self.lease is not None:
            self.lease.check(f"record the decision on {spec.model_version}")
        record = DecisionRecord(
            self.gallery,
            spec.model_version,
            outcome,
            reason.splitlines()[0] if reason else outcome,
            self.digest,
            current and current.model_version,
            evidence or {},
        )
        try:
            self.decisions.put(record)
        except DecisionConflictError as error:  # a concurrent run's record stands
            log.warning("%s: %s", spec.model_version, error)

    def _record_failure(self, spec, reason: str, current) -> None:
        """Record a failure, unless the model was published meanwhile (by another job) or this
        job lost its lease; it never replaces a refusal or publication (``standing``)."""
        if self.decisions.granted(self.gallery, spec.model_version):
            why = reason.splitlines()[0] if reason else "failed"
            log.warning(
                "%s: failed (%s), but it is published: not recorded", spec.model_version, why
            )
            return
        try:
            self._record(spec, "failed", reason, current)
        except StoreError as error:  # the lease was lost: the error at hand is what to raise
            log.warning("%s: failure not recorded: %s", spec.model_version, error)

    def _skipped(self, spec, prior: DecisionRecord) -> Outcome:
        """An entry refused or failed under this same config: not trained or judged again."""
        self._say(
            spec,
            f"{prior.outcome} on {prior.created} under this config ({prior.reason}); skipped. "
            "Pass --retry to judge it again.",
        )
        candidate = os.path.join(self.work, "candidates", spec.model_version)
        try:  # its row of the matrix, when the candidate is still in the work dir
            self.features.add(spec.model_version, steps.test_features(candidate))
        except (OSError, ValueError):
            log.info("%s: no candidate in %s, not in the matrix", spec.model_version, candidate)
        action = "refuse" if prior.outcome == "refused" else "failed"
        return Outcome(
            spec.model_version,
            spec.method,
            spec.classes,
            action,
            f"{prior.reason} (decided {prior.created}; skipped: same config, --retry to rerun)",
            prior.against,
            None,
            prior.evidence,
            resumed=True,
        )

    def _resumed(self, spec, grant: QueryGrant) -> Outcome:
        self._say(
            spec, f"already published ({grant.relation} {grant.gallery_version}); nothing to do"
        )
        record = self.catalog.model(spec.model_version)
        self._add_stored(record)
        # "extracted" is the initial model's grant (no parent) or a backfill's (a parent);
        # "transformed" an FCT rewrite, partial when its evidence says so.
        action = {"compatible": "compatible", "transformed": "transform", "adapted": "adapt"}.get(
            grant.relation, "initial" if record.parent is None else "backfill"
        )
        if action == "transform" and "partial_backfill" in grant.evidence:
            action = "partial_backfill"
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
        with _timed(seconds, "train"):
            directory, features = self._train(spec, spec.method, None)
        self.features.add(spec.model_version, features)
        version = gallery_version_of(self.cfg, position)
        self_test = self.data.score(features, features)
        reason = f"initial model: the gallery is extracted with it (self-test {self_test:.2%})"
        self._say(spec, f"extracting the gallery into {version}")
        with _timed(seconds, "publish"):
            if mine is None:  # else an earlier run published it and stopped before registering
                self.publisher.extract(spec, directory, features, version)
            self.publisher.publish(
                spec,
                None,
                directory,
                features.shape[1],
                version,
                "extracted",
                {"reason": reason, "self_test": self_test},
            )
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
        """Train the candidate against the gallery's model, score it (with its baselines and
        what its method adds: h(gallery) for FCT, a fitted map's), decide, then carry the
        decision out."""
        seconds: dict[str, float] = {}
        parent = steps.parent_of(self.catalog, current.model_version, self.work)
        with _timed(seconds, "train"):  # a map's method is trained alone, then its map fitted
            method = "independent" if method_entry(spec.method).fits_map else spec.method
            directory, features = self._train(spec, method, parent)
        self._say(spec, f"scoring against {parent.model_version}")
        with _timed(seconds, "evaluate"):
            reference = self._reference(parent, current)
            found = reference.judge(features)
            self.features.add(spec.model_version, features)
        baselines = {}
        if spec.baselines:
            with _timed(seconds, "baselines"):
                baselines = self._baselines(spec, reference)
        query_map, backfill = self._method_evidence(
            spec, reference, found, directory, current, seconds
        )
        decision = self._decide(spec, found)
        log.info("%s: %s (%s)", spec.model_version, decision.action, decision.reason)
        proof = found.proof()
        candidate = Candidate(
            position,
            spec,
            directory,
            features,
            current,
            mine,
            reference.old_self,
            proof,
            parent.model_version,
            query_map,
        )
        if decision.action != "refuse":
            self._say(spec, f"{decision.action}: writing and checking the gallery version")
        with _timed(seconds, "publish"):
            decision, version = self.publisher.carry_out(decision, candidate)
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
            backfill=backfill,
        )

    # ---- the stages of one upgrade: what needs Ray or the store, then the scores -------------
    # (the evidence itself is measured by raycompat.upgrade.evaluate.Reference, Ray-free)

    def _reference(self, parent: Parent, current: VersionInfo) -> Reference:
        """What the candidate is judged against (:meth:`Reference.of`): the gallery model's
        features (the matrix's row, in memory) and the stored rows of the test images, when
        version ``current`` holds them."""
        name = parent.model_version
        old = self.features[name] if name in self.features else self.stored_features(name)
        self.features.add(name, old)
        rows = steps.version_rows(self.store, self.gallery, current.version, self.data.rows)
        return Reference.of(self.data, parent, old, rows, current.version)

    def _baselines(self, spec, reference: Reference) -> dict[str, dict]:
        """Each baseline method trained on the same data, scored as the candidate is
        (:meth:`Reference.baseline`)."""
        baselines = {}
        for method in spec.baselines:
            _, features = self._train(spec, method, reference.parent, suffix=f"-{method}")
            baselines.update(reference.baseline(method, features))
        return baselines

    def _method_evidence(
        self, spec, reference: Reference, found: CandidateEvidence, directory: str, current, seconds
    ) -> tuple[object | None, dict]:
        """Add what the entry's method measures to ``found``: FCT trains h and is scored
        against h(gallery); a map's method fits its map, of the gallery (scored as FCT's h
        is) or of the queries. Returns the fitted query map (else None) and the backfill
        curves (FCT with a partial backfill, else ``{}``)."""
        entry = method_entry(spec.method)
        if entry.needs_transformation:
            self._say(spec, "training the transformation h (FCT) and scoring against h(gallery)")
            with _timed(seconds, "fct"):
                return None, self._fct(spec, reference, found, directory, current)
        if not entry.fits_map:
            return None, {}
        of_gallery = spec.map.direction == "gallery"
        kind = "map of the gallery" if of_gallery else "query map"
        self._say(spec, f"fitting its {spec.method} {kind} on {spec.map.describe()}")
        with _timed(seconds, "fit"):
            fit = steps.fit_map(self.cfg, spec, self.store, self.gallery, current, directory)
            info = {"kind": spec.method, **fit.info()["fit"]}  # its kind, pairs and residual
            if not of_gallery:  # the queries mapped into the stored gallery's space
                found.adapted = reference.mapped_queries(fit.transformation, found.features)
                found.adapted_fit = info
                return fit, {}
            # saved as the candidate's h, which the transform pipeline applies as FCT's
            save_transformation(directory, fit.transformation, "h", **fit.info())
            transformed = transform_features(fit.transformation, reference.h_input)
            found.transformed = reference.evidence(found.features, transformed)
            found.transformed_fit = info
            return None, {}

    def _fct(
        self, spec, reference: Reference, found: CandidateEvidence, directory: str, current
    ) -> dict:
        """Train h (FCT sec. 3.3) into ``directory`` and score the candidate against h(rows).
        With a partial backfill, h learns its uncertainty, and the candidate is also scored
        against the partially backfilled test gallery; returns the backfill curves on the
        test images (FastFill), else ``{}``."""
        partial = partial_backfill_of(spec, self.cfg.policy)  # h learns its uncertainty
        run = f"{self.cfg.name}-{spec.model_version}-{self.digest[:8]}-fct"
        steps.train_fct(
            self.cfg,
            spec,
            reference.parent,
            directory,
            current.normalized,
            self.work,
            partial,
            run,
        )
        h = load_transformation(directory)
        curves = {}
        if partial is None:
            transformed = transform_features(h, reference.h_input)
        else:  # what each budget would buy, on the test images (FastFill's curves)
            transformed, uncertainty = transform_with_uncertainty(h, reference.h_input)
            found.backfilled, curves = reference.partial_backfill(
                found.features, transformed, uncertainty, partial, self.cfg.training.seed
            )
        found.transformed = reference.evidence(found.features, transformed)
        return curves

    def _decide(self, spec, found: CandidateEvidence) -> Decision:
        """The policy's decision on ``found``: a query map's on its mapped queries, a map of
        the gallery's as FCT's h, any other method's on its direct (and h(gallery), partial
        backfill) evidence."""
        policy = self.cfg.policy
        if found.adapted is not None:
            return decide_adapted(found.adapted, policy, spec.method)
        if found.transformed_fit is not None:
            ruling = decide(found.direct, found.transformed, policy, None, None)
            return gallery_map_decision(ruling, spec.method)
        backfilled = found.backfilled
        return decide(found.direct, found.transformed, policy, spec.partial_backfill, backfilled)


@contextmanager
def _timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    """Record the block's wall seconds as ``seconds[stage]`` (not when it raises)."""
    began = time.perf_counter()
    yield
    seconds[stage] = time.perf_counter() - began
