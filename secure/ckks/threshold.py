"""Threshold CKKS: a federation key that no single party holds (safe API over
:mod:`clinograph.secure.hazmat.threshold_ckks`).

Who holds what:

* every key-holding hospital i holds a secret share ``s_i`` (:class:`ThresholdParty`; redacted,
  refuses to pickle) and publishes ``p0_i = -a*s_i + e_i`` (:class:`KeyGenShare`);
* anyone (the server) sums the shares into the collective public key
  (:class:`CollectivePublicKey`);
* the ``ckks_threshold`` mode: after the re-share (:mod:`.threshold_reshare`) each hospital
  encrypts its update under its *own* ``s_i`` with a round's common polynomials
  (:meth:`ThresholdParty.encrypt_under_share`) and the holders open only the members' sum
  (:mod:`.threshold_sum`);
* the library API: hospitals encrypt under the collective public key with SEAL's own
  ``Encryptor``; to open an aggregate, the combiner (the server) sends every key holder the
  ``c1`` halves (:class:`DecryptionRequest`) with one *canary* hidden at a random position, and
  gets back ``d_i = c1*s_i + e_smudge`` from each (:class:`DecryptionShare`); :class:`Combiner`
  checks each party's canary share against its public ``p0_i`` and adds the shares to ``c0``.
  The combiner learns the aggregate (the sum), nothing about one hospital's update.

Guarantees: the secret key ``s = sum_i s_i`` never exists anywhere; without the share of
*every* key holder (N-of-N) the combination is ``Delta*m + c1*s_missing + noise``, uniformly
random mod q (tested); a decryption share under a wrong key share is refused and its party
named (the canary: an RLWE sample the party cannot tell from real ``c1``); smudging noise
hides the decryption noise (and so the key) to statistical distance ``2^-statistical_bits``
per share (:class:`ThresholdPreset`, argued in SECURITY.md).
t-of-N (:meth:`CollectivePublicKey.adopt_threshold`, after :mod:`.threshold_reshare`): any t
holders decrypt with ``lambda_k*S_k`` plus their part of a sharing of zero; a wrong share is
refused and the present set named (not the holder).
Does not guarantee: liveness under dropout under N-of-N -- a key holder that does not answer
stops the decryption; the recovery is to re-run key generation among the remaining hospitals
and redo the round (or use t-of-N); that a party's *other* shares are
honest (the canary catches a wrong key share; a party that corrupts only some real shares is
caught with probability 1/(k+1) per corrupted share, k the ciphertext count, and the
decrypted result's imaginary parts -- ~0 for honest real-valued CKKS -- show the corruption
without naming the party); that the server asks only for the aggregate (this layer decrypts any
``c1``; the ``ckks_threshold`` mode's holders decrypt only the sum they add themselves from
committed, signed contributions, :mod:`.threshold_check`, and a canary from a public seed,
:func:`seeded_canary`).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import numpy as np
import tenseal.sealapi as sealapi

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.labels import (
    HASH_THRESHOLD_CKKS_CANARY,
    HASH_THRESHOLD_CKKS_COMMON_A,
    HASH_THRESHOLD_CKKS_ZERO_SHARE,
)

from ..hazmat import threshold_ckks as T
from ..hazmat.ckks_context import CkksParams, _load, build_context, dump, pack_fields
from .threshold_messages import DecryptionRequest, DecryptionShare, KeyGenShare, ThresholdKeyShare


class ThresholdPreset(str, Enum):
    """N = 8192, primes [60, 60 | 60 special], scale 2^96, smudging uniform on [-2^68, 2^68).

    128-bit (180 of 218 bits allowed at N = 8192, SEAL enforces it). Decryption-noise bound
    B = 2^13 for at most 32 key holders and 32 contributions (measured: max 2 541 at 32);
    statistical distance per decrypted ciphertext <= N*B/2^69 = 2^-43, so ``statistical_bits``
    = 43; slot error standard deviation 2^-22 (3 parties) to 2^-20 (32 parties);
    |aggregate slot| < 2^22. See SECURITY.md for the argument.
    """

    THRESHOLD_128 = "threshold_128"

    @property
    def params(self) -> CkksParams:
        """SEAL parameters (hazmat)."""
        return CkksParams(8192, (60, 60, 60), 96)

    @property
    def smudging_bits(self) -> int:
        """Each party's smudging noise is uniform on [-2^bits, 2^bits) per coefficient."""
        return 68

    @property
    def noise_bound_bits(self) -> int:
        """log2 B: bound on |coefficient| of the aggregate's decryption noise (<= 32 parties)."""
        return 13

    @property
    def statistical_bits(self) -> int:
        """lambda: -log2 of the statistical distance a decryption share leaks about the noise."""
        return 43

    @property
    def max_parties(self) -> int:
        """Key holders and contributions the noise bound covers."""
        return 32


class _Ctx:
    """SEAL context, ring and encoder of a preset (no key)."""

    def __init__(self, preset: ThresholdPreset):
        self.preset = preset
        self.context, self.parms_bytes = build_context(preset.params)
        self.ring = T.Ring.of(self.context)
        self.encoder = sealapi.CKKSEncoder(self.context)

    def poly(self, data: bytes, limbs: int, what: str) -> np.ndarray:
        n = self.ring.degree
        if len(data) != 8 * limbs * n:
            raise ProtocolError(f"{what} has {len(data)} bytes; expected {8 * limbs * n} ({limbs} limbs of N = {n}).")
        arr = np.frombuffer(data, dtype="<u8").astype(np.uint64).reshape(limbs, n)
        if np.any(arr >= self.ring.q(limbs)):
            raise ProtocolError(f"{what} has a coefficient outside [0, q_j).")
        return arr


def _ctx(preset: ThresholdPreset) -> _Ctx:
    return _Ctx(preset)


def common_a(*, seed: bytes, federation_id: str, ring: T.Ring) -> np.ndarray:
    """The federation's common polynomial ``a``: expanded from SHA-256 over the purpose label, the
    federation id and the public 32-byte seed (domain separation: no other use of the seed, and no
    other federation, gives the same ``a``)."""
    if len(seed) != 32:
        raise ConfigError(f"The seed of the common polynomial must be 32 bytes, got {len(seed)}.")
    key = hashlib.sha256(pack_fields([HASH_THRESHOLD_CKKS_COMMON_A, federation_id.encode(), seed])).digest()
    return T.common_poly(key, ring)


def seeded_canary(*, seed: bytes, public: CollectivePublicKey) -> tuple[np.ndarray, np.ndarray]:
    """The canary ``(c1, u)`` expanded from a public 32-byte ``seed`` (domain-separated by purpose,
    federation and role), so that a key holder can recompute it and see it is no ciphertext's ``c1``."""
    if len(seed) != 32:
        raise ProtocolError(f"The canary seed must be 32 bytes, got {len(seed)}.")
    keys = [hashlib.sha256(pack_fields([HASH_THRESHOLD_CKKS_CANARY, public.federation_id.encode(), role, seed])).digest()
            for role in (b"u", b"e1")]
    c = public._c
    return T.seeded_canary_c1(u_key=keys[0], e_key=keys[1], a=public.a, ring=c.ring, context=c.context)


def zero_shares(*, me: str, present: Sequence[str], seeds: Mapping[str, bytes], digest: str, count: int,
                ctx: _Ctx) -> np.ndarray:
    """t-of-N: this holder's parts ``z_k`` (count, limbs, N) of fresh sharings of zero among the
    present set, one for each of ``count`` polynomials of one request (``sum_k z_k = 0`` mod q):
    ``sum_j +-PRG(seed_kj, request digest)`` over the other present holders j, + when k's name
    sorts first. Each pairwise seed comes from an X25519 key agreement at set-up, so a coalition
    misses every seed between two honest holders, and the honest shares it sees are uniform but
    for their sum (SECURITY.md: why this is needed)."""
    ring, limbs = ctx.ring, ctx.ring.data_count
    q = ring.q(limbs)
    z = np.zeros((count, limbs, ring.degree), dtype=np.uint64)
    for other in present:
        if other == me:
            continue
        key = hashlib.sha256(pack_fields([HASH_THRESHOLD_CKKS_ZERO_SHARE, seeds[other], digest.encode()])).digest()
        mask = T.uniform_polys(key, ring=ring, limbs=limbs, count=count)
        z = T.addmod(z, mask, q) if me < other else T.submod(z, mask, q)
    return z


def _checked_values(preset: ThresholdPreset, values: np.ndarray) -> np.ndarray:
    """``values`` flat as float64, each finite and below the preset's per-contribution bound."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    bound = preset.params.max_abs_slot / preset.max_parties
    if not np.all(np.isfinite(flat)) or np.any(np.abs(flat) >= bound):
        raise ConfigError(f"Values must be finite and below {bound:.4g} in magnitude under {preset.value} "
                          f"(aggregate slots stay below {preset.params.max_abs_slot:.4g} for up to "
                          f"{preset.max_parties} contributions). Scale every weight down by the same factor.")
    return flat


def _bytes(poly: np.ndarray) -> bytes:
    return np.ascontiguousarray(poly, dtype="<u8").tobytes()


class ThresholdParty:
    """One key holder's secret share ``s_i``. Redacted repr; refuses to pickle."""

    def __init__(self, *, preset: ThresholdPreset, federation_id: str, name: str):
        self.preset, self.federation_id, self.name = preset, federation_id, name
        self._c = _ctx(preset)
        self._sk: sealapi.SecretKey | None = sealapi.KeyGenerator(self._c.context).secret_key()  # ternary s_i
        self._s: np.ndarray | None = T.read_secret_key(self._sk, self._c.ring)
        #: t-of-N: this party's Shamir share ``S_k`` of ``s``, its threshold and every holder's index
        self._shamir: tuple[np.ndarray, int, dict[str, int]] | None = None
        #: t-of-N: the Shamir share ``f_i(k)`` of every holder i's ``s_i`` dealt to this holder k
        self._dealt: dict[str, np.ndarray] = {}
        self._pair_seeds: dict[str, bytes] = {}

    @property
    def threshold(self) -> int | None:
        """t under t-of-N (after :meth:`adopt`), else None (N-of-N)."""
        return self._shamir[1] if self._shamir else None

    def keygen_share(self, *, seed: bytes) -> KeyGenShare:
        """This party's collective-key-generation share for the public seed of ``a``."""
        ring = self._c.ring
        if self._s is None or self._sk is None or self._shamir is not None:
            raise ProtocolError(f"{self.name!r} has re-shared its key share (t-of-N); it takes part in no new key.")
        a = common_a(seed=seed, federation_id=self.federation_id, ring=ring)
        p0 = T.ckg_share(s=self._s, e=T.key_error(self._sk, self._c.context, self._s, ring), a=a, ring=ring)
        return KeyGenShare(federation_id=self.federation_id, party=self.name,
                           seed_sha256=hashlib.sha256(seed).hexdigest(), p0=_bytes(p0))

    def deal(self, *, threshold: int, holders: Sequence[str]) -> dict[str, np.ndarray]:
        """t-of-N set-up, MTBH sec. V: Shamir shares ``f_i(k)`` of this party's ``s_i`` (degree
        t-1, every RNS prime, key level) for each holder k at index ``position in holders + 1``."""
        if self._s is None or self._shamir is not None or self.name not in holders:
            raise ProtocolError(f"{self.name!r} holds no N-of-N key share to deal, or is not among the holders.")
        polys = T.shamir_split(self._s, threshold=threshold, n_shares=len(holders), ring=self._c.ring)
        return dict(zip(holders, polys, strict=True))

    def adopt(self, *, threshold: int, holders: Sequence[str], received: Sequence[np.ndarray],
              pair_seeds: Mapping[str, bytes]) -> None:
        """Keep the dealt shares ``f_i(k)`` (one a dealer, in ``holders`` order) and their sum
        ``S_k = sum_i f_i(k)`` (a Shamir share of ``s``); from now on only t-of-N requests are
        answered. ``s_i`` stays: this hospital encrypts its own updates under it
        (:meth:`encrypt_under_share`). ``pair_seeds``: a 32-byte seed shared with every other
        holder (:func:`zero_shares`). Nothing public is derived from ``S_k`` or an ``f_i(k)``: an
        RLWE sample ``-a*S_k + e`` would leak the collective key's error to t - 1 colluders
        through the Lagrange coefficients (SECURITY.md)."""
        ring = self._c.ring
        others = set(holders) - {self.name}
        if len(received) != len(holders) or set(pair_seeds) != others:
            raise ProtocolError(f"{self.name!r} needs one dealt share from each of the {len(holders)} holders "
                                "and a pairwise seed with every other holder.")
        share = T.sum_polys(list(received), ring.q(len(ring.primes)))
        self._shamir = (share, threshold, {h: i + 1 for i, h in enumerate(holders)})
        self._dealt = {h: poly[:ring.data_count] for h, poly in zip(holders, received, strict=True)}
        self._pair_seeds = dict(pair_seeds)

    def encrypt_under_share(self, values: np.ndarray, a: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``c0_k = -a_k*s_i + e_k + Delta*m_k`` (coefficient form, data level) for each chunk k of
        N/2 slots of ``values`` (:func:`~clinograph.secure.hazmat.threshold_ckks.own_key_c0`): one a
        common polynomial ``a_k`` of ``a``. The caller never uses an ``a_k`` twice (the
        ``ckks_threshold`` mode expands them from a commitment set holding this hospital's fresh
        nonce). Raises ConfigError for values the preset cannot carry."""
        if self._sk is None or self._s is None:
            raise ProtocolError(f"{self.name!r} holds no key share to encrypt under.")
        flat = _checked_values(self.preset, values)
        n, scale = self.preset.params.slot_count, 2.0 ** self.preset.params.scale_bits
        if len(a) != max(-(-len(flat) // n), 1):
            raise ProtocolError(f"{len(a)} common polynomials for {max(-(-len(flat) // n), 1)} ciphertexts.")
        pt, plains = sealapi.Plaintext(), []
        for start in range(0, max(len(flat), 1), n):
            self._c.encoder.encode(flat[start:start + n].tolist(), scale, pt)
            plains.append(T.read_plaintext(pt, self._c.ring.data_count, self._c.ring.degree))
        return T.own_key_c0(plaintexts=plains, a=a, s=self._s, ring=self._c.ring, context=self._c.context)

    def sum_decryption_share(self, *, round: int, digest: str, members: Sequence[str], present: Sequence[str],
                             polys: Sequence[np.ndarray]) -> DecryptionShare:
        """This holder's answer to a request for the members' sum (the ``ckks_threshold`` mode,
        :mod:`.threshold_sum`): ``c*lambda_k^T*sum_{i in P} f_i(k) + z + E`` for every polynomial
        ``c`` of ``polys`` (the round's common polynomials, then the canary), with a sharing of
        zero among T = ``present`` keyed by the request ``digest`` and fresh smudging E."""
        ring, limbs = self._c.ring, self._c.ring.data_count
        q = ring.q(limbs)
        secret = self._sum_secret(members=members, present=present)
        noises = T.uniform_smudging_many(count=len(polys), bits=self.preset.smudging_bits, ring=ring,
                                         context=self._c.context, limbs=limbs)
        masks = zero_shares(me=self.name, present=present, seeds=self._pair_seeds, digest=digest, count=len(polys),
                            ctx=self._c)
        out = [_bytes(T.decryption_share(c1=c, s=secret, noise=T.addmod(noise, mask, q), ring=ring))
               for c, noise, mask in zip(polys, noises, masks, strict=True)]
        return DecryptionShare(federation_id=self.federation_id, round=round, party=self.name, request_sha256=digest,
                               shares=tuple(out))

    def _sum_secret(self, *, members: Sequence[str], present: Sequence[str]) -> np.ndarray:
        """t-of-N share of ``s_P`` for the contributors P = ``members``: ``lambda_k^T *
        sum_{i in P} f_i(k)`` (data level), T = ``present`` (sorted, at least t holders, this one
        among them). Raises ProtocolError otherwise."""
        if self._shamir is None:
            raise ProtocolError(f"{self.name!r} holds no re-shared key (the ckks_threshold mode re-shares at set-up).")
        _, t, index = self._shamir
        if (tuple(present) != tuple(sorted(set(present))) or len(present) < t or self.name not in present
                or any(p not in index for p in present) or not members or any(m not in self._dealt for m in members)):
            raise ProtocolError(f"{self.name!r} answers a sum only with itself among at least t = {t} distinct key "
                                "holders present, for contributors that are all key holders.")
        ring, limbs = self._c.ring, self._c.ring.data_count
        lam = T.lagrange_at_zero([index[p] for p in present], ring=ring, limbs=limbs)[index[self.name]]
        return T.scale_poly(T.sum_polys([self._dealt[m] for m in sorted(set(members))], ring.q(limbs)), lam, ring)

    def decryption_share(self, request: DecryptionRequest) -> DecryptionShare:
        """``c1*s_i`` (N-of-N) or ``c1*lambda_k*S_k + z_k`` (t-of-N, the request's present set; z_k
        this holder's part of a sharing of zero, :func:`zero_shares`) plus fresh smudging noise for
        every ``c1`` of ``request``."""
        if request.federation_id != self.federation_id:
            raise ProtocolError(f"Decryption request for federation {request.federation_id!r}; "
                                f"{self.name!r} holds a key share of {self.federation_id!r}.")
        ring = self._c.ring
        limbs, out, digest = ring.data_count, [], request.digest()
        secret = self._secret_for(request)
        noises = T.uniform_smudging_many(count=len(request.c1), bits=self.preset.smudging_bits, ring=ring,
                                         context=self._c.context, limbs=limbs)  # fresh, one per c1
        masks = (zero_shares(me=self.name, present=request.present, seeds=self._pair_seeds, digest=digest,
                             count=len(request.c1), ctx=self._c) if request.present else None)
        for i, (raw, noise) in enumerate(zip(request.c1, noises, strict=True)):
            c1 = self._c.poly(raw, limbs, f"c1 {i} of the decryption request")
            if masks is not None:  # t-of-N: this holder's part of a zero-sharing among this present set
                noise = T.addmod(noise, masks[i], ring.q(limbs))
            out.append(_bytes(T.decryption_share(c1=c1, s=secret, noise=noise, ring=ring)))
        return DecryptionShare(federation_id=self.federation_id, round=request.round, party=self.name,
                               request_sha256=digest, shares=tuple(out))

    def _secret_for(self, request: DecryptionRequest) -> np.ndarray:
        """The secret this request is answered with: ``s_i``, or ``lambda_k * S_k`` for its present set."""
        if self._shamir is None:
            if request.present or self._s is None:
                raise ProtocolError(f"{self.name!r} holds an N-of-N key share; the request names a present set.")
            return self._s
        share, t, index = self._shamir
        present = request.present
        if (len(set(present)) != len(present) or len(present) < t or self.name not in present
                or any(p not in index for p in present)):
            raise ProtocolError(f"{self.name!r} answers a t-of-N request only with itself among at least t = {t} "
                                f"distinct key holders present; the request names {len(present)}.")
        limbs = self._c.ring.data_count
        lam = T.lagrange_at_zero([index[p] for p in present], ring=self._c.ring, limbs=limbs)[index[self.name]]
        return T.scale_poly(share[:limbs], lam, self._c.ring)

    def __repr__(self) -> str:
        return f"ThresholdParty(party={self.name!r}, preset={self.preset.value}, secret_share=<redacted>)"

    def __reduce__(self) -> Any:  # noqa: D105
        raise TypeError("ThresholdParty holds a secret key share and refuses to be pickled.")


class CollectivePublicKey:
    """The collective public key ``(sum_i p0_i, a)``, loaded into SEAL; encrypts updates."""

    def __init__(self, *, preset: ThresholdPreset, federation_id: str, seed: bytes,
                 shares: Mapping[str, KeyGenShare]):
        if not 1 <= len(shares) <= preset.max_parties:
            raise ConfigError(f"Threshold CKKS needs 1..{preset.max_parties} key holders (the noise bound of "
                              f"{preset.value}); got {len(shares)}.")
        self.preset, self.federation_id = preset, federation_id
        self._c = c = _ctx(preset)
        ring, want = c.ring, hashlib.sha256(seed).hexdigest()
        self.a = common_a(seed=seed, federation_id=federation_id, ring=ring)
        self.p0: dict[str, np.ndarray] = {}
        for name, msg in sorted(shares.items()):
            if msg.party != name or msg.federation_id != federation_id or msg.seed_sha256 != want:
                raise ProtocolError(f"Key-generation share filed under {name!r} is from {msg.party!r}, federation "
                                    f"{msg.federation_id!r}, or for another seed of a.")
            self.p0[name] = c.poly(msg.p0, len(ring.primes), f"key-generation share of {name!r}")
        self.p0_sum = p0 = T.sum_polys(list(self.p0.values()), ring.q(len(ring.primes)))
        self.public_key_bytes = T.public_key_bytes(p0=p0, a=self.a, ring=ring)
        self._pk = T.load_public_key(self.public_key_bytes, c.context)  # SEAL validates it
        self._encryptor = sealapi.Encryptor(c.context, self._pk)
        #: t-of-N (after :meth:`adopt_threshold`): any t holders decrypt
        self.threshold: int | None = None

    def adopt_threshold(self, *, threshold: int, shares: Mapping[str, ThresholdKeyShare]) -> None:
        """Record t once every holder confirmed its Shamir share (:class:`ThresholdKeyShare`, one
        per holder, index = position among the sorted holders + 1, for this key). Raises
        ProtocolError otherwise."""
        holders = self.holders
        if not 1 <= threshold <= len(holders) or set(shares) != set(holders):
            raise ProtocolError(f"t-of-N needs 1 <= t <= {len(holders)} and a confirmation from every holder; got "
                                f"t = {threshold} and confirmations from {', '.join(sorted(shares)) or 'none'}.")
        for i, name in enumerate(holders):
            msg = shares[name]
            if (msg.party, msg.index, msg.threshold, msg.public_key_digest, msg.federation_id) != (
                    name, i + 1, threshold, self.digest, self.federation_id):
                raise ProtocolError(f"The share confirmation filed under {name!r} names another party, index, "
                                    "threshold, collective key or federation.")
        self.threshold = threshold

    @property
    def rule(self) -> str:
        """``"N-of-N"`` (also t = N, as the ``ckks_threshold`` mode sets up) or ``"t-of-N"`` with
        the numbers, e.g. ``"2-of-3"``."""
        n = len(self.holders)
        return "N-of-N" if self.threshold in (None, n) else f"{self.threshold}-of-{n}"

    @property
    def digest(self) -> str:
        """SHA-256 of the collective public key's SEAL bytes (plans and updates name it)."""
        return hashlib.sha256(self.public_key_bytes).hexdigest()

    @property
    def holders(self) -> tuple[str, ...]:
        """Every key holder (all are needed to decrypt under N-of-N, any t under t-of-N)."""
        return tuple(sorted(self.p0))

    def encrypt(self, values: np.ndarray) -> list[bytes]:
        """SEAL public-key encryptions of ``values`` (chunks of N/2 slots), SEAL's own bytes."""
        return [dump(ct) for ct in self.encrypt_ciphertexts(values)]

    def encrypt_ciphertexts(self, values: np.ndarray) -> list[sealapi.Ciphertext]:
        """:meth:`encrypt` as SEAL objects (the ``ckks_threshold`` mode packs them itself)."""
        n, scale = self.preset.params.slot_count, 2.0 ** self.preset.params.scale_bits
        flat = _checked_values(self.preset, values)
        out, pt = [], sealapi.Plaintext()
        for start in range(0, max(len(flat), 1), n):
            self._c.encoder.encode(flat[start:start + n].tolist(), scale, pt)
            ct = sealapi.Ciphertext()
            self._encryptor.encrypt(pt, ct)
            out.append(ct)
        return out

    def add(self, ciphertexts: Sequence[Sequence[bytes]]) -> list[sealapi.Ciphertext]:
        """Sum several parties' ciphertext lists slot-chunk by chunk (what the server does)."""
        ev, acc = sealapi.Evaluator(self._c.context), None
        for cts in ciphertexts:
            loaded = [self.load(raw) for raw in cts]
            if acc is None:
                acc = loaded
            else:
                for x, y in zip(acc, loaded, strict=True):
                    ev.add_inplace(x, y)
        return acc or []

    def load(self, raw: bytes) -> sealapi.Ciphertext:
        """A ciphertext under this key's parameters (SEAL checks it)."""
        ct = sealapi.Ciphertext()
        try:
            _load(ct, raw, self._c.context)
        except ValueError as exc:
            raise ProtocolError(f"Ciphertext does not load under the threshold parameters: {exc}.") from None
        return ct


class Combiner:
    """Opens one aggregate with every key holder's share; checks and names bad shares."""

    def __init__(self, *, public: CollectivePublicKey, round: int, aggregate: Sequence[sealapi.Ciphertext],
                 contributions: int, canary_seed: bytes | None = None, present: Sequence[str] = ()):
        if not 1 <= contributions <= public.preset.max_parties:
            raise ConfigError(f"The aggregate sums {contributions} encryptions; the smudging of {public.preset.value} is "
                              f"argued for 1..{public.preset.max_parties} (its decryption-noise bound).")
        self.public, self.round = public, round
        self._c = public._c
        #: who must answer: every holder (N-of-N), or the t or more named in ``present`` (t-of-N)
        self.present = _present_set(public, present)
        polys = [T.read_ciphertext(ct) for ct in aggregate]
        self._c0 = [p[0] for p in polys]
        self._scale = aggregate[0].scale if aggregate else 1.0
        if canary_seed is None:  # hidden canary: the holder cannot tell it from a real c1
            canary, self._u = T.canary_c1(a=public.a, ring=self._c.ring, context=self._c.context)
        else:  # public canary: the holder recomputes it (ckks_threshold mode, see .threshold_check)
            canary, self._u = seeded_canary(seed=canary_seed, public=public)
        c1 = [p[1] for p in polys]
        # hidden canary: anywhere; public canary: last, where the holders put the one they expand
        self._canary_at = secrets.randbelow(len(c1) + 1) if canary_seed is None else len(c1)
        c1.insert(self._canary_at, canary)
        self.request = DecryptionRequest(federation_id=public.federation_id, round=round,
                                         c1=tuple(_bytes(p) for p in c1),
                                         present=self.present if public.threshold is not None else ())

    def retarget(self, present: Sequence[str]) -> DecryptionRequest:
        """t-of-N: ask another present set for the same ``c1`` halves (and canary) after a holder
        asked did not answer; returns the new request (its shares answer only it)."""
        if self.public.threshold is None:
            raise ProtocolError("N-of-N threshold CKKS has no other set of key holders to ask.")
        self.present = _present_set(self.public, present)
        self.request = self.request.model_copy(update={"present": self.present})
        return self.request

    def combine(self, shares: Mapping[str, DecryptionShare], *, length: int) -> np.ndarray:
        """The decoded aggregate (``length`` values).

        Raises:
            ProtocolError: a key holder's share is missing (N-of-N: re-run key generation without
                it and redo the round), or a share answers another request.
            IntegrityError: a share fails the canary check (names every such party), or the
                decoded slots are not real-valued (a corrupted share that the canary missed).
        """
        missing = [h for h in self.present if h not in shares]
        if missing:
            raise ProtocolError(f"Decryption shares missing from {', '.join(missing)}: " + (
                "every key holder's share is needed (N-of-N). Re-run threshold key generation without them and redo "
                "the round." if self.public.threshold is None else
                f"every holder asked ({', '.join(self.present)}) must answer; the next round asks {self.public.threshold}"
                " of the holders present then (t-of-N)."))
        ring, limbs, want = self._c.ring, self._c.ring.data_count, self.request.digest()
        per_party: dict[str, list[np.ndarray]] = {}
        for name in self.present:
            msg = shares[name]
            if msg.party != name or msg.request_sha256 != want or len(msg.shares) != len(self.request.c1):
                raise ProtocolError(f"Decryption share filed under {name!r} answers another request or party.")
            per_party[name] = [self._c.poly(raw, limbs, f"decryption share {i} of {name!r}")
                               for i, raw in enumerate(msg.shares)]
        self._check_canary(per_party)
        for name in per_party:
            del per_party[name][self._canary_at]
        out = []
        for k, c0 in enumerate(self._c0):
            m = T.combine_decryption(c0=c0, shares=[per_party[h][k] for h in self.present], ring=ring)
            pt = T.load_plaintext(T.plaintext_bytes(m, ring=ring, parms_id=ring.data_parms_id, scale=self._scale),
                                  self._c.context)
            z = np.asarray(self._c.encoder.decode_complex(pt))
            if np.max(np.abs(z.imag)) > 1e-3:
                raise IntegrityError("The combined aggregate is not real-valued: a decryption share was corrupted.")
            out.append(z.real)
        return np.concatenate(out)[:length] if out else np.zeros(0)


    def _check_canary(self, per_party: Mapping[str, list[np.ndarray]]) -> None:
        """One check of the canary shares' sum against the collective ``p0`` (honest: at most
        n * 2^68 plus a few bits; t-of-N too, as sum_k lambda_k*S_k = s and sum_k z_k = 0
        exactly); only when it fails, one check a party against its ``p0_i`` to name who (N-of-N;
        under t-of-N a share hides behind its zero-sharing mask, so the present set is named)."""
        ring, q = self._c.ring, self._c.ring.q(self._c.ring.data_count)
        total = T.sum_polys([polys[self._canary_at] for polys in per_party.values()], q)
        if T.canary_residual(share=total, u=self._u, p0=self.public.p0_sum, ring=ring,
                             context=self._c.context) <= _CANARY_LIMIT_BITS + 5:  # n <= 32 = 2^5 parties
            return
        if self.public.threshold is not None:
            raise IntegrityError(f"A decryption share of one of {', '.join(self.present)} is not made with its key "
                                 f"share (t-of-N: the canary check of their sum failed; the shares are masked, so the "
                                 "holder is not named). Ask another present set to find it.")
        bad = [name for name, polys in per_party.items()
               if T.canary_residual(share=polys[self._canary_at], u=self._u, p0=self.public.p0[name], ring=ring,
                                    context=self._c.context) > _CANARY_LIMIT_BITS]
        raise IntegrityError(f"Decryption share(s) of {', '.join(bad) or 'an unidentified key holder'} are not made "
                             "with their key share (canary check against their public key-generation share failed).")


def _present_set(public: CollectivePublicKey, present: Sequence[str]) -> tuple[str, ...]:
    """N-of-N: every holder (``present`` must be empty or all of them). t-of-N: ``present``,
    sorted, at least t distinct holders."""
    if public.threshold is None:
        if present and set(present) != set(public.holders):
            raise ConfigError("N-of-N threshold CKKS decrypts with every key holder; a present set was given.")
        return public.holders
    names = tuple(sorted(set(present)))
    if len(names) < public.threshold or not set(names) <= set(public.holders):
        raise ProtocolError(f"Threshold CKKS ({public.rule}) decrypts with at least {public.threshold} key holders; "
                            f"{len(names)} present ({', '.join(names) or 'none'}). Nothing was decrypted.")
    return names


#: An honest canary residual is the smudging noise plus tiny terms, < 2^68 + 2^20; a share under any
#: other key is uniform mod q_0 q_1 (2^120), so its limb-0 value exceeds 2^69 with probability 1 - 2^-50
#: per coefficient (q_0 ~ 2^60: the check reads the centred CRT value, see the hazmat).
_CANARY_LIMIT_BITS = 69.5

__all__ = ["Combiner", "CollectivePublicKey", "DecryptionRequest", "DecryptionShare", "KeyGenShare",
           "ThresholdParty", "ThresholdPreset"]
