"""The upgrade decision: which action an evaluated candidate gets (pure; no Ray, no I/O).

Actions, in the order they are considered:

- ``transform``: the method upgrades by FCT and ``h(gallery)`` passes ECC: the new model's
  queries against the transformed gallery beat the old model's self-test (FCT sec. 3.2);
- ``compatible``: the candidate's queries against the stored gallery pass ECC (CoReS eq. 3):
  register it as a query model of that version, no rewrite;
- ``partial_backfill``: an FCT entry with ``partial_backfill`` set always takes it (the
  operator asked for that rewrite: ``h(gallery)`` with a fraction of its rows re-extracted,
  most uncertain first; FastFill, Jaeckle et al., ICLR 2023), whether ``h(gallery)`` alone
  passes ECC or not; the written version is checked before it is published;
- otherwise the policy's ``on_incompatible``: ``refuse`` (publish nothing), ``backfill``
  (re-extract the gallery with the new model) or ``partial_backfill`` (FCT upgrades only, at
  ``policy.partial_backfill``'s budget; a method without ``h`` is refused).

An FCT method never falls back to ``compatible``: it was not trained for it, and a transformed
gallery that fails the criterion is a failed upgrade, not a reason to skip the rewrite.

Then the gate ``policy.max_negative_flip_rate`` (None: none): an action whose negative-flip
rate is above it (or was not measured) becomes ``refuse``. The NFR is that of the gallery the
action serves: the stored one (``compatible``), ``h(gallery)`` (``transform``), the partially
backfilled test gallery (``partial_backfill``) or the re-extracted one (``backfill``).
Scores in reasons are percent of the test queries.

:func:`allowed_by` says which decisions the policy allows a run to end with: the job's
``--fail-on-refuse`` exits 3 only for the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from raycompat.config.upgrade import PartialBackfillSpec, PolicySpec
from raycompat.upgrade.evaluate import Evidence


@dataclass
class Decision:
    action: str
    reason: str


def _ecc_text(e: Evidence, gallery: str) -> str:
    """``gallery``: what the new model queries; the old self-test is against the stored
    version when its rows are not the gallery model's own features (``e.gallery``)."""
    op = ">" if e.ecc else "<="
    old = e.gallery or e.against
    return f"M(new, {gallery}) = {e.cross:.2%} {op} M({e.against}, {old}) = {e.old_self:.2%}"


def _stored(e: Evidence) -> str:
    """The gallery ``e`` was scored against: the stored version, or its model's features."""
    return e.gallery or e.against


def _partial_text(spec: PartialBackfillSpec) -> str:
    return f"{spec.budget:.0%} of the rows re-extracted, {spec.order} order"


def decide(
    direct: Evidence,
    fct: Evidence | None,
    policy: PolicySpec,
    partial_backfill: PartialBackfillSpec | None = None,
    backfilled: Evidence | None = None,
) -> Decision:
    """``direct``: the candidate against the stored gallery; ``fct``: against ``h(gallery)``
    when the method upgrades by transformation, else None; ``partial_backfill``: the entry's
    own ``partial_backfill`` (None when it has none); ``backfilled``: against the partially
    backfilled test gallery, when a partial backfill can be decided."""
    decision = _choose(direct, fct, policy, partial_backfill)
    limit = policy.max_negative_flip_rate
    if limit is None or decision.action == "refuse":
        return decision
    evidences = {"direct": direct, "transformed": fct, "backfilled": backfilled}
    nfr = served_flips(decision.action, evidences)
    if nfr is None:
        return Decision(
            "refuse",
            f"{decision.reason}; but its negative-flip rate was not measured (identification "
            f"protocol only) and policy.max_negative_flip_rate = {limit:.2%}: nothing is published",
        )
    if nfr > limit:
        return Decision(
            "refuse",
            f"{decision.reason}; but NFR = {nfr:.2%} > policy.max_negative_flip_rate = "
            f"{limit:.2%}: nothing is published",
        )
    return Decision(decision.action, f"{decision.reason}; NFR = {nfr:.2%} <= {limit:.2%}")


def decide_adapted(adapted: Evidence, policy: PolicySpec, kind: str) -> Decision:
    """:func:`decide` for an upgrade without compatible training: ``adapted`` is the candidate's
    queries, mapped by the fitted ``kind`` map, against the stored gallery. Where a compatible
    candidate would be published as it is (ECC holds, the flip gate passes) this one is
    published with its map (``adapt``); otherwise the policy's answer stands (refuse or a
    backfill: a partial one needs FCT's h, so it is refused)."""
    decision = decide(adapted, None, policy)
    if decision.action != "compatible":
        return decision
    reason = decision.reason.replace("backward compatible", f"through its {kind} query map", 1)
    return Decision("adapt", reason)


def gallery_map_decision(decision: Decision, kind: str) -> Decision:
    """:func:`decide`'s answer for a fitted map of the gallery (``map.direction: gallery``),
    decided as FCT's h: the same, except that a partial backfill is refused, since it orders
    the rows by an uncertainty that only FCT's h (FastFill) learns."""
    if decision.action != "partial_backfill":
        return decision
    return Decision(
        "refuse",
        f"{decision.reason}; but a partial backfill orders rows by h's uncertainty, which a "
        f"fitted {kind} map does not learn: nothing is published",
    )


def allowed_by(action: str, policy: PolicySpec) -> bool:
    """Whether an entry's decision ``action`` is one ``policy`` allows: every action that
    publishes, and ``refuse`` where the policy's answer to an incompatible upgrade is to refuse
    (``on_incompatible=refuse``, the default; its negative-flip gate included). Not allowed:
    ``refuse`` under ``backfill`` or ``partial_backfill`` (the rewrite the policy asks for could
    not be made, or failed the gate), and ``failed`` (an entry that failed, this run or an
    earlier one under the same config)."""
    if action == "failed":
        return False
    return action != "refuse" or policy.on_incompatible == "refuse"


SERVED = {  # action -> (evidence, its NFR field) of the gallery the candidate then queries
    "compatible": ("direct", "negative_flip_rate"),
    "adapt": ("adapted", "negative_flip_rate"),  # the stored gallery, through the query map
    "transform": ("transformed", "negative_flip_rate"),
    "partial_backfill": ("backfilled", "negative_flip_rate"),
    "backfill": ("direct", "backfill_negative_flip_rate"),
}


def served_flips(action: str, evidences: dict[str, Evidence | None]) -> float | None:
    """The NFR of the gallery ``action`` serves the candidate; ``evidences``: the job's
    ``direct``, ``transformed`` and ``backfilled`` evidence (None: not evaluated)."""
    which, field = SERVED[action]
    e = evidences[which]
    return None if e is None else getattr(e, field)


def _choose(
    direct: Evidence,
    fct: Evidence | None,
    policy: PolicySpec,
    partial_backfill: PartialBackfillSpec | None,
) -> Decision:
    """The action by ECC and ``policy.on_incompatible`` (the module's list)."""
    if fct is not None and partial_backfill is not None:
        holds = "holds" if fct.ecc else "fails"
        return Decision(
            "partial_backfill",
            f"FCT with a partial backfill ({_partial_text(partial_backfill)}), as the entry "
            f"asks; h alone: {_ecc_text(fct, f'h({_stored(fct)})')}: ECC {holds}",
        )
    if fct is not None and fct.ecc:
        h = f"h({_stored(fct)})"
        return Decision("transform", "FCT: " + _ecc_text(fct, h) + ": ECC holds")
    if fct is None and direct.ecc:
        return Decision("compatible", "backward compatible: " + _ecc_text(direct, _stored(direct)))
    failed = _ecc_text(fct, f"h({_stored(fct)})") if fct else _ecc_text(direct, _stored(direct))
    why = f"ECC fails ({failed})"
    if policy.on_incompatible == "backfill":
        return Decision("backfill", why + "; the policy allows a backfill by re-extraction")
    if policy.on_incompatible == "partial_backfill":
        if fct is not None:
            return Decision(
                "partial_backfill",
                f"{why}; the policy allows a partial backfill "
                f"({_partial_text(policy.partial_backfill)})",
            )
        return Decision(
            "refuse",
            why + "; policy.on_incompatible=partial_backfill needs an FCT transformation h, "
            "which this method does not learn: nothing is published",
        )
    return Decision("refuse", why + "; policy.on_incompatible=refuse: nothing is published")
