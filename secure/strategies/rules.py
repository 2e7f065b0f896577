"""FedNSL's server half as a strategy: sum the posteriors, keep the mixture, run the M-step,
publish the rules (FedNSL Algorithm 1 lines 12-15).

Three shared modules carry the rule distributions (fixed length over the federation's public
rule space: ``n_heads × n_bodies``, head-major):

- :data:`POSTERIOR_MODULE`: each hospital's posterior (eq. 10), weighted by its aggregation
  weight ``w_i`` (its training-patient count) like any module. Under ``masked`` the server
  learns ``Σ_i w_i p_i`` and ``Σ_i w_i`` -- the **mixture** of the posteriors -- and nothing
  about any one hospital's posterior. Its global value becomes that mixture.
- :data:`SUPPORT_MODULE`: per rule, the mean fuzzy value of ``body ∧ head`` and of ``body`` over
  a hospital's labelled patients, weighted the same way: the sum is the pooled support and
  coverage over all the federation's patients. Its global value becomes that pooled pair.
- :data:`PRIOR_MODULE`: the generator's prior ``T_θ`` (eq. 5), set by this strategy and never
  trained by hospitals; they read it from the signed global model to draw next round's candidates.

The M-step (eq. 6) draws rules from the mixture and maximises their likelihood under the
generator. The transformer generator lives in the SDK (torch): a deployment runs it as a rule
service beside the server and attaches it with :meth:`FedNSLRules.attach_m_step`; without one
this strategy runs the exact maximiser of eq. (6) for a *categorical* generator (the pooled
sample frequencies, lightly smoothed) so the lean server is complete on its own.

Audit: each round one ``rules`` entry (and artefact ``round-<r>/rules.json``): per head the
top rules of the new prior with their prior and mixture probabilities and the pooled support,
coverage and confidence -- human-readable rule strings a clinician can check. Nothing in it
is any single hospital's.

Modes: the server must see the sum (``masked`` or ``insecure_plaintext``). Under ``ckks`` the
strategy is refused by :func:`clinograph.sdk.fednsl.federation.run_rules_federation`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from clinograph.core.errors import ConfigError

from ..aggregation.base import ModuleSums
from ..public_random import public_uniforms as _public_uniforms
from .base import Strategy

PRIOR_MODULE = "rules/prior"
POSTERIOR_MODULE = "rules/posterior"
SUPPORT_MODULE = "rules/support"
#: Top rules per head published in the ``rules`` artefact.
TOP_RULES = 10

#: ``m_step(mixture, public_seed) -> prior``: ``public_seed`` is this round's public seed
#: (:func:`round_seed`), so an attached M-step draws the same samples on any machine and after a
#: server restart.
MStep = Callable[[np.ndarray, int], np.ndarray]
#: Domain label of the public sampling stream (not a secret: seed and mixture are public).
PUBLIC_SAMPLING = b"clinograph/v1/fednsl/public-m-step-sampling"
#: Samples drawn per head by the built-in categorical M-step.
SAMPLES_PER_HEAD = 512


def round_seed(seed: int, round_: int) -> int:
    """The public 64-bit seed of round ``round_``'s M-step, from the strategy's public seed."""
    digest = hashlib.sha256(PUBLIC_SAMPLING + b"\x00seed\x00" + f"{int(seed)}:{int(round_)}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def public_uniforms(seed: int, *, label: str, n: int) -> np.ndarray:
    """``n`` public uniforms in [0, 1) of the M-step's stream (:mod:`clinograph.secure.public_random`
    under :data:`PUBLIC_SAMPLING`): fixed by its definition, unlike numpy's generators, whose
    streams may change across releases. Public randomness only -- never for a secret."""
    return _public_uniforms(PUBLIC_SAMPLING, seed, label=label, n=n)


def categorical_counts(probabilities: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Counts of ``len(uniforms)`` draws from ``probabilities`` by inverse-CDF (a multinomial draw)."""
    cdf = np.cumsum(probabilities / probabilities.sum())
    idx = np.minimum(np.searchsorted(cdf, uniforms, side="right"), len(cdf) - 1)
    return np.bincount(idx, minlength=len(cdf)).astype(np.float64)


def load_rule_space(path: str | Path, *, sha256: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """The public rule space file (``{"heads": [...], "bodies": [[...], ...]}``), checked against its
    pinned digest. Raises ConfigError naming the file on a mismatch or a malformed file."""
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ConfigError(f"Rule space {path} does not match rule_space_sha256 (the federation pins the file). "
                          "Use the file the federation was configured with.")
    try:
        obj = json.loads(data)
        heads = tuple(str(h) for h in obj["heads"])
        bodies = tuple(tuple(str(p) for p in b) for b in obj["bodies"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"Rule space {path} is not {{'heads': [...], 'bodies': [[...]]}}: {exc}.") from None
    return heads, bodies


def rule_text(head: str, body: tuple[str, ...]) -> str:
    """The stable string form ``a ∧ b → head`` (as :class:`clinograph.sdk.fednsl.rules.Rule`)."""
    return " ∧ ".join(sorted(body)) + " → " + head


class FedNSLRules(Strategy):
    """Sum posteriors, M-step, publish rules (module docstring).

    Args:
        rule_space: path of the public rule space JSON file.
        rule_space_sha256: its pinned SHA-256.
        seed: public seed of the M-step's sampling and of the hospitals' candidate draws.
        smoothing: pseudo-count per rule of the built-in categorical M-step.
    """

    name = "fednsl_rules"
    server_reads_sum = True  # the M-step / the DAG decision reads the sum

    def __init__(self, rule_space: str, rule_space_sha256: str, seed: int = 0, smoothing: float = 0.01):
        self.heads, self.bodies = load_rule_space(rule_space, sha256=rule_space_sha256)
        self._path, self._sha = str(rule_space), str(rule_space_sha256)
        self.seed, self.smoothing = int(seed), float(smoothing)
        self._m_step: MStep | None = None
        self._counts = np.zeros((len(self.heads), len(self.bodies)))
        self._round = 0
        self._pending: list[tuple[str, dict]] = []

    def constructor_options(self) -> dict[str, float | int | str | bool]:
        return {"rule_space": self._path, "rule_space_sha256": self._sha, "seed": self.seed,
                "smoothing": self.smoothing}

    def attach_m_step(self, m_step: MStep, *, generator: str) -> None:
        """Use ``m_step(mixture, public_seed) -> prior`` (e.g. the SDK's transformer) instead of
        the categorical M-step; ``generator`` names it in the audit entry."""
        self._m_step, self._generator = m_step, generator

    def observe(self, *, round_: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
        self._round = int(round_)

    # -- crash journal (secure/runtime/resume.py) ----------------------------------------------
    def state_dict(self) -> dict:
        """The built-in M-step's pooled sample counts (eq. 6 over all rounds' samples, A.10) and round.

        Refused with an attached M-step: its generator (e.g. the SDK's transformer) keeps state of
        its own that this server cannot save, and a resume without it would silently change the prior."""
        if self._m_step is not None:
            raise ConfigError(f"fednsl_rules with the attached M-step {self._generator!r} cannot be journalled: the "
                              "generator's own state is not the server's to save. Run without a journal, or use "
                              "the built-in categorical M-step (no attach_m_step).")
        return {"rule_space_sha256": self._sha, "round": self._round, "counts": self._counts.tolist()}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`; refuses a state of another rule space or shape."""
        counts = np.asarray(state.get("counts", []), dtype=np.float64)
        if state.get("rule_space_sha256") != self._sha or counts.shape != self._counts.shape \
                or not np.all(np.isfinite(counts)) or np.any(counts < 0):
            raise ConfigError("The journal's fednsl_rules state is not for this rule space (digest or shape differ, "
                              "or counts are not finite and ≥ 0). Resume with the rule space the run started with.")
        self._counts, self._round = counts, int(state.get("round", 0))

    def _categorical_m_step(self, mixture: np.ndarray, public_seed: int) -> np.ndarray:
        """Eq. (6) for a categorical generator: the MLE of the pooled samples, smoothed. The
        samples come from the public stream of :func:`public_uniforms` (per round and head)."""
        for h, row in enumerate(mixture):
            if row.sum() > 0:
                u = public_uniforms(public_seed, label=f"head:{h}", n=SAMPLES_PER_HEAD)
                self._counts[h] += categorical_counts(row, u)
        c = self._counts + self.smoothing
        return c / c.sum(axis=1, keepdims=True)

    def apply(self, state: Mapping[str, np.ndarray], sums: ModuleSums) -> dict[str, np.ndarray]:
        missing = [m for m in (PRIOR_MODULE, POSTERIOR_MODULE, SUPPORT_MODULE) if m not in state]
        if missing:
            raise ConfigError(f"fednsl_rules needs the modules {missing} in the ModelSpec; build the hospitals' "
                              "task with clinograph.sdk.fednsl.task.RulesTask.")
        out = {k: np.array(v, dtype=np.float64, copy=True) for k, v in state.items()}
        shape = (len(self.heads), len(self.bodies))
        if sums.weights.get(POSTERIOR_MODULE, 0.0) <= 0:
            return out
        mixture = np.clip(sums.mean(POSTERIOR_MODULE).reshape(shape), 0.0, None)
        support = np.clip(sums.mean(SUPPORT_MODULE).reshape((2, *shape)), 0.0, None) \
            if sums.weights.get(SUPPORT_MODULE, 0.0) > 0 else np.zeros((2, *shape))
        m_step = self._m_step or self._categorical_m_step
        prior = np.asarray(m_step(mixture, round_seed(self.seed, self._round)), dtype=np.float64).reshape(shape)
        out[POSTERIOR_MODULE] = mixture.reshape(out[POSTERIOR_MODULE].shape)
        out[SUPPORT_MODULE] = support.reshape(out[SUPPORT_MODULE].shape)
        out[PRIOR_MODULE] = prior.reshape(out[PRIOR_MODULE].shape)
        self._pending.append(("rules", self._record(prior, mixture, support, sums)))
        return out

    def _record(self, prior: np.ndarray, mixture: np.ndarray, support: np.ndarray, sums: ModuleSums) -> dict:
        heads = []
        for h, head in enumerate(self.heads):
            top = np.argsort(-prior[h], kind="stable")[:TOP_RULES]
            rules = []
            for j in top:
                sup, cov = float(support[0, h, j]), float(support[1, h, j])
                rules.append({"rule": rule_text(head, self.bodies[j]), "body": list(self.bodies[j]),
                              "prior": round(float(prior[h, j]), 6), "posterior": round(float(mixture[h, j]), 6),
                              "support": round(sup, 6), "coverage": round(cov, 6),
                              "confidence": round(sup / cov, 6) if cov > 1e-12 else None})
            heads.append({"head": head, "rules": rules})
        return {"round": self._round, "generator": getattr(self, "_generator", "categorical"),
                "rule_space_sha256": self._sha, "n_bodies": len(self.bodies),
                "contributors": len(sums.contributors), "heads": heads}

    def audit_records(self, round_: int) -> list[tuple[str, dict]]:
        """The server's audit hook: the round's ``rules`` entry, handed out once."""
        out, self._pending = self._pending, []
        return out
