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
    op = ">" if e.ecc else "<="
    return f"M(new, {gallery}) = {e.cross:.4f} {op} M({e.against}, {e.against}) = {e.old_self:.4f}"


def _partial_text(spec: PartialBackfillSpec) -> str:
    return f"{spec.budget:.0%} of the rows re-extracted, {spec.order} order"


def decide(
    direct: Evidence,
    fct: Evidence | None,
    policy: PolicySpec,
    partial_backfill: PartialBackfillSpec | None = None,
) -> Decision:
    """``direct``: the candidate against the stored gallery; ``fct``: against ``h(gallery)``
    when the method upgrades by transformation, else None; ``partial_backfill``: the entry's
    own ``partial_backfill`` (None when it has none)."""
    if fct is not None and partial_backfill is not None:
        holds = "holds" if fct.ecc else "fails"
        return Decision(
            "partial_backfill",
            f"FCT with a partial backfill ({_partial_text(partial_backfill)}), as the entry "
            f"asks; h alone: {_ecc_text(fct, f'h({fct.against})')}: ECC {holds}",
        )
    if fct is not None and fct.ecc:
        return Decision("transform", "FCT: " + _ecc_text(fct, f"h({fct.against})") + ": ECC holds")
    if fct is None and direct.ecc:
        return Decision("compatible", "backward compatible: " + _ecc_text(direct, direct.against))
    failed = _ecc_text(fct, f"h({fct.against})") if fct else _ecc_text(direct, direct.against)
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
