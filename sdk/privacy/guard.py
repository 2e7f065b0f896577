"""Refuse training set-ups that couple patients under DP (privacy.md: ``similar_to`` couples them).

Patient-level DP-SGD bounds one patient's influence by clipping *its own* gradient. On the full
graph a patient also changes its ``similar_to`` neighbours' gradients (49 others on a
200-patient graph) and the kNN graph itself, so per-node clipping bounds nothing. Under DP the
only training unit is the patient's isolated star; these guards turn every other request into
a :class:`~clinograph.core.errors.PrivacyError` that says why.
"""

from __future__ import annotations

from collections.abc import Mapping

from clinograph.core.errors import PrivacyError

WHY = ("under patient-level DP every patient must be one independent training example (its own "
       "star); similar_to edges let one patient change other patients' gradients and the kNN graph "
       "itself, so clipping per patient would bound nothing and the ε would be false")


def refuse_coupled_training(*, k_similar: int, site: str) -> None:
    """Raise if DP training was asked to use ``similar_to`` (patient-patient) edges.

    Raises:
        PrivacyError: ``k_similar > 0``.
    """
    if k_similar > 0:
        raise PrivacyError(
            f"Hospital {site!r}: DP training was asked to build the full graph with similar_to "
            f"(k_similar = {k_similar}); refused: {WHY}. Fix: set [graph] k_similar = 0 when "
            "[privacy] enabled = true (DP trains on per-patient stars only).")


def refuse_coupled_plan(options: Mapping[str, float | int | str | bool], *, site: str) -> None:
    """Raise if a round plan asks for something the DP trainer cannot do privately.

    ``graph.similar_to`` / ``graph.k_similar`` (patient-patient edges) and FedProx's proximal
    term (the DP step's clipped per-patient sum would silently drop it) are refused.

    Raises:
        PrivacyError: the plan asks for full-graph training or FedProx under DP.
    """
    if bool(options.get("graph.similar_to", False)) or int(options.get("graph.k_similar", 0) or 0) > 0:
        raise PrivacyError(f"Hospital {site!r}: the round plan asks for similar_to training under DP; "
                           f"refused: {WHY}. Fix: the server must not request similar_to in a DP federation.")
    if float(options.get("fedprox.mu", 0.0) or 0.0) > 0:
        raise PrivacyError(f"Hospital {site!r}: the round plan asks for FedProx (fedprox.mu > 0) under DP; "
                           "the DP step replaces the gradient with the clipped, noised per-patient sum, so the "
                           "proximal term would be silently dropped. Fix: use strategy 'fedsgd' or 'fedavg' with DP.")
