"""Score a new model against every registered model on the shared test images (no Ray).

The compatibility matrix of an upgrade history has one row per registered model version, in
registration order, plus the candidate: ``M(t, k)`` queries with model t's features against a
gallery of model k's features *of the same test images* (REFERENCE.md protocols, via
:mod:`raycompat.evaluation`). For an FCT upgrade the candidate's cross-test is also scored
against ``h(phi_old)``, the gallery as it would be after the transformation.

Beside each score, the evidence counts negative flips (Yan et al., CVPR 2021; under the
identification protocol only): of the test queries, the share the old system (the gallery
model's queries against its own gallery) answered right at top-1 and the upgraded one answers
wrong, over all queries (NFR) and over the old system's right answers (NFR of old hits).

The evidence collectors of one upgrade are here too: :class:`Reference` is what a candidate is
judged against (the gallery model's features and the stored rows of the test images), and its
methods score the candidate directly, on the gallery model's classes, against h(gallery) or a
partially backfilled gallery, with its queries mapped, or as a baseline; :class:`CandidateEvidence`
gathers what was measured. Training h and fitting maps (Ray) stay in the job
(:mod:`raycompat.cluster.upgrade.job`), which hands the arrays here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from raycompat.backfill import backfill_order, random_order
from raycompat.config.train import TrainConfig
from raycompat.config.upgrade import PartialBackfillSpec
from raycompat.evaluation import EvalSet, grow_matrix, score
from raycompat.index.distances import get_distance
from raycompat.metrics.compatibility import CompatibilityMatrix, ecc, update_gain
from raycompat.metrics.flips import flip_rates
from raycompat.metrics.retrieval import top1_hits
from raycompat.train.data import load_images, make_splits, open_dataset, test_source
from raycompat.upgrade.backfill_eval import backfill_evaluation


@dataclass(frozen=True)
class Hits:
    """``hit (N,)``: query i's nearest other test image is of its class; ``valid (N,)``: it has
    one of its class at all (the queries every average counts)."""

    hit: np.ndarray
    valid: np.ndarray


@dataclass
class EvalData:
    """The test images every model of a history is scored on, and how."""

    dataset: object
    rows: np.ndarray
    eval_set: EvalSet
    protocol: str
    distance: str
    strict: bool
    batch_size: int
    labels_are_classes: bool = False  # test labels are the training classes (held-out split)

    def score(self, query: np.ndarray, gallery: np.ndarray) -> float:
        return score(self.protocol, query, gallery, self.eval_set, self.distance)

    def hits(self, query: np.ndarray, gallery: np.ndarray) -> Hits | None:
        """Per query, whether its top-1 is a match: what :meth:`score` averages under the
        identification protocol (the narrower features zero-padded, as there); None under
        another protocol, whose score is not a mean over the same queries."""
        if self.protocol != "identification":
            return None
        width = min(query.shape[1], gallery.shape[1])
        labels = self.eval_set.labels
        hit, valid = top1_hits(
            query[:, :width], gallery[:, :width], labels, labels, self.distance, exclude_self=True
        )
        return Hits(hit, valid)

    def classes_below(self, classes: int) -> np.ndarray | None:
        """Mask of the test images of training classes ``[0, classes)``, when that subset is
        meaningful: identification on the held-out split, a proper non-empty subset."""
        if self.protocol != "identification" or not self.labels_are_classes:
            return None
        mask = np.asarray(self.eval_set.labels) < classes
        return mask if 1 < mask.sum() < len(mask) else None


def eval_data(cfg: TrainConfig) -> EvalData:
    """The test split (or ``eval.dataset``) of the shared training config, as the driver sees
    it: the same seeded split, so features stored in training checkpoints line up."""
    dataset = open_dataset(cfg.data)
    splits = make_splits(cfg, dataset.labels)
    source, rows, eval_set = test_source(cfg, dataset, dataset.labels, splits)
    return EvalData(
        source,
        rows,
        eval_set,
        cfg.eval.protocol,
        cfg.eval.distance,
        cfg.eval.strict_ecc,
        cfg.eval.batch_size,
        labels_are_classes=cfg.eval.dataset is None and cfg.eval.split == "closed_set",
    )


@torch.no_grad()
def model_features(model, data: EvalData) -> np.ndarray:
    """``(N, d)`` features of the test images, in ``data.rows`` order."""
    model.eval()
    parts = [
        model.forward_features(
            load_images(data.dataset, data.rows[i : i + data.batch_size], "none", None)
        ).float()
        for i in range(0, len(data.rows), data.batch_size)
    ]
    return torch.cat(parts).numpy()


def holds_features(data: EvalData, rows: np.ndarray, features: np.ndarray) -> bool:
    """Whether stored ``rows`` ((N, d)) are ``features`` as ``data.distance`` compares them
    (to 1e-5 after its normalisation): a version extracted by the model holds its features up
    to float rounding, which only reorders ties. The job then scores the features in memory,
    so M(k, k) and M(t, k) are one number in the matrix and in the decision."""
    if rows.shape != features.shape:
        return False
    dist = get_distance(data.distance)
    a, b = dist.prepare(features, "features"), dist.prepare(rows, "stored rows")
    return bool(torch.allclose(a.double(), b.double(), rtol=0.0, atol=1e-5))


def history_matrix(names: list[str], features: dict[str, np.ndarray], data: EvalData):
    """Lower-triangular ``M(t, k)``, ``k <= t``, over ``names`` in order."""
    matrix: CompatibilityMatrix | None = None
    for t, name in enumerate(names):
        row = [data.score(features[name], features[k]) for k in names[: t + 1]]
        matrix = grow_matrix(matrix, row, name, data.protocol)
    return matrix


@dataclass
class Evidence:
    """What the decision rests on, for the candidate against the gallery's model.

    ``cross``: M(new, gallery) - queries of the new model against the stored gallery (for FCT:
    against h(gallery)); ``old_self``: M(gallery, gallery); ``new_self``: M(new, new).
    ``ecc``: the empirical compatibility criterion, cross > old_self (>= unless strict);
    ``update_gain``: (cross - old_self) / (new_self - old_self), None when undefined.
    ``gallery``: the stored version the scores are against when its rows are not the
    ``against`` model's own features (an FCT or partially backfilled version), else "".

    Negative flips against the old system (``against``'s queries against the same gallery),
    fractions, None when not measured (another protocol than identification):
    ``negative_flip_rate``: over all queries, for the new model's queries against this
    gallery (the ``cross`` column); ``negative_flip_rate_of_old_hits``: the same over the
    queries the old system answered right (None when it answered none);
    ``backfill_negative_flip_rate`` (and ``_of_old_hits``): after a full backfill, the new
    model's queries against its own re-extracted gallery (the ``new_self`` column).
    """

    against: str
    cross: float
    old_self: float
    new_self: float
    ecc: bool
    update_gain: float | None
    transformed: bool = False
    gallery: str = ""
    negative_flip_rate: float | None = None
    negative_flip_rate_of_old_hits: float | None = None
    backfill_negative_flip_rate: float | None = None
    backfill_negative_flip_rate_of_old_hits: float | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def negative_flips(old: Hits, new: Hits) -> tuple[float, float | None]:
    """``(NFR, NFR of old hits)``: the share of all valid queries that ``old`` answered right
    and ``new`` answers wrong, and the same share of the queries ``old`` answered right."""
    flips = flip_rates(old.hit, new.hit, old.valid & new.valid)
    of_hits = flips.negative_of_old_hits  # NaN when the old system had no hit
    return flips.negative, None if np.isnan(of_hits) else of_hits


def evidence(
    data: EvalData,
    new: np.ndarray,
    gallery: np.ndarray,
    old_self: float,
    against: str,
    transformed: bool = False,
    old_hits: Hits | None = None,
    stored: str = "",
) -> Evidence:
    """Score ``new`` ((N, d) test features) against ``gallery`` ((N, d') rows of the same
    images); ``old_hits``: the old system's per-query hits (:meth:`EvalData.hits`), for the
    negative flips (none counted without them); ``stored``: :attr:`Evidence.gallery`."""
    cross, new_self = data.score(new, gallery), data.score(new, new)
    try:
        gain = update_gain(cross, old_self, new_self)
    except ValueError:
        gain = None
    flips = {}
    if old_hits is not None:
        served, backfilled = data.hits(new, gallery), data.hits(new, new)
        nfr, nfr_of_hits = negative_flips(old_hits, served)
        bnfr, bnfr_of_hits = negative_flips(old_hits, backfilled)
        flips = dict(
            negative_flip_rate=nfr,
            negative_flip_rate_of_old_hits=nfr_of_hits,
            backfill_negative_flip_rate=bnfr,
            backfill_negative_flip_rate_of_old_hits=bnfr_of_hits,
        )
    return Evidence(
        against,
        cross,
        old_self,
        new_self,
        ecc(cross, old_self, data.strict),
        gain,
        transformed,
        stored,
        **flips,
    )


# PartialBackfillSpec.order -> the test images' rows, first backfilled first
PARTIAL_BACKFILL_ORDERS = {
    "uncertainty": lambda uncertainty, n, seed: backfill_order(uncertainty),
    "random": lambda uncertainty, n, seed: random_order(n, seed),
}


def partially_backfilled(
    transformed: np.ndarray,
    new: np.ndarray,
    uncertainty: np.ndarray,
    spec: PartialBackfillSpec,
    seed: int,
) -> np.ndarray:
    """``(N, d)`` h(old) rows of the test images with ``round(budget * N)`` of them replaced by
    the new model's, in ``spec.order`` (random: seeded by ``seed``, as the publisher's): the
    gallery a partial backfill leaves, on the test images as the report's backfill curves
    build it (:func:`raycompat.backfill.backfill_curve`)."""
    n = len(new)
    order = PARTIAL_BACKFILL_ORDERS[spec.order](uncertainty, n, seed)
    gallery = np.array(transformed, dtype=np.float32, copy=True)
    rows = order[: int(np.rint(spec.budget * n))]
    gallery[rows] = new[rows]
    return gallery


def evidence_on_classes(
    data: EvalData,
    classes: int,
    new: np.ndarray,
    gallery: np.ndarray,
    old: np.ndarray,
    against: str,
) -> Evidence | None:
    """The same evidence on the test images of the classes the gallery model was trained on
    (reported beside the decision, which uses every test image): it separates a method that
    keeps the old model's classes compatible from the effect of the classes it never saw."""
    mask = data.classes_below(classes)
    if mask is None:
        return None
    sub = dataclasses.replace(
        data, rows=data.rows[mask], eval_set=EvalSet(np.asarray(data.eval_set.labels)[mask])
    )
    old_hits = sub.hits(old[mask], gallery[mask])
    return evidence(
        sub,
        new[mask],
        gallery[mask],
        sub.score(old[mask], gallery[mask]),
        against,
        old_hits=old_hits,
    )


# ---- one candidate against the gallery's model ----------------------------------------------


@dataclass
class Parent:
    """The model the gallery is stored in: its version name, local files and classes (it was
    trained on classes ``[0, classes)``)."""

    model_version: str
    directory: str
    classes: int


@dataclass
class CandidateEvidence:
    """Everything measured of one candidate's ``(N, d)`` test ``features`` against its
    :class:`Reference`; :meth:`proof` is what its decision record and grant carry.

    ``direct``: its queries against the stored gallery; ``transformed``: against h(gallery)
    (FCT's h, or a fitted map of the gallery, whose kind and fit are ``transformed_fit``);
    ``adapted``: its queries mapped into the gallery's space by a fitted query map (kind and
    fit: ``adapted_fit``); ``backfilled``: against the partially backfilled test gallery;
    ``seen_classes``: as ``direct``, on the test images of the gallery model's ``classes``
    (reported, not decisive: the service searches every image).
    """

    features: np.ndarray
    classes: int
    direct: Evidence
    seen_classes: Evidence | None = None
    transformed: Evidence | None = None
    transformed_fit: dict | None = None
    adapted: Evidence | None = None
    adapted_fit: dict | None = None
    backfilled: Evidence | None = None

    def proof(self) -> dict:
        """``{"direct": ..., "transformed", "adapted", "backfilled", "seen_classes"}``, those
        measured, each an :meth:`Evidence.as_dict` (with its fit, or its classes)."""
        proof = {"direct": self.direct.as_dict()}
        if self.transformed is not None:
            proof["transformed"] = {**self.transformed.as_dict(), **(self.transformed_fit or {})}
        if self.adapted is not None:
            proof["adapted"] = {**self.adapted.as_dict(), **(self.adapted_fit or {})}
        if self.backfilled is not None:
            proof["backfilled"] = self.backfilled.as_dict()
        if self.seen_classes is not None:
            proof["seen_classes"] = {**self.seen_classes.as_dict(), "classes": self.classes}
        return proof


@dataclass
class Reference:
    """What a candidate is judged against, all on the N test images of ``data``
    (:meth:`of`), and the evidence collectors that score a candidate against it.

    ``parent``: the model the gallery is stored in; ``old``: (N, d_old) its test features;
    ``gallery``: (N, d_old) the stored rows of the test images, else ``old``; ``old_self``:
    M(old, gallery), the gallery's self-test; ``old_hits``: the old system's top-1 hit per query
    (identification only); ``stored``: the version, when ``gallery`` is its rows rather than
    ``old``; ``rows``: the stored rows themselves, what h is applied to (as the transform
    pipeline applies it): rows that "hold" the features for scoring may still differ from them
    as h's input (a normalized version holds unit rows; h learned on unit rows).
    """

    data: EvalData
    parent: Parent
    old: np.ndarray
    gallery: np.ndarray
    old_self: float
    old_hits: Hits | None
    stored: str = ""
    rows: np.ndarray | None = None

    @classmethod
    def of(
        cls, data: EvalData, parent: Parent, old: np.ndarray, rows: np.ndarray | None, version: str
    ) -> Reference:
        """The service's view: ``rows`` ((N, d) of stored ``version``, None when it does not
        hold the test images) when they are not ``old`` (the gallery model's features in
        memory, the matrix's row), else ``old``: rows that hold the features
        (:func:`holds_features`) are scored as the features, one number per matrix cell."""
        gallery, stored = old, ""
        if rows is not None and not holds_features(data, rows, old):
            gallery, stored = rows, version
        old_self, hits = data.score(old, gallery), data.hits(old, gallery)
        return cls(data, parent, old, gallery, old_self, hits, stored, rows)

    @property
    def h_input(self) -> np.ndarray:
        return self.gallery if self.rows is None else self.rows

    def evidence(self, features: np.ndarray, transformed: np.ndarray | None = None) -> Evidence:
        """``features`` ((N, d) test features) against the stored rows, or against
        ``transformed`` ((N, d) h(rows), FCT or a map of the gallery)."""
        gallery = self.gallery if transformed is None else transformed
        return evidence(
            self.data,
            features,
            gallery,
            self.old_self,
            self.parent.model_version,
            transformed=transformed is not None,
            old_hits=self.old_hits,
            stored=self.stored,
        )

    def on_seen_classes(self, features: np.ndarray) -> Evidence | None:
        """The evidence on the test images of the gallery model's classes, or None."""
        parent = self.parent
        return evidence_on_classes(
            self.data, parent.classes, features, self.gallery, self.old, parent.model_version
        )

    def judge(self, features: np.ndarray) -> CandidateEvidence:
        """A candidate's evidence before its method adds its own: direct, and on the seen
        classes."""
        direct, seen = self.evidence(features), self.on_seen_classes(features)
        return CandidateEvidence(features, self.parent.classes, direct, seen)

    def baseline(self, method: str, features: np.ndarray) -> dict[str, dict]:
        """A baseline's entries of the report: ``method`` -> its direct evidence, and
        ``"<method>, classes < C only"`` -> its evidence on the gallery model's classes."""
        out = {method: self.evidence(features).as_dict()}
        seen = self.on_seen_classes(features)
        if seen is not None:
            out[f"{method}, classes < {self.parent.classes} only"] = seen.as_dict()
        return out

    def mapped_queries(self, query_map: torch.nn.Module, features: np.ndarray) -> Evidence:
        """The candidate's test queries mapped by ``query_map`` (into the stored gallery's
        space) against the stored gallery."""
        with torch.no_grad():
            mapped = query_map(torch.from_numpy(np.ascontiguousarray(features)))
        return self.evidence(mapped.numpy())

    def partial_backfill(
        self,
        features: np.ndarray,
        transformed: np.ndarray,
        uncertainty: np.ndarray,
        spec: PartialBackfillSpec,
        seed: int,
    ) -> tuple[Evidence, dict]:
        """FastFill on the test images: the evidence against the partially backfilled gallery
        (``transformed`` = h(rows) with ``spec.budget`` of them re-extracted,
        :func:`partially_backfilled`) and what each budget would buy (the backfill curves,
        :func:`~raycompat.upgrade.backfill_eval.backfill_evaluation`)."""
        curves = backfill_evaluation(
            features,
            transformed,
            uncertainty,
            self.data.eval_set.labels,
            spec,
            distance=self.data.distance,
        )
        mixed = partially_backfilled(transformed, features, uncertainty, spec, seed)
        return self.evidence(features, mixed), curves
