"""A hospital's privacy ledger: the accountant's history across rounds and runs, on disk.

Each DP-SGD step is the Poisson-subsampled Gaussian mechanism with noise multiplier σ and
sampling rate q. The hospital's ε is the composition over *every* step of *every* round and
run that touched its data: the RDP accountant (Mironov 2017; Mironov, Talwar & Zhang 2019)
sums the Rényi divergences α ↦ Σ_i T_i · RDP_α(q_i, σ_i) and converts with
ε = min_α [RDP(α) + log((α−1)/α) − (log δ + log α)/(α−1)] (Balle et al. 2020, as in Opacus);
the PRV accountant (Gopi et al. 2021) is the alternative. History entries are Opacus's
``(σ, q, steps)`` tuples, merged like Opacus merges them.

The state lives in ``<state_dir>/privacy_ledger.json`` (atomic writes), is restored before
every round, and a round that would pass the budget is refused *before* training. ε is always
recomputed from the stored history (never read from the file: an edited number there would
admit a round past the budget); values are cached by (accountant, δ, history) in memory only.

Integrity (:mod:`.ledger_file`): the hospital's signing identity (``signer=``, required: there
is no unsigned ledger) signs the file's canonical JSON (label :data:`SIG_PRIVACY_LEDGER`); a
missing or invalid signature is a PrivacyError naming the file. A signed high-water mark beside
it (``privacy_ledger.highwater.json``: entry count, digest, last ε) makes a validly signed but
older ledger -- a restored backup, a copy -- a PrivacyError too. Writers are serialised with an
exclusive ``fcntl`` lock on ``privacy_ledger.json.lock``, and a commit re-reads the file under
the lock when it changed since this object read or wrote it: a history another process extended
since this ledger loaded is never overwritten. The file is verified whole at open and whenever it
changed on disk (:meth:`.ledger_file.SignedLedgerFile.unchanged`, two ``stat`` calls); a release
check or a round start on an unchanged file uses the totals held in memory (the history and the
releases, merged by (σ, q) and (σ_s, purpose): their length does not grow with the rounds), so
its cost does not grow with the ledger.
Does not protect against deleting or rolling back the whole state directory (ledger and mark
together; a fresh ledger starts at ε = 0).

Releases outside DP-SGD (issue 30, "private model choice"): a bounded statistic released with
Gaussian noise -- the federated validation loss that drives the kept round, early stopping,
restarts and the choice among candidates (:mod:`clinograph.sdk.training.private_selection`) --
is the Gaussian mechanism with noise multiplier σ_s (noise std σ_s · Δ for sensitivity Δ), whose
RDP is α/(2σ_s²) (Mironov 2017, Prop. 7): the subsampled-Gaussian step at q = 1. Each release is
stored under ``releases`` as ``[σ_s, count, purpose]`` and composed with the DP-SGD steps in the
same RDP sum (sequential composition: the validation patients are the hospital's own patients,
so their ε adds to the training ε, never replaces it). :meth:`PrivacyLedger.epsilon_parts` gives
the ε of training alone, of the releases alone and of everything together (what the budget
bounds); the signed report entry carries all three and the round's releases, so the server
recomputes the RDP floor over both (:func:`clinograph.secure.dp_checks.check_ledger`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Iterator
from pathlib import Path

from clinograph.secure.messages import LedgerEntry, Release

from clinograph.core.errors import PrivacyBudgetExceeded, PrivacyError
from clinograph.core.fileio import atomic_write  # noqa: F401 (re-exported: distributed.py)
from clinograph.core.identity import Identity
from clinograph.core.labels import SIG_PRIVACY_LEDGER

from .ledger_file import RESTORE, SignedLedgerFile

FORMAT = "clinograph/privacy-ledger/v1"
FILENAME = "privacy_ledger.json"
ACCOUNTANTS = ("rdp", "prv")
History = list[tuple[float, float, int]]
#: Gaussian releases outside DP-SGD: (σ_s, count, purpose)
Releases = list[tuple[float, int, str]]
#: what a release is for (the report shows each apart): model selection; a set-up sum
PURPOSES = ("selection", "setup")


@functools.lru_cache(maxsize=1024)
def _rdp_per_step(noise_multiplier: float, sample_rate: float) -> tuple[float, ...]:
    """RDP_α of one subsampled-Gaussian step at Opacus's default orders α, per (σ, q), computed
    once per process: ε of any history over known (σ, q) is then a sum, not a recomputation
    (the expensive part of a round's budget check). Same numbers as Opacus's RDPAccountant,
    whose ``compute_rdp(q, σ, T, α)`` is this vector times T."""
    from .opacus_import import import_opacus

    import_opacus()  # Opacus's import-time logging.basicConfig: not on the host's root logger
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    return tuple(compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1,
                             orders=RDPAccountant.DEFAULT_ALPHAS).tolist())


def rdp_epsilon(history: History, delta: float) -> float:
    """ε of ``history`` under the RDP accountant (identical to Opacus's ``RDPAccountant.get_epsilon``)."""
    return rdp_spent(history, delta)[0]


def rdp_spent(history: History, delta: float) -> tuple[float, float, float]:
    """(ε, the order α that gives it, the RDP of ``history`` at that α) under the RDP accountant."""
    import numpy as np

    from .opacus_import import import_opacus

    import_opacus()  # Opacus's import-time logging.basicConfig: not on the host's root logger
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import get_privacy_spent

    rdp = sum(np.asarray(_rdp_per_step(float(s), float(q))) * int(t) for s, q, t in history)
    eps, alpha = get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
    at = float(np.asarray(rdp)[list(RDPAccountant.DEFAULT_ALPHAS).index(alpha)]) if np.ndim(rdp) else 0.0
    return float(eps), float(alpha), at


def merge_step(history: History, *, noise_multiplier: float, sample_rate: float, steps: int) -> History:
    """``history`` plus ``steps`` steps at (σ, q), merged into the last entry when equal (as Opacus does)."""
    out = list(history)
    if steps <= 0:
        return out
    if out and out[-1][0] == noise_multiplier and out[-1][1] == sample_rate:
        out[-1] = (out[-1][0], out[-1][1], out[-1][2] + steps)
    else:
        out.append((float(noise_multiplier), float(sample_rate), int(steps)))
    return out


def normalise(history: list) -> History:
    """Merge consecutive equal (σ, q) settings; the ε is unchanged, the cache key canonical."""
    out: History = []
    for sigma, q, steps in history:
        out = merge_step(out, noise_multiplier=float(sigma), sample_rate=float(q), steps=int(steps))
    return out


def normalise_releases(releases: list) -> Releases:
    """Merge consecutive releases at the same (σ_s, purpose); ε is unchanged.

    Raises:
        ValueError / TypeError: a malformed release (the caller turns it into a PrivacyError).
    """
    out: Releases = []
    for sigma, count, purpose in releases:
        sigma, count, purpose = float(sigma), int(count), str(purpose)
        if not (math.isfinite(sigma) and sigma > 0) or count < 0 or purpose not in PURPOSES:
            raise ValueError("malformed release")
        if out and out[-1][0] == sigma and out[-1][2] == purpose:
            out[-1] = (sigma, out[-1][1] + count, purpose)
        elif count:
            out.append((sigma, count, purpose))
    return out


def as_steps(releases: Releases) -> History:
    """Releases as full-batch (q = 1) Gaussian steps, the form the accountants compose."""
    return [(s, 1.0, c) for s, c, _ in releases]


class PrivacyLedger:
    """Persistent (ε, δ) accounting of one hospital.

    Guarantees: the history on disk only grows (``commit`` appends what Opacus counted);
    ``check_round`` refuses, before any training, a round whose projected total ε exceeds the
    budget. Does not guarantee anything about jobs that bypass this ledger.

    Args:
        state_dir: the hospital's state directory (created if missing).
        site: hospital name (checked against the file: one ledger per hospital).
        budget_epsilon: the hospital's total ε budget. delta: δ for every ε here.
        signer: the hospital's identity; signs the ledger and its high-water mark.
        accountant: ``"rdp"`` (default) or ``"prv"``.
    """

    def __init__(self, state_dir: str | Path, *, site: str, budget_epsilon: float, delta: float,
                 signer: Identity, accountant: str = "rdp"):
        if not (math.isfinite(budget_epsilon) and budget_epsilon > 0) or not 0 < delta < 1:
            raise PrivacyError(f"Hospital {site!r}: a privacy budget needs a finite ε > 0 and 0 < δ < 1, got "
                               f"ε = {budget_epsilon!r}, δ = {delta!r}. Fix: set [privacy] epsilon_budget and delta.")
        if accountant not in ACCOUNTANTS:
            raise PrivacyError(f"Unknown accountant {accountant!r}. Registered: {', '.join(ACCOUNTANTS)}.")
        self.path = Path(state_dir) / FILENAME
        self.site, self.budget_epsilon, self.delta, self.accountant = site, float(budget_epsilon), float(delta), accountant
        self.signer = signer
        self._file = SignedLedgerFile(self.path, site=site, signer=signer, context=SIG_PRIVACY_LEDGER,
                                      what="Privacy ledger")
        self.computations = 0  # ε computations that missed the cache (tests count them)
        self.history: History = []
        self.releases: Releases = []
        self.entries: list[dict] = []
        self._cache: dict[str, float] = {}
        #: releases recorded in the round being run, carried by its report entry: (round, releases)
        self._round_releases: tuple[int, Releases] | None = None
        self.refresh()

    def refresh(self) -> None:
        """Bring this object up to the file: another ledger object of this hospital -- a second
        candidate's trainer in this process -- may have recorded steps since, or the file may have
        been edited. Re-reads and re-verifies it (:meth:`reload`) only if it changed on disk since
        this object last read or wrote it; else two ``stat`` calls."""
        if not self._file.unchanged():
            self.reload()

    def reload(self) -> None:
        """Re-read and re-verify the ledger from disk, changed or not (the whole file)."""
        with self._locked(exclusive=False):
            self.history, self.entries, self.releases = self._read()

    # -- state --------------------------------------------------------------------------------
    def _locked(self, *, exclusive: bool) -> contextlib.AbstractContextManager[None]:
        """fcntl lock on the ledger's lock file (shared to read, exclusive to write)."""
        return self._file.locked(exclusive=exclusive)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[list[dict]]:
        """The exclusive lock, with the stored entries, once the file is checked to be what this
        object last read (another process's steps or releases are never overwritten): unchanged on
        disk since this object read or wrote it, or re-read (verified) and holding the same totals.
        A failure inside leaves the file to be re-read next time (memory may be ahead of it)."""
        with self._locked(exclusive=True):
            if self._file.unchanged():
                entries = list(self.entries)
            else:
                stored, entries, releases = self._read()
                if stored != self.history or releases != self.releases:
                    raise PrivacyError(f"Privacy ledger {self.path} changed since this process loaded it (another "
                                       f"process recorded steps for hospital {self.site!r}); refusing to overwrite "
                                       "it. Fix: run one training process per hospital state directory.")
            try:
                yield entries
            except BaseException:
                self._file.forget()
                raise

    def _read(self) -> tuple[History, list[dict], Releases]:
        """The stored (history, entries, releases), verified (signature, high-water mark); empty if there is no ledger yet."""
        state = self._file.read(fmt=FORMAT)
        if state is None:
            return [], [], []
        try:
            history = normalise(state.get("history", []))
            releases = normalise_releases(state.get("releases", []))
        except (TypeError, ValueError):
            raise PrivacyError(f"Privacy ledger {self.path} holds a malformed history. "
                               + RESTORE.format(mark=self._file.mark_path.name)) from None
        return history, list(state.get("entries", [])), releases

    def _save(self) -> None:
        self._file.write({"format": FORMAT, "site": self.site, "history": [list(h) for h in self.history],
                          "releases": [list(r) for r in self.releases], "entries": self.entries})

    # -- accounting ---------------------------------------------------------------------------
    def make_accountant(self, history: History | None = None):  # noqa: ANN201 - an opacus IAccountant
        """An Opacus accountant with ``history`` (default: this hospital's) restored."""
        from .opacus_import import import_opacus

        import_opacus()  # Opacus's import-time logging.basicConfig: not on the host's root logger
        from opacus.accountants import create_accountant

        acc = create_accountant(self.accountant)
        acc.load_state_dict({"history": list(self.history if history is None else history),
                             "mechanism": acc.mechanism()})
        return acc

    def epsilon(self, history: History | None = None, releases: Releases | None = None) -> float:
        """ε at this ledger's δ after the DP-SGD ``history`` and the ``releases`` (defaults: this
        hospital's, i.e. everything so far), composed; cached."""
        hist = normalise(self.history if history is None else history)
        rel = self.releases if releases is None else normalise_releases(releases)
        hist = hist + as_steps(rel)
        if not hist:
            return 0.0
        key = json.dumps([self.accountant, repr(self.delta), [[repr(s), repr(q), t] for s, q, t in hist]])
        if key not in self._cache:
            self.computations += 1
            self._cache[key] = (rdp_epsilon(hist, self.delta) if self.accountant == "rdp"
                                else float(self.make_accountant(hist).get_epsilon(delta=self.delta)))
        return self._cache[key]

    def epsilon_parts(self) -> dict[str, float]:
        """ε of DP-SGD alone (``training``), of each release purpose alone (``selection``,
        ``setup``) and of everything composed (``total``: what the budget bounds; less than the
        parts' sum, since RDP composes before the conversion to ε)."""
        parts = {"training": self.epsilon(self.history, [])}
        for purpose in PURPOSES:
            parts[purpose] = self.epsilon([], [r for r in self.releases if r[2] == purpose])
        parts["total"] = self.epsilon()
        return parts

    def check_release(self, *, round_: int, noise_multiplier: float, purpose: str, count: int = 1) -> float:
        """The projected total ε after ``count`` Gaussian releases at σ_s = ``noise_multiplier``,
        or :class:`PrivacyBudgetExceeded` before anything is released. Re-verifies the file only
        if it changed on disk (:meth:`refresh`): its cost does not grow with the ledger."""
        self.refresh()
        extra = [(float(noise_multiplier), int(count), purpose)]
        projected = self.epsilon(self.history, [*self.releases, *extra])
        if projected > self.budget_epsilon:
            raise PrivacyBudgetExceeded(
                f"Hospital {self.site!r}: the {purpose} release of round {round_} would take ε from "
                f"{self.epsilon():.3f} to {projected:.3f} (δ = {self.delta:g}, σ_s = {noise_multiplier:g}), past its "
                f"budget ε = {self.budget_epsilon:g}. Refused before release. Fix: this hospital has spent its budget "
                "on this data; stop here (or plan fewer rounds or candidates, so σ is calibrated for them).")
        return projected

    def commit_release(self, *, round_: int, noise_multiplier: float, purpose: str, count: int = 1) -> float:
        """Record ``count`` releases at σ_s in round ``round_`` (after :meth:`check_release`); the
        round's report entry carries them. Returns the total ε."""
        if purpose not in PURPOSES:
            raise PrivacyError(f"Unknown release purpose {purpose!r}; one of {', '.join(PURPOSES)}.")
        extra = [(float(noise_multiplier), int(count), purpose)]
        with self._writing() as entries:
            self.releases = normalise_releases([*self.releases, *extra])
            self.entries = entries
            self._save()
        self._round_releases = (round_, normalise_releases([*self.round_releases(round_), *extra]))
        return self.epsilon()

    def round_releases(self, round_: int) -> Releases:
        """The releases recorded in round ``round_`` by this object (what its report entry carries)."""
        return list(self._round_releases[1]) if self._round_releases and self._round_releases[0] == round_ else []

    def release_entry(self, *, round_: int, noise_multiplier: float, sample_rate: float, clip_norm: float) -> LedgerEntry:
        """The report entry of a round that released but took no DP-SGD step (an evaluation-only
        round): ``steps = 0`` and the round's releases."""
        return self._entry(round_=round_, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=0,
                           clip_norm=clip_norm)

    def _entry(self, *, round_: int, noise_multiplier: float, sample_rate: float, steps: int,
               clip_norm: float) -> LedgerEntry:
        parts = self.epsilon_parts()
        releases = [Release(noise_multiplier=s, count=c, purpose=p) for s, c, p in self.round_releases(round_)]
        return LedgerEntry(round=round_, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps,
                           clip_norm=clip_norm, accountant=self.accountant, epsilon=parts["total"],
                           delta=self.delta, budget_epsilon=self.budget_epsilon, releases=releases,
                           epsilon_training=parts["training"], epsilon_selection=parts["selection"],
                           epsilon_setup=parts["setup"])

    def project(self, *, noise_multiplier: float, sample_rate: float, steps: int) -> float:
        """Total ε if ``steps`` more steps at (σ, q) were taken."""
        return self.epsilon(merge_step(self.history, noise_multiplier=noise_multiplier,
                                       sample_rate=sample_rate, steps=steps))

    def check_round(self, *, round_: int, noise_multiplier: float, sample_rate: float, steps: int) -> float:
        """The projected total ε of round ``round_``, or :class:`PrivacyBudgetExceeded` before training."""
        projected = self.project(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
        if projected > self.budget_epsilon:
            raise PrivacyBudgetExceeded(
                f"Hospital {self.site!r}: round {round_} would take ε from {self.epsilon():.3f} to "
                f"{projected:.3f} (δ = {self.delta:g}, {steps} steps at σ = {noise_multiplier:g}, q = {sample_rate:.4g}), "
                f"past its budget ε = {self.budget_epsilon:g}. Refused before training. Fix: this hospital "
                "has spent its budget on this data; stop training here (raising [privacy] epsilon_budget "
                "weakens the guarantee and needs your governance's approval).")
        return projected

    def begin_round(self, accountant, *, round_: int, noise_multiplier: float, sample_rate: float,  # noqa: ANN001, ANN201
                    steps: int):
        """Start a round: the accountant to count it with and :meth:`check_round`'s refusal.

        The ledger is the source of truth: an accountant whose history differs from the stored one
        (e.g. after a failed commit) is replaced by one restored from the ledger."""
        self.refresh()
        if normalise(accountant.history) != self.history:
            accountant = self.make_accountant()
        self.check_round(round_=round_, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
        return accountant

    def commit_interrupted(self, accountant, *, round_: int, noise_multiplier: float,  # noqa: ANN001
                           sample_rate: float, clip_norm: float) -> None:
        """After a round that failed part-way: the steps already taken changed the model (personal
        modules persist), so they are recorded; nothing is written if no step was taken."""
        if normalise(accountant.history) != self.history:
            self.commit(round_=round_, history=accountant.history, noise_multiplier=noise_multiplier,
                        sample_rate=sample_rate, clip_norm=clip_norm)

    def commit(self, *, round_: int, history: list, noise_multiplier: float, sample_rate: float,
               clip_norm: float) -> LedgerEntry:
        """Record the accountant's history after a round (what Opacus counted) and return its entry."""
        new = normalise(history)
        with self._writing() as entries:
            steps = sum(t for *_, t in new) - sum(t for *_, t in self.history)
            if steps < 0 or new[: max(len(self.history) - 1, 0)] != self.history[: max(len(self.history) - 1, 0)]:
                raise PrivacyError(f"Hospital {self.site!r}: the accountant's history after round {round_} does not "
                                   "extend the stored one; refusing to record it. Fix: restart the hospital process (the ledger "
                                   "on disk is the source of truth).")
            self.history = new
            entry = self._entry(round_=round_, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps,
                                clip_norm=clip_norm)
            self.entries = [*entries, entry.model_dump(mode="json")]
            self._save()
        return entry

    def __repr__(self) -> str:
        return (f"PrivacyLedger(site={self.site!r}, accountant={self.accountant!r}, steps="
                f"{sum(t for *_, t in self.history)}, releases={sum(c for _, c, _ in self.releases)}, budget_epsilon={self.budget_epsilon:g})")
