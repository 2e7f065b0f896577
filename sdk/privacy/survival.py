"""Patient-level DP-SGD for the survival head (``[target] kind = "survival"`` with ``[privacy]``).

The discrete-time hazard likelihood (Gensheimer & Narasimhan 2019, eq. 3;
:mod:`clinograph.sdk.training.survival`) is a sum over patients of one term a patient,
−Σ_k [s_ik log(1 − h_ik) + e_ik log h_ik], and each term reads only that patient's star and its
own (s_i, e_i) rows. So one patient is one DP-SGD example, exactly as for the binary head:
per-patient gradients are exact, clipping bounds one patient's contribution, and the
accountant (:class:`~clinograph.sdk.privacy.accountant.PrivacyLedger`) composes ε over the same
Poisson-sampled steps. Censored patients stay in (their survival terms are their example).

This module adapts the DP trainer of :mod:`clinograph.sdk.privacy.trainer` to that loss; it
changes no privacy mechanism (sampling, clipping, noise, accounting are the trainer's):

- the training rows carry (s_i, e_i) as one [2K] label row in place of the 0/1 label;
- :class:`HazardClipper` is the per-patient engine (:mod:`clinograph.sdk.privacy.per_patient`)
  with the hazard loss as its objective, plus a part rule for the per-interval baseline β
  (``head/hazard_baseline``), whose per-patient gradient is ∂ℓ_i/∂z_i itself;
- everything else (optimizer groups, flat or adaptive clipping, the step) is the DP trainer's.

Under ``[privacy] mode = "distributed"`` the same engine (:class:`HazardClipper`) gives each
patient's row of the distributed step (:mod:`.distributed_trainer`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import TensorDataset

from clinograph.core.errors import ConfigError

from ..model.heads import HazardBaseline
from ..training.survival import interval_targets
from .ghost import Formed, LayerPart
from .part_rules import register_part_rule
from .per_patient import PerPatientClipper
from .trainer import DPTrainer, dp_trainer_factory


def hazard_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Σ_i −Σ_k [s_ik log(1 − h_ik) + e_ik log h_ik] with ``labels`` = [s | e] (Gensheimer &
    Narasimhan eq. 3). Shapes: [B, K], [B, 2K] -> []."""
    k = logits.shape[-1]
    s, e = labels[:, :k].to(logits.dtype), labels[:, k:].to(logits.dtype)
    return -(s * F.logsigmoid(-logits) + e * F.logsigmoid(logits)).sum()


def _probe_labels(b: int, k: int) -> torch.Tensor:
    """Synthetic [s | e] rows for the self-check (no patient data): survived j intervals, then
    an event (even rows) or censoring (odd rows)."""
    s, e = torch.zeros(b, k), torch.zeros(b, k)
    for i in range(b):
        j = i % k
        s[i, :j] = 1.0
        if i % 2 == 0:
            e[i, j] = 1.0
    return torch.cat([s, e], dim=1)


def hazard_objective(model: torch.nn.Module, inputs, labels: torch.Tensor) -> torch.Tensor:
    """The engine's objective for the survival head: :func:`hazard_loss_sum` of the star logits."""
    return hazard_loss_sum(model(*inputs), labels)


@register_part_rule(HazardBaseline)
def _baseline_parts(mod: HazardBaseline, calls, b: int) -> dict[int, LayerPart]:
    """β's per-patient gradient is ∂ℓ_i/∂z_i itself (z_ik = β_k + r_i)."""
    if not mod.bias.requires_grad:
        return {}
    return {id(mod.bias): Formed(sum(g.reshape(b, -1) for _, g in calls))}


class HazardClipper(PerPatientClipper):
    """The per-patient engine (:class:`~clinograph.sdk.privacy.per_patient.PerPatientClipper`)
    on the hazard likelihood of :func:`hazard_loss_sum` (labels [B, 2K]); its probe labels are
    synthetic [s | e] rows."""

    def __init__(self, model: torch.nn.Module, *, probe=None):
        labels = None
        if probe is not None:
            with torch.no_grad():
                k = int(model(*probe).shape[-1])
            labels = _probe_labels(int(probe[0].shape[0]), k)
        super().__init__(model, objective=hazard_objective, probe=probe, probe_labels=labels)


class SurvivalDPTrainer(DPTrainer):
    """:class:`~clinograph.sdk.privacy.trainer.DPTrainer` on the hazard likelihood (module
    docstring). Same guarantee: (ε, δ)-DP with respect to adding or removing one patient's
    star and follow-up at this hospital, ε composed in the hospital's ledger.

    Args: as :class:`DPTrainer`, plus ``breaks``: the interval ends b_k in days.
    ``s``/``e``: the [n, K] likelihood targets of every patient (local, as the non-DP trainer's).
    """

    def __init__(self, table, *, breaks: np.ndarray, **kwargs):
        if table.survival is None:
            raise ConfigError(f"Hospital {table.site!r}: [target] kind = 'survival' but its table has no "
                              "time-to-event label. Declare [survival] time, event and time_unit in its site schema.")
        super().__init__(table, **kwargs)
        self.s, self.e = interval_targets(table.survival.time, table.survival.event, breaks)
        idx = torch.as_tensor(self.train_idx, dtype=torch.long)
        rows = torch.as_tensor(np.concatenate([self.s, self.e], axis=1), dtype=torch.float32)[idx]
        fi, x, m, _ = self.dataset.tensors
        self.dataset = TensorDataset(fi, x, m, rows)

    def _engine(self, model, probe) -> HazardClipper:
        return HazardClipper(model, probe=probe)

    @torch.no_grad()
    def predict(self, model) -> np.ndarray:
        """Hazard logits of every patient (star path; local use, not a release). Shapes: -> [n, K]."""
        model.eval()
        return model.forward_batch(self.stars).double().numpy()


def survival_dp_trainer(*, table, train_idx: np.ndarray, config, site: str, state_dir, signer,
                        breaks: np.ndarray) -> SurvivalDPTrainer:
    """The survival DP trainer of a hospital: σ, clipping, ledger and accountant exactly as
    :func:`clinograph.sdk.privacy.trainer.dp_trainer_factory` sets them from ``[privacy]``."""
    return dp_trainer_factory(table=table, train_idx=train_idx, config=config, site=site, state_dir=state_dir,
                              signer=signer, trainer_cls=SurvivalDPTrainer, breaks=breaks)
