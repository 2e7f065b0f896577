"""Model selection as the run sees it: the hospitals' signed status, the stop rule, the kept round.

Every round, each hospital scores the global model it received on its own validation patients
and the secure mode sums (Σ loss·n, Σ n) into the shared module ``metric/validation``
(:mod:`clinograph.sdk.training.selection`). When the round's model is delivered, each hospital
decodes the same federated validation loss L = Σ loss·n / Σ n from it and answers with a signed
:class:`SelectionStatus`. The run (:mod:`.run`) feeds the agreed L to a :class:`SelectionTracker`
-- the same rule every hospital applies to keep its best model -- which decides early stopping
and the kept round, audited as ``model_selected``.

What the server learns: the federated validation loss of each round's global model, one number
a round, in every secure mode (also under ``ckks``, where it learns no other function of the
sum). It never sees one hospital's own figure. Hospitals that decode another value than the
majority are named in the ``model_selected`` entry (``disagreeing``), and the majority's value
is used: a single hospital cannot steer the choice where there is a majority. A tie (two hospitals
that disagree) goes to the lower round, loss, then noise: there a lying hospital is named but wins.

**The noise-aware rule** (:func:`selection_step`, applied by :class:`SelectionTracker` here and by
every hospital's ``ModelSelection``). Under distributed DP the released loss L_r carries a noise of
known standard deviation s_r (:func:`released_loss_noise`: public values and the released sums
only, post-processing, no ε). Without DP s_r = 0. A round is *worse* unless its released loss is
below the lowest released loss so far by more than ``min_delta`` after allowing for the noise of
both: not worse iff L_r < L_low − min_delta + z·√(s_r² + s_low²), z = :data:`NOISE_Z` = 2 (fixed
before any measurement, not tuned). The kept round is the **latest** round that is not worse (more
training wins unless the loss says clearly otherwise); ``patience`` counts consecutive worse rounds;
L_low moves only on a strict ``min_delta`` improvement. With s = 0 this is exactly the rule without
DP: not worse iff L_r < L_low − min_delta, i.e. the lowest loss is kept, and every other round counts
towards patience.

Why z = 2 and what it costs when nothing changes: L_low is the minimum of the releases so far, and
the minimum of r equal-mean releases sits about s·E[max of r normals] below their mean (≈ 2 s after
25: the winner's curse), so a later release of the same model is "worse" when it exceeds the mean by
more than (2√2 − 1.97)·s ≈ 0.86 s late in a run (probability ≈ 0.19), rarely early. With 26 releases
of an unchanging loss (25 rounds and the scoring round), equal s and patience 5, the run stops early
with probability **≈ 3 %** (simulated, 20 000 runs: 0.031; z = 1 would stop 55 % of such runs,
z = 3 0.03 %); when it does not, the kept round is the last one or close to it (mean 24.3 of 25).
A real worsening is seen once it exceeds ≈ 2.8 s. Under local DP s is not computed (the releases'
σ_s differ between hospitals and are not public to them): the rule there is the one without DP.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from clinograph.core.errors import ClinographError
from clinograph.core.fields import RoundNumber
from clinograph.core.identity import PublicIdentity

from ..messages import ID_PATTERN, Finite, WireMessage, omit_none
from ..wire import open_envelope, parse_envelope

#: the part of a hospital's answer to ``end`` that carries its status
STATUS_PART = "status"
MAX_STATUS_BYTES = 16 * 1024


#: z of the noise-aware comparison (module docstring): fixed a priori, the same everywhere
NOISE_Z = 2.0
#: significant digits of the released loss's noise std, as of the loss itself (sdk LOSS_DIGITS)
NOISE_DIGITS = 6


def released_loss_noise(*, mean: float, count: float, noise_multiplier: float, contributors: int,
                        min_honest: int, loss_clip: float = 1.0) -> float:
    """The standard deviation of the federated validation loss released through distributed DP's
    noisy sum (:func:`clinograph.sdk.privacy.distributed.validation_rows`): each validation patient
    adds (a·ℓ̃, a), a = C/√2, and each of the ``contributors`` K hospitals adds 1/h of the noise
    variance (σ·C)² to both sums, so by the delta method on the ratio of the two sums

        s = B · σ · √2 · √(K/h) · √(1 + ℓ̃²) / Σ n_val

    with ℓ̃ = ``mean`` / B clipped to [0, 1] (the true mean clipped loss / B is there) and Σ n_val
    the released (noisy) ``count``, read as at least 1. Public values only (the federation's σ, h,
    B, the round's contributors) and the released sums: post-processing, no ε. The randomised
    rounding's variance (≤ 1/(4·scale²) a patient) is left out; where Σ n_val is a few dozen the
    ratio's tails are heavier than the formula's normal (research/private_selection, session 53)."""
    tilde = min(max(float(mean) / loss_clip, 0.0), 1.0)
    s = (loss_clip * noise_multiplier * math.sqrt(2.0 * contributors / min_honest) * math.sqrt(1.0 + tilde * tilde)
         / max(float(count), 1.0))
    return float(f"{s:.{NOISE_DIGITS}g}")


def selection_step(*, loss: float, noise: float, low: tuple[float, float] | None, min_delta: float,
                   z: float = NOISE_Z) -> tuple[bool, bool]:
    """One scored round under the noise-aware rule (module docstring): ``(keep, new_low)`` for a
    released ``loss`` of noise std ``noise``, given ``low`` = (the lowest released loss so far, its
    noise std), None before the first. ``keep``: not worse, so it becomes the kept round and the
    patience counter restarts; ``new_low``: a strict ``min_delta`` improvement, the new reference.
    With both noises 0, keep == new_low (the rule without DP)."""
    if low is None:
        return True, True
    low_loss, low_noise = low
    new_low = loss < low_loss - min_delta
    return new_low or loss < low_loss - min_delta + z * math.hypot(noise, low_noise), new_low


class SelectionRule(BaseModel):
    """Early stopping and the kept round: ``patience`` scored rounds in a row without an
    improvement of more than ``min_delta`` stop the run (0: never stop early)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    patience: int = Field(ge=0, le=10_000)
    min_delta: float = Field(ge=0, allow_inf_nan=False)

    def plan_options(self) -> dict[str, float | int | str | bool]:
        """What every plan carries, so each hospital keeps its best model by the same rule."""
        return {"selection.patience": self.patience, "selection.min_delta": self.min_delta}


class SelectionStatus(WireMessage):
    """Hospital -> server, signed, with the model of round ``round``: the federated validation
    loss of the model the hospital scored in that round (``scored``: the number of rounds that
    model had completed; None: it scored none), and after the final round the round it kept."""

    kind: Literal["selection_status"] = "selection_status"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber
    client: str = Field(pattern=ID_PATTERN)
    scored: int | None = Field(default=None, ge=0)
    loss: Finite | None = None
    kept: int | None = Field(default=None, ge=0)
    #: the standard deviation of the noise on ``loss`` (:func:`released_loss_noise`; None: 0, no DP)
    noise: Finite | None = Field(default=None, ge=0)

    @model_serializer(mode="wrap")
    def _without_unset_noise(self, handler):  # noqa: ANN001, ANN202 - pydantic's serializer protocol
        """Without DP the message is byte for byte what it was before ``noise`` existed."""
        return omit_none(handler(self), "noise")


def read_statuses(raw: Mapping[str, bytes], *, peers: Mapping[str, PublicIdentity], federation_id: str,
                  round_: int) -> tuple[dict[str, SelectionStatus], dict[str, str]]:
    """Verify each hospital's status (signed by itself, this federation and round).
    Returns (name -> status, name -> why it was not accepted)."""
    good: dict[str, SelectionStatus] = {}
    bad: dict[str, str] = {}
    for name, data in sorted(raw.items()):
        try:
            if name not in peers:
                raise ClinographError(f"{name!r} is not enrolled")
            status = open_envelope(parse_envelope(data, max_bytes=MAX_STATUS_BYTES), sender=peers[name],
                                   model=SelectionStatus)
            if (status.client, status.federation_id, status.round) != (name, federation_id, round_):
                raise ClinographError(f"status names {status.client!r}, {status.federation_id!r}, round "
                                      f"{status.round}; expected {name!r}, {federation_id!r}, round {round_}")
        except ClinographError as exc:
            bad[name] = str(exc)[:300]
            continue
        good[name] = status
    return good, bad


@dataclass
class SelectionTracker:
    """The server's copy of the selection rule (the hospitals' ``ModelSelection`` without the
    weights): ``losses[i]`` is the federated validation loss of the model after ``rounds[i]``
    completed rounds, ``noises[i]`` its noise std (0 without DP); ``best_round`` / ``best_loss``
    the kept round (the latest not worse, :func:`selection_step`), ``low_loss`` / ``low_noise`` the
    lowest released loss so far, the rule's reference (without DP: the kept round's)."""

    rule: SelectionRule
    rounds: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    noises: list[float] = field(default_factory=list)
    best_round: int | None = None
    best_loss: float = math.inf
    low_loss: float = math.inf
    low_noise: float = 0.0
    bad: int = 0
    #: hospitals that decoded another loss (or noise) than the majority (name -> round)
    disagreeing: dict[str, int] = field(default_factory=dict)

    def observe(self, statuses: Mapping[str, SelectionStatus]) -> float | None:
        """Take the majority's (scored round, loss, noise) among ``statuses``; None if nobody scored."""
        votes = Counter((s.scored, s.loss, s.noise or 0.0) for s in statuses.values()
                        if s.scored is not None and s.loss is not None)
        if not votes:
            return None
        (scored, loss, noise), _ = max(votes.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1], -kv[0][2]))  # ties: deterministic
        for name, s in statuses.items():
            if s.scored is not None and (s.scored, s.loss, s.noise or 0.0) != (scored, loss, noise):
                self.disagreeing.setdefault(name, int(s.scored))
        if scored in self.rounds:
            return None  # the same model scored again (a resumed round): counted once
        self.rounds.append(int(scored))
        self.losses.append(float(loss))  # type: ignore[arg-type]
        self.noises.append(float(noise))
        low = None if self.best_round is None else (self.low_loss, self.low_noise)
        keep, new_low = selection_step(loss=float(loss), noise=float(noise), low=low,  # type: ignore[arg-type]
                                       min_delta=self.rule.min_delta)
        if new_low:
            self.low_loss, self.low_noise = float(loss), float(noise)  # type: ignore[arg-type]
        if keep:
            self.best_round, self.best_loss, self.bad = int(scored), float(loss), 0  # type: ignore[arg-type]
        else:
            self.bad += 1
        return float(loss)  # type: ignore[arg-type]

    @property
    def should_stop(self) -> bool:
        """``patience`` scored rounds in a row that were worse (:func:`selection_step`)."""
        return self.rule.patience > 0 and self.bad >= self.rule.patience

    def to_dict(self) -> dict[str, object]:
        """Journal form."""
        return {"rounds": list(self.rounds), "losses": list(self.losses), "noises": list(self.noises),
                "best_round": self.best_round, "best_loss": None if math.isinf(self.best_loss) else self.best_loss,
                "low_loss": None if math.isinf(self.low_loss) else self.low_loss, "low_noise": self.low_noise,
                "bad": self.bad, "disagreeing": dict(self.disagreeing)}

    def load(self, data: Mapping[str, object]) -> None:
        """Restore from :meth:`to_dict` (a journal written before ``noises`` existed: every noise 0,
        the reference the kept round's)."""
        self.rounds = [int(x) for x in data.get("rounds", [])]  # type: ignore[union-attr]
        self.losses = [float(x) for x in data.get("losses", [])]  # type: ignore[union-attr]
        self.noises = [float(x) for x in data.get("noises", [0.0] * len(self.losses))]  # type: ignore[union-attr]
        best = data.get("best_round")
        self.best_round = None if best is None else int(best)  # type: ignore[call-overload]
        loss = data.get("best_loss")
        self.best_loss = math.inf if loss is None else float(loss)  # type: ignore[arg-type]
        low = data.get("low_loss", loss)
        self.low_loss = math.inf if low is None else float(low)  # type: ignore[arg-type]
        self.low_noise = float(data.get("low_noise", 0.0))  # type: ignore[arg-type]
        self.bad = int(data.get("bad", 0))  # type: ignore[call-overload]
        self.disagreeing = {str(k): int(v) for k, v in dict(data.get("disagreeing", {})).items()}  # type: ignore[call-overload]
