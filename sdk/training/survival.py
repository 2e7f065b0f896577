"""Time-to-event targets: the discrete-time hazard likelihood and the survival metrics.

**Model** (Gensheimer & Narasimhan 2019, "A scalable discrete-time survival model for neural
networks", nnet-survival). Follow-up is cut at the public interval ends 0 < b_1 < ... < b_K
(``[target] breaks``). The network gives K logits z_ik; h_ik = σ(z_ik) is the conditional
probability that patient i has the event in interval k given it reached b_{k-1}. Survival to
the end of interval k is S_i(b_k) = Π_{j≤k} (1 − h_ij) (their eq. 1); the risk at a horizon t
is 1 − S_i(t), with a constant hazard inside an interval (S interpolated log-linearly).

**Likelihood** (their eq. 3): −log L = −Σ_i Σ_k [s_ik log(1 − h_ik) + e_ik log h_ik], with
s_ik = 1 for every interval patient i survived and e_ik = 1 for the interval of an observed
event. **Censoring is handled, not dropped**: a patient censored in interval k contributes
its survival terms for the intervals before k, and for interval k itself when it was followed
for at least half of it (their convention); follow-up past b_K is censored at b_K.

Why the discrete-time hazard and not Cox's partial likelihood (DeepSurv, Katzman et al.
2018): the hazard likelihood is a sum of one term a patient, so minibatches are unbiased,
per-patient gradients exist (patient-level DP-SGD clips exactly one patient's contribution),
the secure validation sum (Σ loss, n) of model selection works unchanged, and the model gives
absolute risks at a horizon (a Cox model needs a separate baseline-hazard estimate, which a
federation would have to aggregate). Cox's partial likelihood couples each event to its risk
set in the batch, so none of these hold.

**Metrics.** Harrell's concordance index (``lifelines.utils.concordance_index``, with the
risk at the last break as the score). Horizon AUROC at t, cumulative/dynamic (Heagerty &
Zheng 2005): cases T_i ≤ t with an event, controls T_j > t; a patient censored before t has
an unknown status and is not a control. Two estimators: ``auroc`` on the patients whose
status at t is known (cases vs controls, unweighted), and ``auroc_ipcw`` with Uno et al.'s
(2007) inverse-probability-of-censoring weights 1/Ĝ(T_i⁻) on the cases (Ĝ: Kaplan-Meier of
the censoring distribution of the same patients), which corrects for the excluded censored
patients. AUPRC and Brier score at t on the known-status patients.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

from .metrics import binary_metrics


def interval_targets(time: np.ndarray, event: np.ndarray, breaks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s [n, K], e [n, K]) of the likelihood (module docstring; Gensheimer & Narasimhan eq. 3).

    ``time`` in the unit of ``breaks``; ``event`` 1/0.
    """
    time, event = np.asarray(time, float), np.asarray(event).astype(bool)
    ends = np.asarray(breaks, float)
    starts = np.concatenate([[0.0], ends[:-1]])
    mid = (starts + ends) / 2
    n, k = len(time), len(ends)
    s = np.zeros((n, k))
    e = np.zeros((n, k))
    t = time[:, None]
    # events: survived every interval that ended at or before t; the event interval holds t
    ev_in = event[:, None] & (t >= starts) & (t < ends)
    s_ev = event[:, None] & (ends <= t)
    # censored (or followed past b_K): survived intervals ended by t, and the one it saw half of
    s_ce = (~event[:, None] | (t >= ends[-1])) & (mid <= t)
    s[s_ev | s_ce] = 1.0
    e[ev_in] = 1.0
    return s, e


def hazard_nll(logits: torch.Tensor, s: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Mean over patients of −Σ_k [s_k log(1 − h_k) + e_k log h_k], h = σ(logits). Shapes: [B, K] x3 -> []."""
    per = -(s * F.logsigmoid(-logits) + e * F.logsigmoid(logits)).sum(-1)
    return per.mean()


def hazard_nll_sum(logits: np.ndarray, s: np.ndarray, e: np.ndarray) -> float:
    """Σ over patients of the negative log-likelihood (numpy, for the validation sums)."""
    z = np.asarray(logits, float)
    return float(np.sum(s * np.logaddexp(0.0, z) + e * np.logaddexp(0.0, -z)))


def survival_curves(hazard_logits: np.ndarray) -> np.ndarray:
    """S_i(b_k) = Π_{j≤k} (1 − h_ij). Shapes: [n, K] -> [n, K]."""
    z = np.asarray(hazard_logits, float)
    return np.exp(np.cumsum(-np.logaddexp(0.0, z), axis=1))


def risk_at(hazard_logits: np.ndarray, breaks: np.ndarray, horizon: float) -> np.ndarray:
    """1 − S_i(t) at ``horizon`` t, a constant hazard inside an interval. Shapes: [n, K] -> [n]."""
    ends = np.asarray(breaks, float)
    log_s = np.concatenate([np.zeros((len(hazard_logits), 1)), np.log(survival_curves(hazard_logits))], axis=1)
    starts = np.concatenate([[0.0], ends])
    k = int(np.clip(np.searchsorted(ends, horizon, side="left"), 0, len(ends) - 1))
    frac = float(np.clip((horizon - starts[k]) / (ends[k] - starts[k]), 0.0, 1.0))
    return 1.0 - np.exp(log_s[:, k] + frac * (log_s[:, k + 1] - log_s[:, k]))


def censoring_survival(time: np.ndarray, event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kaplan-Meier estimate Ĝ of the censoring distribution (censoring is the 'event'):
    (distinct times, Ĝ just after each)."""
    time, cens = np.asarray(time, float), ~np.asarray(event).astype(bool)
    ts = np.unique(time)
    at_risk = np.array([(time >= u).sum() for u in ts])
    d = np.array([(cens & (time == u)).sum() for u in ts])
    return ts, np.cumprod(1.0 - d / np.maximum(at_risk, 1))


def _g_before(ts: np.ndarray, g: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Ĝ(x⁻): the censoring survival just before x."""
    i = np.searchsorted(ts, x, side="left") - 1
    return np.where(i >= 0, g[np.clip(i, 0, None)], 1.0)


def horizon_auroc_ipcw(time: np.ndarray, event: np.ndarray, risk: np.ndarray, horizon: float) -> float:
    """Cumulative/dynamic AUROC at ``horizon`` with Uno's IPCW weights on the cases (module
    docstring). NaN without both cases and controls."""
    time, event, risk = np.asarray(time, float), np.asarray(event).astype(bool), np.asarray(risk, float)
    case = event & (time <= horizon)
    ctrl = time > horizon
    if not case.any() or not ctrl.any():
        return float("nan")
    ts, g = censoring_survival(time, event)
    w = 1.0 / np.maximum(_g_before(ts, g, time[case]), 1e-8)
    rc, rk = risk[case][:, None], risk[ctrl][None, :]
    wins = (rc > rk).sum(1) + 0.5 * (rc == rk).sum(1)
    return float(np.sum(w * wins) / (np.sum(w) * ctrl.sum()))


def concordance(time: np.ndarray, event: np.ndarray, risk: np.ndarray) -> float:
    """Harrell's C (higher risk, earlier event); NaN when no pair is comparable."""
    from lifelines.utils import concordance_index

    try:
        return float(concordance_index(np.asarray(time, float), -np.asarray(risk, float), np.asarray(event)))
    except ZeroDivisionError:
        return float("nan")


def horizon_labels(time: np.ndarray, event: np.ndarray, horizon: float) -> tuple[np.ndarray, np.ndarray]:
    """(known, label): the binary horizon form -- an event by t is 1, follow-up past t is 0, a
    patient censored before t has no known status."""
    time, event = np.asarray(time, float), np.asarray(event).astype(bool)
    known = (time > horizon) | (event & (time <= horizon))
    return known, (event & (time <= horizon)).astype(int)


def survival_metrics(time: np.ndarray, event: np.ndarray, risk: np.ndarray, *, horizon: float) -> dict[str, float]:
    """{'cindex', 'auroc', 'auroc_ipcw', 'auprc', 'brier', 'ece', 'loss', 'n', 'positives', 'known'}
    for the risk 1 − S(t) at ``horizon`` (module docstring): C-index over all patients; the
    binary metrics over the patients whose status at t is known."""
    known, y = horizon_labels(time, event, horizon)
    out = binary_metrics(y[known], np.asarray(risk, float)[known])
    out.update({"cindex": concordance(time, event, risk), "auroc_ipcw": horizon_auroc_ipcw(time, event, risk, horizon),
                "n": float(len(time)), "known": float(known.sum())})
    return out


def hazard_objective(s: np.ndarray, e: np.ndarray):
    """The ``objective`` of :func:`clinograph.sdk.training.local.train_epochs` for the survival
    head: :func:`hazard_nll` of the batch's hazard logits against its (s, e) rows."""
    import functools

    st, et = torch.as_tensor(s, dtype=torch.float32), torch.as_tensor(e, dtype=torch.float32)
    return functools.partial(_batch_hazard_nll, st, et)  # not a closure: a trainer pickles (worker processes)


def _batch_hazard_nll(st: torch.Tensor, et: torch.Tensor, logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return hazard_nll(logits, st[batch].to(logits.dtype), et[batch].to(logits.dtype))


class SurvivalTrainer:
    """The non-DP trainer (:class:`clinograph.sdk.training.trainer.GraphTrainer`) with the
    hazard likelihood; ``predict`` gives the [n, K] hazard logits of every patient."""

    def __init__(self, table, *, train_idx: np.ndarray, k_similar: int, config, breaks: np.ndarray):
        from .trainer import GraphTrainer

        if table.survival is None:
            from clinograph.core.errors import ConfigError

            raise ConfigError(f"Hospital {table.site!r}: [target] kind = 'survival' but its table has no "
                              "time-to-event label. Declare [survival] time, event and time_unit in its site schema.")
        self.inner = GraphTrainer(table, train_idx=train_idx, k_similar=k_similar, config=config)
        self.table, self.train_idx, self.config = table, self.inner.train_idx, config
        self.stars = self.inner.stars
        self.s, self.e = interval_targets(table.survival.time, table.survival.event, breaks)
        self.objective = hazard_objective(self.s, self.e)

    def train(self, model, *, round_: int, epochs: int, plan_options: dict):
        from .local import train_epochs
        from .trainer import TrainOutcome

        mu = float(plan_options.get("fedprox.mu", 0.0))
        prox = (mu, {k: v.detach().clone() for k, v in model.named_parameters()}) if mu > 0 else None
        loss = train_epochs(model, epochs=epochs, train_idx=self.train_idx, config=self.config, stars=self.stars,
                            round_=round_, proximal=prox, objective=self.objective)
        return TrainOutcome(loss=loss, used_similar_to=self.stars.has_neighbours)

    @torch.no_grad()
    def predict(self, model) -> np.ndarray:
        """Hazard logits of every patient. Shapes: -> [n, K]."""
        model.eval()
        return model.forward_batch(self.stars).double().numpy()
