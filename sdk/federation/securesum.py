"""One set-up round that sums a vector of non-negative counts over the hospitals through the
secure mode, before training: the federated histograms of :mod:`.scaling` and the feature
coverage of :mod:`.coverage`.

Driven by the run's set-up phase (:mod:`clinograph.secure.runtime.setup`, inside
:func:`clinograph.secure.runtime.run.run_federation`), in a simulation and over Flower alike; the
hospital side is :mod:`.setup`. Each hospital writes ``c · counts`` and ``c`` as the weighted update of one shared
module (``c`` a public scale that keeps every value inside the masked mode's fixed-point range;
counts above ``cap`` are capped). Its aggregation weight is 1 at every hospital, so the weight
reveals nothing. The round runs FedSGD at server learning rate 1 under the federation's secure
mode (``masked``; or ``insecure_plaintext`` by name): the global module moves by
``c · (Σ_k v_k, K) / K`` (K contributors), so the server learns the sum only, never a hospital's
vector, and every hospital decodes ``Σ_k v_k`` from the signed global model and the round's
public contributor count.

Refused: CKKS (the audited result would reveal the sum CKKS hides). Under local DP the vector is a
Gaussian release of clipped per-patient counts (:mod:`clinograph.sdk.privacy.counts`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from clinograph.secure.runtime.setup import SETUP_MODES
from torch import nn

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.spec import ModuleKind

from ..config import ReleaseSection
from ..model.modules import ModuleMap, Piece
from ..training.trainer import TrainOutcome
from .client import HospitalClient
from .task import TaskBase

#: the secure modes a set-up round runs under (under CKKS the audited result would reveal the sum CKKS hides)
SECURE_SUM_MODES = SETUP_MODES


class SecureSumTask(TaskBase):
    """One hospital's share of a secure-sum round (implements
    :class:`~clinograph.sdk.federation.task.Task`).

    ``train`` writes ``local = global − c · (v, 1)`` so that the client's weighted delta
    ``1 · (global − local)`` is ``c · (v, 1)``; nothing is trained.
    """

    def __init__(self, vector: np.ndarray, *, name: str, module: str, cap: float):
        self.name, self.module, self.cap = name, module, float(cap)
        self._vector = np.asarray(vector, dtype=np.float64).ravel()
        if np.any(self._vector < 0) or not np.all(np.isfinite(self._vector)):
            raise ValueError("a secure-sum vector holds finite, non-negative counts")
        #: under local DP: the signed report entry of the release this share is (sdk/privacy/counts.py)
        self.ledger_entry = None
        #: the round this share was sent for (None: not yet); it is sent once (:meth:`refuse_again`)
        self.sent_round: int | None = None
        self._param = nn.Parameter(torch.zeros(self._vector.size + 1, dtype=torch.float64), requires_grad=False)
        self.modules = ModuleMap()
        self.modules.add(module, ModuleKind.SHARED, [Piece(self._param)])

    def __repr__(self) -> str:
        return f"SecureSumTask(name={self.name!r}, length={self._vector.size})"

    @property
    def num_samples(self) -> int:
        return 1  # the weight: the same at every hospital, so it reveals nothing

    def refuse_again(self, round_: int) -> None:
        """ProtocolError once this share was sent: a second sum of the same vector over other
        hospitals would give this hospital's vector by difference (Σ over {a, b, c} − Σ over {b, c})."""
        if self.sent_round is not None:
            raise ProtocolError(f"This hospital already sent its share of the set-up sum {self.name!r} (round "
                                f"{self.sent_round}); the server asks for it again (round {round_}). A second sum over "
                                "other hospitals would reveal this hospital's vector by difference. Refused; nothing "
                                "was sent. A set-up sum runs once a run: start a new run if the sum failed.")

    def train(self, *, round_: int, epochs: int, plan_options: Mapping[str, float | int | str | bool]) -> TrainOutcome:
        from ..training.selection import value_bound

        self.refuse_again(round_)
        self.sent_round = round_
        c = value_bound(plan_options) / self.cap
        vec = np.concatenate([np.minimum(self._vector, self.cap), [1.0]]) * c
        with torch.no_grad():
            self._param.sub_(torch.from_numpy(vec))
        return TrainOutcome(loss=0.0, used_similar_to=False, ledger=self.ledger_entry)

    def trained_modules(self, outcome: TrainOutcome) -> list[str]:
        return [self.module]

    def after_round(self) -> None:
        return None

    def summed(self, *, contributors: int) -> np.ndarray:
        """``Σ_k v_k`` decoded from the loaded global module (flat).

        FedSGD publishes the weighted *mean* ``c · (Σ_k v_k, K) / K`` (weights 1), so the ratio
        to the scale slot is ``Σ_k v_k / K``; ``contributors`` = K, the round's contributor count
        (public: the audit trail lists the contributors).
        """
        moved = -self.modules.get(self.module)
        if not moved[-1] > 0 or contributors < 1:
            raise ProtocolError(f"The {self.name} sum carries no scale: no hospital contributed to the round.")
        return moved[:-1] / moved[-1] * contributors

    def evaluate(self, split: str) -> dict[str, float]:
        return {}

    def quality(self) -> dict[str, float]:
        raise ConfigError(f"The {self.name} round has no quality metrics; use [release] metrics = 'none'.")

    def feature_relevance(self) -> dict[str, float]:
        return {}

    def predict(self) -> np.ndarray:
        raise ConfigError(f"The {self.name} round has no model to predict with.")


def share_client(task: SecureSumTask, *, identity: Identity, server: PublicIdentity,
                 peers: Mapping[str, PublicIdentity], dictionary_hash: str, federation_id: str,
                 accept_plaintext: bool = False, masked_threshold: int | None = None,
                 secure_modes: tuple[str, ...] = ("masked",)) -> HospitalClient:
    """The client that answers a set-up sum's round with ``task`` (nothing released but the share;
    ``accept_plaintext``, ``masked_threshold``: the hospital's [release] insecure_accept_plaintext and
    masked_threshold; ``secure_modes``: masked, the one secure mode of a set-up sum, whatever the
    modes the hospital trains under -- its own config asked for the sums)."""
    return HospitalClient(task=task, identity=identity, server=server, peers=peers, dictionary_hash=dictionary_hash,
                          federation_id=federation_id,
                          release=ReleaseSection(insecure_accept_plaintext=accept_plaintext,
                                                 masked_threshold=masked_threshold, secure_modes=secure_modes))
