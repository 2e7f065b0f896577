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
is used: a single hospital cannot steer the choice.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from clinograph.core.errors import ClinographError
from clinograph.core.fields import RoundNumber
from clinograph.core.identity import PublicIdentity

from ..messages import ID_PATTERN, Finite, WireMessage
from ..wire import open_envelope, parse_envelope

#: the part of a hospital's answer to ``end`` that carries its status
STATUS_PART = "status"
MAX_STATUS_BYTES = 16 * 1024


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
    completed rounds."""

    rule: SelectionRule
    rounds: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    best_round: int | None = None
    best_loss: float = math.inf
    bad: int = 0
    #: hospitals that decoded another loss than the majority (name -> round)
    disagreeing: dict[str, int] = field(default_factory=dict)

    def observe(self, statuses: Mapping[str, SelectionStatus]) -> float | None:
        """Take the majority's (scored round, loss) among ``statuses``; None if nobody scored."""
        votes = Counter((s.scored, s.loss) for s in statuses.values() if s.scored is not None and s.loss is not None)
        if not votes:
            return None
        (scored, loss), _ = max(votes.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))  # ties: deterministic
        for name, s in statuses.items():
            if s.scored is not None and (s.scored, s.loss) != (scored, loss):
                self.disagreeing.setdefault(name, int(s.scored))
        if scored in self.rounds:
            return None  # the same model scored again (a resumed round): counted once
        self.rounds.append(int(scored))
        self.losses.append(float(loss))  # type: ignore[arg-type]
        if self.best_round is None or loss < self.best_loss - self.rule.min_delta:  # type: ignore[operator]
            self.best_round, self.best_loss, self.bad = int(scored), float(loss), 0  # type: ignore[arg-type]
        else:
            self.bad += 1
        return float(loss)  # type: ignore[arg-type]

    @property
    def should_stop(self) -> bool:
        """``patience`` scored rounds in a row without improvement."""
        return self.rule.patience > 0 and self.bad >= self.rule.patience

    def to_dict(self) -> dict[str, object]:
        """Journal form."""
        return {"rounds": list(self.rounds), "losses": list(self.losses), "best_round": self.best_round,
                "best_loss": None if math.isinf(self.best_loss) else self.best_loss, "bad": self.bad,
                "disagreeing": dict(self.disagreeing)}

    def load(self, data: Mapping[str, object]) -> None:
        """Restore from :meth:`to_dict`."""
        self.rounds = [int(x) for x in data.get("rounds", [])]  # type: ignore[union-attr]
        self.losses = [float(x) for x in data.get("losses", [])]  # type: ignore[union-attr]
        best = data.get("best_round")
        self.best_round = None if best is None else int(best)  # type: ignore[call-overload]
        loss = data.get("best_loss")
        self.best_loss = math.inf if loss is None else float(loss)  # type: ignore[arg-type]
        self.bad = int(data.get("bad", 0))  # type: ignore[call-overload]
        self.disagreeing = {str(k): int(v) for k, v in dict(data.get("disagreeing", {})).items()}  # type: ignore[call-overload]
