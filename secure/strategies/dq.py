"""PFGL-Net's dynamic data-quality (DQ) weighting (PFGL-Net §3.2-3.3, eqs. 3-5, Algorithms 1-2).

Each hospital releases two numbers in its signed report: ``perf`` (validation-split
performance, PFGL-Net eq. 1) and ``missing_rate`` (importance-weighted, eq. 2); see
:mod:`clinograph.sdk.training.quality`. The server turns them into aggregation weights.

One-round lag: under masked secure aggregation a hospital multiplies its delta by its weight
*before* masking, so the weights of round t are fixed in the round-t plan, from the metrics
released in rounds < t (round 0: uniform). Every round's weights, raw DQ, smoothed DQ and α
are kept in :attr:`DQWeighted.history` (the server also logs the weights in its round plan).

Released metrics are a release: under DP they are *not* covered by the DP-SGD guarantee
(they depend on the validation labels and on the missingness pattern) and the weights are
self-reported, so a hospital can inflate its own weight. See docs/strategies.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clinograph.core.errors import ConfigError

from .fedavg import FedAvg

ALPHA_CAP = 0.9  # PFGL-Net eq. (5)


class DQSettings(BaseModel):
    """DQ hyper-parameters. The paper gives no values; these defaults are ours (docs/strategies.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    beta1: float = Field(default=1.0, ge=0, le=10, description="β1, exponent of Perf (0: structure-only)")
    beta2: float = Field(default=1.0, ge=0, le=10, description="β2, exponent of 1 − MissingRate (0: performance-only)")
    alpha: float = Field(default=0.5, gt=0, le=ALPHA_CAP, description="initial smoothing coefficient α (eq. 4)")
    eta: float = Field(default=0.5, ge=0, le=10, description="η, learning rate of the adaptive α (eq. 5)")
    perf_threshold: float = Field(default=0.05, ge=0, le=1, description="|ΔPerf| above which α adapts (eq. 5)")
    floor: float = Field(default=1e-3, ge=0, lt=1, description="smallest smoothed DQ used as a weight, so no "
                         "hospital's weight is exactly 0 and an all-zero round falls back to uniform")
    max_share: float = Field(default=0.9, gt=0, le=1, description="the largest share of a sum one hospital's "
                             "update may be, in the smallest round the server may close (min_clients "
                             "survivors, the others the lightest): the hospitals' default [release] "
                             "max_weight_share, which refuses a plan above it; 1: no cap")
    perf_key: str = "perf"
    missing_key: str = "missing_rate"


def dq_factor(perf: float, missing_rate: float, *, beta1: float, beta2: float) -> float:
    """PFGL-Net eq. (3): DQ = Perf^β1 · (1 − MissingRate)^β2 (with 0^0 = 1)."""
    return float(perf ** beta1 * (1.0 - missing_rate) ** beta2)


def smooth(dq: float, previous: float | None, *, alpha: float) -> float:
    """PFGL-Net eq. (4): D̄^(t) = α·DQ^(t) + (1 − α)·D̄^(t−1); a new client starts at DQ (Alg. 1)."""
    return dq if previous is None else alpha * dq + (1.0 - alpha) * previous


def adapt_alpha(alpha: float, delta_perf: float, *, eta: float, threshold: float) -> float:
    """PFGL-Net eq. (5): α ← min(α + η·|ΔPerf|, 0.9) when |ΔPerf| exceeds the threshold."""
    if abs(delta_perf) <= threshold:
        return alpha
    return min(alpha + eta * abs(delta_perf), ALPHA_CAP)


class DQWeighted(FedAvg):
    """PFGL-Net Algorithm 2: the DQ-weighted average of the shared modules.

    - :meth:`observe` is Algorithm 1 (UPDATE-CLIENT-DQ) for every hospital that released
      valid metrics: append to the histories, DQ (eq. 3), adapt that hospital's α (eq. 5,
      per hospital, since ΔPerf is per hospital; α only grows, capped at 0.9), smooth (eq. 4).
    - :meth:`client_weights` normalises the smoothed DQs of the round's participants to sum
      to 1 (NORMALIZE in Alg. 2). Round 0 and rounds where nobody has a DQ: uniform. A
      participant with no DQ yet (late joiner, never released) gets the mean of the known ones.
      Not in the paper: the light weights are raised (:func:`share_floor`) so that no hospital's
      update is more than ``max_share`` of a sum the server may open -- else that hospital
      refuses the plan (``[release] max_weight_share``, default 0.9) and a federation with one
      weak hospital (F1 = 0: DQ at the floor) loses its best one every round.
    - :meth:`apply` is FedAvg on the weighted sums. K_personal of Alg. 2 never reaches the
      server: personal modules (``ModuleKind.PERSONAL``) are not in any hospital's upload, and
      the server's per-module division by Σw renormalises over each module's contributors.
    """

    name = "dq_weighted"
    normalised_weights = True

    def __init__(self, **options: object) -> None:
        super().__init__()
        try:
            self.settings = DQSettings.model_validate(options)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"Invalid dq_weighted options: {problems}. Known options: "
                              f"{', '.join(DQSettings.model_fields)}.") from None
        self.perf_history: dict[str, list[float]] = {}
        self.missing_history: dict[str, list[float]] = {}
        self.smoothed: dict[str, float] = {}
        self.alpha: dict[str, float] = {}
        self.history: list[dict[str, object]] = []
        self.weights_used: dict[int, dict[str, float]] = {}

    # -- Algorithm 1 --------------------------------------------------------------------
    def update_client_dq(self, client: str, perf: float, missing_rate: float) -> float:
        """UPDATE-CLIENT-DQ(c, p, m): histories, eq. (3), eq. (5), eq. (4); returns D[c]."""
        s = self.settings
        past = self.perf_history.setdefault(client, [])
        alpha = self.alpha.get(client, s.alpha)
        if past:
            alpha = adapt_alpha(alpha, perf - past[-1], eta=s.eta, threshold=s.perf_threshold)
        self.alpha[client] = alpha
        past.append(perf)
        self.missing_history.setdefault(client, []).append(missing_rate)
        dq = dq_factor(perf, missing_rate, beta1=s.beta1, beta2=s.beta2)
        self.smoothed[client] = smooth(dq, self.smoothed.get(client), alpha=alpha)
        return self.smoothed[client]

    def observe(self, *, round_: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
        s = self.settings
        raw: dict[str, float] = {}
        ignored: dict[str, str] = {}
        for client in sorted(metrics):
            reason, perf, miss = _read(metrics[client], s.perf_key, s.missing_key)
            if reason:
                ignored[client] = reason
                continue
            raw[client] = dq_factor(perf, miss, beta1=s.beta1, beta2=s.beta2)
            self.update_client_dq(client, perf, miss)
        self.history.append({"round": round_, "kind": "observe", "dq": raw, "ignored": ignored,
                             "smoothed": dict(self.smoothed), "alpha": dict(self.alpha)})

    # -- weights fixed before upload ---------------------------------------------------------
    def client_weights(self, *, round_: int, participants: tuple[str, ...], min_clients: int = 2) -> dict[str, float]:
        if not participants:
            return {}
        known = [self.smoothed[c] for c in participants if c in self.smoothed]
        if not known:
            raw = {c: 1.0 for c in participants}
        else:
            prior = sum(known) / len(known)
            raw = {c: max(self.smoothed.get(c, prior), self.settings.floor) for c in participants}
        total = sum(raw.values())
        if not total > 0:
            raw, total = {c: 1.0 for c in participants}, float(len(participants))
        lowest = share_floor(max(raw.values()), max_share=self.settings.max_share, min_clients=min_clients)
        if lowest > min(raw.values()):
            raw = {c: max(v, lowest) for c, v in raw.items()}
            total = sum(raw.values())
        weights = {c: raw[c] / total for c in sorted(participants)}
        self.weights_used[round_] = weights
        self.history.append({"round": round_, "kind": "weights", "weights": dict(weights)})
        return weights


def share_floor(heaviest: float, *, max_share: float, min_clients: int) -> float:
    """The smallest weight that keeps ``heaviest``'s share of a sum at most ``max_share`` in a round
    of ``min_clients`` whose other k = max(min_clients - 1, 1) members all weigh it: the share
    w / (w + k·f) <= s holds for f >= w (1 - s) / (s k) -- the rule each hospital checks of the plan
    (``HospitalClient._check_weights``), with a margin of 1e-6 for rounding. At most ``heaviest``:
    equal weights give 1 / (k + 1), which no weighting can lower."""
    if max_share >= 1 or heaviest <= 0:
        return 0.0
    k = max(min_clients - 1, 1)
    return min(heaviest, heaviest * (1.0 - max_share) / (max_share * k) * (1.0 + 1e-6))


def _read(m: Mapping[str, float], perf_key: str, missing_key: str) -> tuple[str, float, float]:
    """(reason it is unusable or '', perf, missing rate) from one hospital's released metrics."""
    if perf_key not in m or missing_key not in m:
        return f"metrics lack {perf_key!r} or {missing_key!r}", 0.0, 0.0
    perf, miss = float(m[perf_key]), float(m[missing_key])
    if not (math.isfinite(perf) and math.isfinite(miss)) or not (0 <= perf <= 1 and 0 <= miss <= 1):
        return f"{perf_key}/{missing_key} must be finite and in [0, 1]", 0.0, 0.0
    return "", perf, miss
