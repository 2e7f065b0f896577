"""Attention-weighted aggregation (AGAT eq. 1) with FedAtt's attention (Ji et al. 2019).

AGAT eq. (1): θ ← θ − η Σ_i β_i ∇θ_i, with β_i "the attention score for the i-th client"; the
paper does not say how β_i is computed. We take the published rule of FedAtt (Ji, Pan, Long,
Li, Jiang, Huang: "Learning Private Neural Language Modeling with Attentive Aggregation",
IJCNN 2019, arXiv:1812.07108): per layer l, the score of client k is the distance between the
server's and the client's parameters, s_k^l = ||θ^l − θ_k^l||_2, and β_k^l = softmax_k(s_k^l);
the server steps θ^l ← θ^l − η Σ_k β_k^l (θ^l − θ_k^l). With Clinograph's sign convention
Δ_k = θ_global − θ_local this is ``θ − η Σ_k β_k Δ_k``, module-wise over each module's contributors.

Two strategies:

- ``insecure_attention`` -- FedAtt as published, layer-wise (one score per module and
  hospital). The server computes the scores, so it needs every hospital's individual update:
  it runs only under ``secure_mode = "insecure_plaintext"`` and :func:`check_secure_mode` refuses
  every other mode by name, with the reason. Under plaintext it reads the signed updates off
  the wire (:class:`PlaintextUpdateTap`), warns every time it is built, and is refused in
  production with the plaintext mode itself.
- ``agat_secure_attention`` -- the same rule with the score computed where the update is:
  each hospital computes its own logit s_k = ||θ_global − θ_k|| (over its network modules,
  one score a hospital since a hospital has one weight on the wire), multiplies its delta by
  exp(s_k) and puts exp(s_k) in the weight slot. The module-wise weighted mean the secure mode
  reveals, Σ_k e^{s_k} Δ_k / Σ_k e^{s_k}, is then Σ_k softmax(s)_k Δ_k over each module's
  contributors -- attention-weighted, and the server never sees one update or one score. The
  server side is FedSGD (NS-FL eq. 6, η = ``server_lr``); the rule reaches the hospitals as
  the plan options :data:`ATTENTION_OPTION` and :data:`MAX_LOGIT_OPTION`.

What the secure variant does not hide: the weight sums Σ_k e^{s_k} per module (every masked
round reveals weight sums), so a federation of two learns e^{s_1} + e^{s_2}. Logits are capped
at ``max_logit`` so that e^{s} stays inside the masked mode's weight bound.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from clinograph.core.errors import ConfigError, ProtocolError
from clinograph.core.identity import PublicIdentity

from ..aggregation.base import ModuleSums
from ..aggregation.checks import decode_modules
from ..messages import ClientUpdate, RoundPlan
from ..policy import InsecureOptionWarning
from ..wire import open_envelope, parse_envelope
from .base import Strategy
from .fedavg import FedSGD

if TYPE_CHECKING:  # runtime imports strategies; only the annotation needs the transport
    from ..runtime.transport import Parts, Transport

#: plan option naming the rule hospitals weight themselves by (value: "fedatt")
ATTENTION_OPTION = "attention.rule"
#: plan option: the cap on a hospital's logit (its weight is exp(min(s, cap)))
MAX_LOGIT_OPTION = "attention.max_logit"
#: the default cap: e^8 ≈ 2981, inside the default weight bound (10 000)
DEFAULT_MAX_LOGIT = 8.0
#: modules that take the plain weighted mean, not FedAtt: model selection's ``metric/`` (Σ loss / Σ n must
#: stay linear in the sums) and AGAT's per-feature Gaussians ``augmentation/`` (moment estimates, not
#: gradients: FedAtt made the hospital whose estimate lies farthest from the global one weigh most)
DEFAULT_PLAIN_PREFIXES = "metric/,augmentation/"
#: why ``insecure_attention`` needs the plaintext mode (in every refusal)
WHY_PLAINTEXT = ("FedAtt's server-side attention (Ji et al. 2019) scores each hospital's individual update, "
                 "and only insecure_plaintext shows the server individual updates")


def fedatt_scores(deltas: Mapping[str, np.ndarray]) -> dict[str, float]:
    """FedAtt's score per hospital: s_k = ||Δ_k||_2 (Δ_k = θ_global − θ_k of one layer)."""
    return {k: float(np.linalg.norm(np.asarray(v, dtype=np.float64))) for k, v in deltas.items()}


def softmax(scores: Mapping[str, float]) -> dict[str, float]:
    """β_k = exp(s_k) / Σ_j exp(s_j) (computed stably; keys in the order given)."""
    if not scores:
        return {}
    top = max(scores.values())
    e = {k: math.exp(s - top) for k, s in scores.items()}
    total = sum(e.values())
    return {k: v / total for k, v in e.items()}


def attention_weight(logit: float, *, max_logit: float) -> float:
    """The weight a hospital applies in the secure variant: exp(min(max(s, 0), max_logit))."""
    if not math.isfinite(logit):
        raise ConfigError(f"Attention logit must be finite, got {logit!r}.")
    return math.exp(min(max(float(logit), 0.0), float(max_logit)))


def check_secure_mode(strategy: str, secure_mode: str) -> None:
    """Refuse ``insecure_attention`` under any mode but ``insecure_plaintext`` (no-op for others).

    Raises:
        ConfigError: naming the strategy, the mode, the reason and the fix.
    """
    if strategy == InsecureAttention.name and secure_mode not in InsecureAttention.secure_modes:
        raise ConfigError(
            f"strategy = 'insecure_attention' is refused under secure_mode = {secure_mode!r}: {WHY_PLAINTEXT}; "
            f"{secure_mode!r} reveals only sums. Use strategy = 'agat_secure_attention' (each hospital weighs "
            "its own update inside the masked sum), or secure_mode = 'insecure_plaintext' outside production.")


class AgatSecureAttention(FedSGD):
    """FedSGD on the server; every hospital weighs itself by exp(FedAtt logit) (module doc).

    Args:
        server_lr: η of AGAT eq. (1) / NS-FL eq. (6).
        max_logit: cap on a hospital's logit; exp(max_logit) must stay within ``weight.max``.
    """

    name = "agat_secure_attention"

    def __init__(self, server_lr: float = 1.0, max_logit: float = DEFAULT_MAX_LOGIT):
        super().__init__(server_lr=server_lr)
        if not 0 < float(max_logit) <= 20:
            raise ConfigError(f"agat_secure_attention: max_logit must be in (0, 20], got {max_logit}. Set "
                              "[federation.strategy_options] max_logit (default 8: weights up to e^8 ≈ 2981).")
        self.max_logit = float(max_logit)

    def constructor_options(self) -> dict[str, float | int | str | bool]:
        return {"server_lr": self.server_lr, "max_logit": self.max_logit}

    def plan_options(self) -> dict[str, float | int | str | bool]:
        return {ATTENTION_OPTION: "fedatt", MAX_LOGIT_OPTION: self.max_logit}


@dataclass
class _RoundUpdates:
    """Individual updates read off the wire for one round: client -> (weight, module -> w·Δ)."""

    round: int
    updates: dict[str, tuple[float, dict[str, np.ndarray]]] = field(default_factory=dict)


class InsecureAttention(Strategy):
    """FedAtt, layer-wise, computed by the server from every hospital's update (insecure).

    Per module m and its contributors K_m: Δ_k^m = (w_k Δ_k^m) / w_k, s_k^m = ||Δ_k^m||,
    β^m = softmax(s^m), θ^m ← θ^m − η Σ_k β_k^m Δ_k^m. Modules under ``plain_prefixes``
    (model selection's ``metric/``, AGAT's Gaussians ``augmentation/``) take the ordinary weighted
    mean Σ w Δ / Σ w instead, which keeps them linear in the sums.

    The individual updates come from :meth:`offer_update` (fed by :class:`PlaintextUpdateTap`);
    :meth:`apply` checks they add up to the sums the server aggregated and refuses otherwise.
    """

    name = "insecure_attention"
    #: the only secure modes this strategy runs under
    secure_modes: tuple[str, ...] = ("insecure_plaintext",)

    def __init__(self, server_lr: float = 1.0, plain_prefixes: str = DEFAULT_PLAIN_PREFIXES):
        if not server_lr > 0:
            raise ConfigError(f"insecure_attention: server_lr must be > 0, got {server_lr}.")
        self.server_lr = float(server_lr)
        self.plain_prefixes = tuple(p for p in str(plain_prefixes).split(",") if p)
        self._pending: _RoundUpdates | None = None
        #: per round, per module: the attention scores β (kept for the benchmark and tests)
        self.history: list[dict[str, dict[str, float]]] = []
        warnings.warn(f"insecure_attention is in use: {WHY_PLAINTEXT}. The audit log marks the run insecure "
                      "(secure_mode = insecure_plaintext).", InsecureOptionWarning, stacklevel=2)

    def constructor_options(self) -> dict[str, float | int | str | bool]:
        return {"server_lr": self.server_lr, "plain_prefixes": ",".join(self.plain_prefixes)}

    def offer_update(self, *, round_: int, client: str, weight: float, modules: Mapping[str, np.ndarray]) -> None:
        """One hospital's verified update (weighted deltas and its weight) for ``round_``."""
        if self._pending is None or self._pending.round != round_:
            self._pending = _RoundUpdates(round=round_)
        self._pending.updates[client] = (float(weight), {k: np.asarray(v, dtype=np.float64) for k, v in modules.items()})

    def apply(self, state: Mapping[str, np.ndarray], sums: ModuleSums) -> dict[str, np.ndarray]:
        pending, self._pending = self._pending, None
        if pending is None:
            raise ConfigError(f"strategy = 'insecure_attention' got only aggregated sums: {WHY_PLAINTEXT}. Run it "
                              "under secure_mode = 'insecure_plaintext' with its PlaintextUpdateTap, or use "
                              "strategy = 'agat_secure_attention'.")
        updates = {c: pending.updates[c] for c in sums.contributors if c in pending.updates}
        missing = sorted(set(sums.contributors) - set(updates))
        if missing:
            raise ProtocolError(f"insecure_attention: no individual update read for contributor(s) {missing}; "
                                "the tap and the server disagree. Nothing applied.")
        out = {k: np.array(v, dtype=np.float64, copy=True) for k, v in state.items()}
        record: dict[str, dict[str, float]] = {}
        for name in sorted(sums.sums):
            if sums.weights.get(name, 0.0) <= 0:
                continue
            mine = {c: (w, mods[name]) for c, (w, mods) in sorted(updates.items()) if name in mods}
            total = sum(wd for _, wd in mine.values())
            if not np.allclose(total, sums.sums[name], rtol=1e-9, atol=1e-9):
                raise ProtocolError(f"insecure_attention: the updates read for module {name!r} do not add up to "
                                    "the aggregated sum. Nothing applied.")
            if name.startswith(self.plain_prefixes):
                step = sums.mean(name)
            else:
                deltas = {c: wd / w for c, (w, wd) in mine.items()}
                beta = softmax(fedatt_scores(deltas))
                record[name] = beta
                step = sum(beta[c] * deltas[c] for c in deltas)
            out[name] = out[name] - self.server_lr * np.asarray(step).reshape(out[name].shape)
        self.history.append(record)
        return out


class PlaintextUpdateTap:
    """A transport wrapper for ``insecure_attention``: reads each hospital's signed plaintext
    :class:`~clinograph.secure.messages.ClientUpdate` from its answer to the plan and offers it to
    the strategy (signature, round and modules checked against the signed plan). Forwards
    everything unchanged; what it reads is exactly what the server receives.

    Raises (at construction):
        ConfigError: the federation's secure mode is not ``insecure_plaintext``
            (:func:`check_secure_mode`), or the strategy is not ``insecure_attention``.
    """

    def __init__(self, inner: Transport, *, strategy: Strategy, secure_mode: str, server: PublicIdentity,
                 enrolled: Mapping[str, PublicIdentity]):
        check_secure_mode(InsecureAttention.name, secure_mode)
        if not isinstance(strategy, InsecureAttention):
            raise ConfigError(f"PlaintextUpdateTap feeds insecure_attention; the federation runs {strategy.name!r}.")
        self.inner, self.strategy, self.server, self.enrolled = inner, strategy, server, dict(enrolled)

    @property
    def defers_model(self) -> bool:
        return bool(self.inner.defers_model)

    def hospitals(self) -> tuple[str, ...]:
        return self.inner.hospitals()

    def __getattr__(self, name: str) -> Any:  # e.g. InProcessTransport.drop_at
        return getattr(self.inner, name)

    def exchange(self, stage: str, outgoing: Mapping[str, Mapping[str, bytes]], *,
                 round_: int) -> tuple[dict[str, Parts], dict[str, str]]:
        answers, failed = self.inner.exchange(stage, outgoing, round_=round_)
        if stage == "plan":
            for name, parts in answers.items():
                if "first" not in parts or name not in self.enrolled:
                    continue
                try:
                    plan = open_envelope(parse_envelope(outgoing[name]["data"]), sender=self.server, model=RoundPlan)
                    upd = open_envelope(parse_envelope(parts["first"]), sender=self.enrolled[name], model=ClientUpdate)
                    if upd.round != plan.round or upd.client != name:
                        continue
                    modules = decode_modules(plan, upd.modules, sender=name)
                except Exception:  # noqa: BLE001, S112 - the server refuses it too; apply() then names the gap
                    continue
                self.strategy.offer_update(round_=plan.round, client=name, weight=upd.weight, modules=modules)
        return answers, failed
