"""Distributed DP at one hospital: one DP-SGD step a round, its noise a share of the federation's.

Implements NS-FL eq. (6) (FedSGD) as distributed DP-SGD (docs/privacy.md, "Distributed DP"):

1. Poisson-sample the hospital's training patients at the federation's rate q (CSPRNG coins,
   :mod:`clinograph.secure.hazmat.discrete_noise`).
2. Per-patient gradients of the task's model and objective (the book-keeping engine of
   :mod:`.per_patient`, the one the local-DP trainers use, tested against a per-patient loop;
   built once per run): the binary star model's BCE, the survival head's hazard likelihood
   (:mod:`.survival`), or the temporal model on each patient's whole snapshot sequence -- one
   patient, one row, whatever the task. Over the shared modules the model trains; each patient's
   whole vector clipped to L2 norm C.
3. Each clipped vector scaled by the masked ring's fixed-point scale s and rounded *randomly*
   to integers (unbiased); the integer vectors summed.
4. A Skellam share Sk(μ/h), μ = (σ·C·s)², added to every coordinate: h honest shares carry the
   whole noise of the aggregate mechanism (:mod:`clinograph.secure.dp`).

The integer vector z is what the masked mode sums: the hospital hands ``z / s`` as its weighted
update with weight w = q·n (its expected batch), so the mode's ``rint(x·s)`` gives back z
exactly (checked before anything leaves), and FedSGD's weighted mean is Σz/s / Σ q·n_k: the
noisy sum over the expected batch of the whole federation. The server applies it with its
learning rate. Nobody but the hospital sees z; the server sees only the noisy sum.

:class:`DistributedLedger` keeps, per round, the guarantee the hospital relies on (the
aggregate mechanism, its parameters and the minimum honest set, ε composed over rounds) and
what it would have alone (its own share as the only noise, ε composed the same way).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from clinograph.secure.dp import (
    CsprngUniform,
    DistributedPolicy,
    RoundedRowSums,
    ShareDeclaration,
    SkellamRound,
    bernoulli,
    check_share,
    epsilon,
    skellam_noise,
)
from clinograph.secure.messages import DistributedShare, LedgerEntry

from clinograph.core.errors import PrivacyBudgetExceeded, PrivacyError
from clinograph.core.identity import Identity
from clinograph.core.labels import SIG_DISTRIBUTED_LEDGER

from ..model.modules import ModuleMap
from ..model.nsfl import NSFLModel
from .ledger_file import SignedLedgerFile
from .per_patient import PerPatientClipper, star_probe
from .trainer import skipped_star_parameters, unused_star_parameters

FORMAT = "clinograph/distributed-ledger/v1"
FILENAME = "distributed_ledger.json"


# -- which coordinates a round releases ---------------------------------------------------------
@dataclass(frozen=True)
class Columns:
    """The released coordinates: shared modules on the (structural) star path, in spec order, as
    (module, param, row) pieces. The same at every hospital (found from the model's structure
    with a synthetic probe, never from data), so every hospital adds noise to every coordinate.

    ``frozen``: names of column parameters with no per-patient gradient -- with ``[model] deep =
    false`` the GNN the star path skips (:func:`~.trainer.skipped_star_parameters`). Their columns
    stay in the sum as zeros *with the hospital's noise share*, like every coordinate: the released
    update and the dimension d the server's noise test counts (from the model spec, never from a
    hospital) are those of deep = true, and the zero-signal coordinates are what gives the test its
    power on the small wide-only model (79 trained coordinates alone let the signal hide an absent
    share; SECURITY.md). A dedicated "noise probe" block would do the same with new spec entries
    and a protocol change; these coordinates already exist and are already noised."""

    modules: tuple[str, ...]
    pieces: tuple[tuple[str, torch.nn.Parameter, int | None], ...]
    sizes: tuple[int, ...]
    frozen: frozenset[str] = frozenset()

    @property
    def dim(self) -> int:
        return int(sum(self.sizes))

    @classmethod
    def of(cls, model: NSFLModel, modules: ModuleMap, shared: Sequence[str]) -> Columns:
        unused = set(unused_star_parameters(model))
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and n not in unused]
        trainable = {id(p) for _, p in named}
        skipped = set(skipped_star_parameters(model))  # deep = false: the GNN (and what it never reaches)
        frozen = frozenset(n for n, _ in model.named_parameters() if n in skipped | unused) if skipped else frozenset()
        names, pieces, sizes = [], [], []
        for name in shared:
            ps = modules.pieces(name)
            if not any(id(pc.param) in trainable for pc in ps):
                continue  # nothing of it is on the star path (similar_to, metric/validation)
            names.append(name)
            for pc in ps:
                pieces.append((name, pc.param, pc.row))
                sizes.append(pc.numel)
        return cls(tuple(names), tuple(pieces), tuple(sizes), frozen)

    def trained(self, model: NSFLModel) -> set[int]:
        """ids of the column parameters the per-patient engine covers (the columns minus ``frozen``)."""
        frozen = {id(p) for n, p in model.named_parameters() if n in self.frozen}
        return {id(p) for _, p, _ in self.pieces if id(p) not in frozen}

    def split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """A flat [dim] vector -> module name -> vector (module vectors are their pieces concatenated)."""
        out: dict[str, list[np.ndarray]] = {}
        pos = 0
        for (name, _, _), size in zip(self.pieces, self.sizes, strict=True):
            out.setdefault(name, []).append(flat[pos:pos + size])
            pos += size
        return {n: np.concatenate(v) for n, v in out.items()}


def columns_clipper(model: NSFLModel, columns: Columns, *, row_shape: tuple[int, ...] | None = None,
                    engine: Callable[..., PerPatientClipper] = PerPatientClipper) -> PerPatientClipper:
    """The per-patient engine over ``columns``' parameters, built once per hospital run (its
    synthetic-probe self-check included) and passed to :func:`distributed_step` every round.

    ``row_shape``: one training row's shape ((K,) stars, the default; (T, K) snapshot sequences).
    ``engine``: the engine class of the task's objective (``model, probe=`` -> engine; default the
    binary star BCE; :class:`~.survival.HazardClipper` for the hazard likelihood)."""
    with _only_columns(model, columns):
        fi, x, m = star_probe(model.n_features, row_shape=row_shape or (model.n_features,))
        dtype = next(p.dtype for _, p, _ in columns.pieces) if columns.pieces else torch.float32
        return engine(model, probe=(fi, x.to(dtype), m))


class _only_columns:  # noqa: N801 - a context manager
    """Parameters outside ``columns`` (off the star path, or personal) frozen meanwhile."""

    def __init__(self, model: NSFLModel, columns: Columns):
        self.model, self.wanted = model, columns.trained(model)

    def __enter__(self) -> None:
        self.saved = {n: p.requires_grad for n, p in self.model.named_parameters()}
        for _, p in self.model.named_parameters():
            p.requires_grad_(id(p) in self.wanted and p.requires_grad)
        self.model.train()

    def __exit__(self, *exc: object) -> None:
        for n, p in self.model.named_parameters():
            p.requires_grad_(self.saved[n])
            p.grad = None


def per_patient_gradients(model: NSFLModel, columns: Columns, *, inputs: Sequence[torch.Tensor], labels: torch.Tensor,
                          clipper: PerPatientClipper | None = None) -> np.ndarray:
    """Each patient's gradient of its own loss term over ``columns``. Shapes: ``inputs`` the
    model's rows ([B, K] x3 stars, [B, T, K] x3 sequences), ``labels`` [B] (or [B, 2K] hazard
    targets) -> [B, dim].

    The book-keeping engine of :mod:`.per_patient` on the task's objective (``clipper``: built
    once by :func:`columns_clipper`; the binary star engine built here if not given), exact for
    these models (tested against a per-patient loop). Parameters off the star path or personal
    are frozen meanwhile.
    """
    b = int(labels.shape[0])
    if b == 0:
        return np.zeros((0, columns.dim))
    return patient_rows(model, columns, inputs=inputs, labels=labels, clipper=clipper)[0:b]


def patient_rows(model: NSFLModel, columns: Columns, *, inputs: Sequence[torch.Tensor], labels: torch.Tensor,
                 clipper: PerPatientClipper | None = None, clip: float | None = None) -> PatientRows:
    """:func:`per_patient_gradients` as :class:`PatientRows` (``clip``: each row clipped to it),
    the [B, dim] float64 matrix never built whole."""
    b = int(labels.shape[0])
    with _only_columns(model, columns):
        engine = clipper if clipper is not None else PerPatientClipper(model)
        if {id(p) for p in engine.params} != {id(p) for _, p, _ in columns.pieces if p.requires_grad}:
            raise PrivacyError("The per-patient engine was built for other parameters than the released "
                               "columns; build it with columns_clipper(model, columns).")
        grads, _ = engine.per_sample(*inputs, labels=labels) if b else ([None] * len(engine.params), None)
    index = {id(p): i for i, p in enumerate(engine.params)}
    blocks = []
    for (_, p, row), width in zip(columns.pieces, columns.sizes, strict=True):
        i = index.get(id(p))
        g = grads[i] if i is not None else None
        blocks.append((width, None if g is None else (g.detach() if row is None else g.detach()[:, row])))
    return PatientRows(blocks, n=b, clip=clip)


class PatientRows:
    """One row per patient over the released coordinates ([B, dim], float64 when read), read a block
    of rows at a time from the engine's per-parameter gradients (``blocks``: (width, [B, ...]
    gradient or None for zeros) in column order), each row clipped to L2 norm <= ``clip`` when
    given -- exactly what :func:`clip_rows` of the whole matrix gives, without the whole matrix
    (at 1 680 patients × 14 869 coordinates it is 200 MB, and zeroing and clipping it cost more
    than the per-patient gradients). Supports ``shape`` and ``rows[a:b]``, as
    :func:`noisy_integer_sum` reads it."""

    def __init__(self, blocks: Sequence[tuple[int, torch.Tensor | None]], *, n: int, clip: float | None = None):
        self.blocks, self.n, self.clip = list(blocks), int(n), clip
        self.shape = (self.n, int(sum(w for w, _ in self.blocks)))
        #: numpy [B, width] views of the gradients: a torch slice assignment a block and parameter cost
        #: ~5 µs of overhead (30 parameters × 1 473 blocks: 0.2 s a concept round), numpy's ~1 µs
        self._views = [(w, None if g is None else g.detach().cpu().numpy().reshape(int(g.shape[0]), w))
                       for w, g in self.blocks]

    def __getitem__(self, rows: slice) -> np.ndarray:
        lo, hi, step = rows.indices(self.n)
        if step != 1:
            raise ValueError("PatientRows reads contiguous blocks of rows")
        return self.read_into(lo, hi, np.empty((max(0, hi - lo), self.shape[1])))

    def read_into(self, lo: int, hi: int, out: np.ndarray, *, work: np.ndarray | None = None) -> np.ndarray:
        """Rows [lo, hi) written into ``out[:hi - lo]`` (C-contiguous float64, every column written;
        ``work``: a buffer of ``out``'s shape for the squares of the norms) and returned."""
        m = max(0, hi - lo)
        part, at = out[:m], 0
        for width, g in self._views:
            part[:, at:at + width] = 0.0 if g is None else g[lo:hi]
            at += width
        if self.clip is not None:  # np.linalg.norm(part, axis=1): sqrt(add.reduce(part·part)), bit for bit
            sq = np.multiply(part, part, out=None if work is None else work[:m])
            norms = np.sqrt(np.add.reduce(sq, axis=1, keepdims=True))
            np.multiply(part, np.minimum(1.0, self.clip / np.maximum(norms, 1e-300)), out=part)
        return part


class BlockRows:
    """Block-diagonal rows [[top, 0], [0, bottom]]: a training batch's rows (``top``, any
    ``shape`` + row-slice source) then other patients' rows on more coordinates (``bottom``,
    [m, e]), one patient one row, read a block of rows at a time (as ``np.block`` of the two
    would give them)."""

    def __init__(self, top, bottom: np.ndarray):
        self.top, self.bottom = top, np.asarray(bottom, dtype=np.float64)
        n1, d1 = top.shape
        self.shape = (n1 + self.bottom.shape[0], d1 + self.bottom.shape[1])

    def __getitem__(self, rows: slice) -> np.ndarray:
        lo, hi, _ = rows.indices(self.shape[0])
        return self.read_into(lo, hi, np.empty((max(0, hi - lo), self.shape[1])))

    def read_into(self, lo: int, hi: int, out: np.ndarray, *, work: np.ndarray | None = None) -> np.ndarray:
        """Rows [lo, hi) written into ``out[:hi - lo]`` (every column written) and returned."""
        n1, d1 = self.top.shape
        part = out[:max(0, hi - lo)]
        part.fill(0.0)
        if lo < n1:
            part[:min(hi, n1) - lo, :d1] = self.top[lo:min(hi, n1)]
        if hi > n1:
            part[max(lo, n1) - lo:, d1:] = self.bottom[max(lo - n1, 0):hi - n1]
        return part


#: rows of a [patients, coordinates] matrix processed at a time (clipping, rounding): about 1 MiB of
#: float64, so every temporary stays in cache. The whole matrix at once (58 MB for 2 400 patients ×
#: 3 000 coordinates) made each numpy pass a round of page faults: 0.20-0.37 s against 0.02-0.07 s
#: chunked for the noisy sum (benchmarks/dp_step/dp_round.py's static federation; loaded machine).
#: Per 1 680 × 14 869 rows read from the per-parameter gradients (PatientRows): 0.150 / 0.118 /
#: 0.103 / 0.098 s at 256 KiB / 512 KiB / 1 MiB / 2 MiB; 3 MB blocks were slow again earlier
ROW_CHUNK_BYTES = 1 << 20


def _row_chunks(n_rows: int, n_cols: int):
    step = max(1, ROW_CHUNK_BYTES // max(1, 8 * n_cols))
    return (slice(lo, lo + step) for lo in range(0, n_rows, step))


def clip_rows(g: np.ndarray, clip: float) -> np.ndarray:
    """Each row scaled to L2 norm <= ``clip`` (rows already within are unchanged)."""
    g = np.asarray(g, dtype=np.float64)
    out = np.empty_like(g)
    for rows in _row_chunks(*g.shape):
        part = g[rows]
        norms = np.linalg.norm(part, axis=1, keepdims=True)
        np.multiply(part, np.minimum(1.0, clip / np.maximum(norms, 1e-300)), out=out[rows])
    return out


def randomised_round(x: np.ndarray, *, source: CsprngUniform | None = None) -> np.ndarray:
    """Unbiased randomised rounding to int64: floor(x) + 1 with probability x − floor(x)."""
    lo = np.floor(x)
    return (lo + bernoulli(x - lo, source=source)).astype(np.int64)


def noisy_integer_sum(clipped, *, scale: float, share_variance: float,
                      source: CsprngUniform | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_p round(s·g_p) + Sk(share_variance), the noise-free integer sum) over the rows of ``clipped``
    ([B, d] array, or :class:`PatientRows` / :class:`BlockRows`: read a block of rows at a time into
    buffers allocated once; :class:`~clinograph.secure.dp.RoundedRowSums` rounds and sums each block
    in place, its coins exactly :func:`randomised_round`'s)."""
    src = source or CsprngUniform()
    n, dim = clipped.shape
    signal = np.zeros(dim, np.int64)
    chunks = list(_row_chunks(n, dim))
    if chunks:
        rows = chunks[0].stop - chunks[0].start
        block, work = np.empty((rows, dim)), np.empty((rows, dim))
        round_sum = RoundedRowSums(rows, dim)
        read = getattr(clipped, "read_into", None)
    for chunk in chunks:  # every patient's coins are independent: the order is free
        hi = min(chunk.stop, n)
        part = read(chunk.start, hi, block, work=work) if read else _copy_rows(clipped, chunk.start, hi, block)
        np.multiply(part, scale, out=part)
        try:
            signal += round_sum(part, source=src)
        except ValueError:  # NaN casts to -2^63: two such rows wrapped to 0 unnoticed
            raise PrivacyError("A patient's row of the distributed step is not finite (NaN or inf gradient); its "
                               "contribution would be unbounded. Nothing is sent.") from None
    return signal + skellam_noise(share_variance, dim, source=src), signal


def _copy_rows(rows, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
    part = out[:hi - lo]
    part[...] = rows[lo:hi]
    return part


def poisson_sample(n: int, rate: float, *, source: CsprngUniform | None = None) -> np.ndarray:
    """Indices in [0, n) each kept with probability ``rate`` (CSPRNG coins)."""
    return np.flatnonzero(bernoulli(rate, n, source=source))


# -- the ledger ---------------------------------------------------------------------------------
class DistributedLedger:
    """One hospital's distributed-DP ledger on disk (``<state_dir>/distributed_ledger.json``).

    Every round records the guarantee the hospital relies on -- ``mechanism``, σ, q, C, the
    ring scale, the dimension accounted (every coordinate the model spec releases: the server
    checks that number), ``min_honest``, and ``epsilon`` composed over its rounds -- and
    what it would have alone: ``noise_multiplier_alone`` = σ/sqrt(h), the noise it added by
    itself, and ``epsilon_alone`` composed the same way. The audit report's privacy section shows
    both per hospital (:mod:`clinograph.secure.audit.report`, table ``privacy-trust``).
    A round that would pass the budget is refused before training. The file is signed by the
    hospital (``signer``, required) and checked against its high-water mark
    (:mod:`.ledger_file`): an edited, unsigned or older ledger is refused.
    """

    def __init__(self, state_dir: str | Path, *, site: str, budget_epsilon: float, delta: float, signer: Identity):
        if not (math.isfinite(budget_epsilon) and budget_epsilon > 0) or not 0 < delta < 1:
            raise PrivacyError(f"Hospital {site!r}: a privacy budget needs a finite ε > 0 and 0 < δ < 1. "
                               "Fix: set [privacy] epsilon_budget and delta.")
        self.path = Path(state_dir) / FILENAME
        self.site, self.budget_epsilon, self.delta = site, float(budget_epsilon), float(delta)
        self._file = SignedLedgerFile(self.path, site=site, signer=signer, context=SIG_DISTRIBUTED_LEDGER,
                                      what="Distributed-DP ledger")
        self.entries: list[dict] = []
        self.refresh()

    def _stored(self) -> list[dict]:
        state = self._file.read(fmt=FORMAT)
        return list(state["entries"]) if state is not None else []

    def refresh(self) -> None:
        """Bring this object up to the file if it changed on disk since this object last read or
        wrote it (another process of this hospital recorded a round, say); else two ``stat`` calls."""
        if not self._file.unchanged():
            with self._file.locked(exclusive=False):
                self.entries = self._stored()

    @staticmethod
    def _rounds(entries: list[dict], *, alone: bool) -> list[tuple[SkellamRound, int]]:
        return [(SkellamRound(e["sample_rate"], e["noise_multiplier_alone" if alone else "noise_multiplier"],
                              e["clip_norm"], e["scale"], e["dim"]), 1) for e in entries]

    def epsilons(self, extra: dict | None = None) -> tuple[float, float]:
        """(ε relied on, ε alone) after every recorded round (plus ``extra``)."""
        entries = self.entries + ([extra] if extra else [])
        return (epsilon(self._rounds(entries, alone=False), delta=self.delta),
                epsilon(self._rounds(entries, alone=True), delta=self.delta))

    def check_round(self, record: dict) -> float:
        """The projected ε of a round, or PrivacyBudgetExceeded before training."""
        self.refresh()
        projected, _ = self.epsilons(record)
        if projected > self.budget_epsilon:
            raise PrivacyBudgetExceeded(
                f"Hospital {self.site!r}: round {record['round']} would take the federation's guarantee for its "
                f"patients to ε = {projected:.3f} (δ = {self.delta:g}), past its budget {self.budget_epsilon:g}. "
                "Refused before training. Fix: stop training on this data (raising [privacy] epsilon_budget "
                "weakens the guarantee and needs your governance's approval).")
        return projected

    def commit(self, record: dict) -> LedgerEntry:
        """Append a round's record (with both ε) and return the signed report's entry. The file is
        written under the ledger's exclusive lock, and only if it is still what this object read
        or wrote: a round another process recorded since is never overwritten (PrivacyError)."""
        with self._file.locked(exclusive=True):  # every writer of this hospital's ledger holds it
            if not self._file.unchanged() and self._stored() != self.entries:
                raise PrivacyError(f"Distributed-DP ledger {self.path} changed since this process loaded it (another "
                                   f"process recorded rounds for hospital {self.site!r}); refusing to overwrite it. "
                                   "Fix: run one training process per hospital state directory.")
            eps, alone = self.epsilons(record)
            entries = [*self.entries, {**record, "epsilon": eps, "epsilon_alone": alone, "delta": self.delta}]
            try:
                self._file.write({"format": FORMAT, "site": self.site, "entries": entries})
            except BaseException:
                self._file.forget()  # the file may hold either version: re-read it next time
                raise
            self.entries = entries
        share = DistributedShare(mechanism=record["mechanism"], min_honest=record["min_honest"],
                                 scale=record["scale"], share_variance=record["share_variance"], dim=int(record["dim"]),
                                 epsilon_alone=alone)
        return LedgerEntry(round=record["round"], noise_multiplier=record["noise_multiplier"],
                           sample_rate=record["sample_rate"], steps=1, clip_norm=record["clip_norm"],
                           accountant=f"{record['mechanism']}-h{record['min_honest']}", epsilon=eps,
                           delta=self.delta, budget_epsilon=self.budget_epsilon, share=share)


# -- one round ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DPStep:
    """What one distributed-DP round produced at a hospital (z stays here; the masked mode sums it)."""

    z: np.ndarray  # int64 [dim]: noisy integer sum
    batch: int  # patients in the Poisson batch (local only)
    declaration: ShareDeclaration


def check_rows(rows: np.ndarray, clip_norm: float) -> np.ndarray:
    """``rows`` as float64, or PrivacyError (nothing sent) if one has L2 norm past C (each row is
    one patient's whole contribution to the sum)."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.size and float(np.linalg.norm(rows, axis=1).max()) > clip_norm * (1 + 1e-9):
        raise PrivacyError("A row of the distributed step exceeds the clip norm C; its patient's contribution "
                           "would be unbounded. Nothing is sent.")
    return rows


def noised_sum(clipped, *, policy: DistributedPolicy, scale: float, batch: int,
               source: CsprngUniform | None = None) -> DPStep:
    """Steps 3-4 of the module docstring over ``clipped`` ([B, d] float64 rows, each of L2 norm at
    most C already -- :func:`clip_rows`, :func:`check_rows` or :class:`PatientRows` with ``clip``;
    B may be 0): every coordinate gets
    the share, zeros included. The share is declared and checked against the policy (PrivacyError
    if off it). ``batch``: the training patients among the rows (local only)."""
    z, _ = noisy_integer_sum(clipped, scale=scale, share_variance=policy.share_variance(scale), source=source)
    return declared_step(z, policy=policy, scale=scale, batch=batch)


def declared_step(z: np.ndarray, *, policy: DistributedPolicy, scale: float, batch: int) -> DPStep:
    """The round's :class:`DPStep` for z (which carries the share ``policy.share_variance(scale)``),
    its share declared and checked against the policy (PrivacyError if off it)."""
    decl = ShareDeclaration(mechanism=policy.mechanism, noise_multiplier=policy.noise_multiplier,
                            min_honest=policy.min_honest, clip_norm=policy.clip_norm, sample_rate=policy.sample_rate,
                            scale=scale, share_variance=policy.share_variance(scale))
    check_share(policy, decl)
    return DPStep(z=z, batch=int(batch), declaration=decl)


def distributed_step(model: NSFLModel, columns: Columns, *, policy: DistributedPolicy, scale: float,
                     inputs: Sequence[torch.Tensor], labels: torch.Tensor, source: CsprngUniform | None = None,
                     clipper: PerPatientClipper | None = None, extra_rows: np.ndarray | None = None,
                     train: bool = True) -> DPStep:
    """Steps 1-4 of the module docstring over the hospital's training rows (all of them: ``inputs``
    the model's rows, ``labels`` the objective's; the Poisson sample is drawn here).
    ``clipper``: the engine built once by :func:`columns_clipper` (on the task's objective).

    ``extra_rows`` ([m, e]): other patients' contributions to ``e`` more coordinates appended
    after the columns (the validation patients' loss terms, :func:`validation_rows`), each row of
    L2 norm at most C already (checked); they are summed and noised with the same share, so every
    coordinate carries the federation's noise. ``train = False``: no gradient rows (an
    evaluation-only round: z covers the extra coordinates only)."""
    src = source or CsprngUniform()
    extra = np.zeros((0, 0)) if extra_rows is None else check_rows(extra_rows, policy.clip_norm)
    if not train:
        return noised_sum(extra, policy=policy, scale=scale, batch=0, source=src)
    idx = torch.as_tensor(poisson_sample(int(labels.shape[0]), policy.sample_rate, source=src), dtype=torch.long)
    g = patient_rows(model, columns, inputs=[t[idx] for t in inputs], labels=labels[idx], clipper=clipper,
                     clip=policy.clip_norm)
    if extra.size:  # block rows: [g, 0] for the training batch, [0, extra] for the others (one patient, one row)
        g = BlockRows(g, extra)
    return noised_sum(g, policy=policy, scale=scale, batch=int(idx.numel()), source=src)


def validation_rows(losses: np.ndarray, *, loss_clip: float, clip_norm: float) -> np.ndarray:
    """Each validation patient's row (a·ℓ̃_j, a) with ℓ̃_j = min(ℓ_j, B)/B ∈ [0, 1] and
    a = C/√2, so ‖row‖₂ ≤ C: the patient's whole contribution to the round, as a training
    patient's clipped gradient is. The sums over the federation give Σ ℓ̃ and n up to the common
    factor a; their ratio is the federated mean clipped loss / B (a and the server's step cancel).
    Shapes: [m] -> [m, 2]."""
    loss = np.asarray(losses, dtype=np.float64)
    tilde = np.clip(np.where(np.isfinite(loss), loss, loss_clip), 0.0, loss_clip) / loss_clip
    a = clip_norm / np.sqrt(2.0)
    return np.stack([a * tilde, np.full_like(tilde, a)], axis=1) if tilde.size else np.zeros((0, 2))
