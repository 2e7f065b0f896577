"""Threshold CKKS: a federation key that no single party holds (safe API over
:mod:`clinograph.secure.hazmat.threshold_ckks`).

Who holds what:

* every key-holding hospital i holds a secret share ``s_i`` (:class:`ThresholdParty`; redacted,
  refuses to pickle) and publishes ``p0_i = -a*s_i + e_i`` (:class:`KeyGenShare`);
* anyone (the server) sums the shares into the collective public key
  (:class:`CollectivePublicKey`); hospitals encrypt their updates under it with SEAL's own
  ``Encryptor``; the server adds ciphertexts as in ``ckks`` mode;
* to open an aggregate, the combiner (the server) sends every key holder the ``c1`` halves
  (:class:`DecryptionRequest`) with one *canary* hidden at a random position, and gets back
  ``d_i = c1*s_i + e_smudge`` from each (:class:`DecryptionShare`); :class:`Combiner` checks
  each party's canary share against its public ``p0_i`` and adds the shares to ``c0``.
  The combiner learns the aggregate (the sum), nothing about one hospital's update.

Guarantees: the secret key ``s = sum_i s_i`` never exists anywhere; without the share of
*every* key holder (N-of-N) the combination is ``Delta*m + c1*s_missing + noise``, uniformly
random mod q (tested); a decryption share under a wrong key share is refused and its party
named (the canary: an RLWE sample the party cannot tell from real ``c1``); smudging noise
hides the decryption noise (and so the key) to statistical distance ``2^-statistical_bits``
per share (:class:`ThresholdPreset`, argued in SECURITY.md).
Does not guarantee: liveness under dropout -- N-of-N, so a key holder that does not answer
stops the decryption; the documented recovery is to re-run key generation among the
remaining hospitals and redo the round (t-of-N Shamir sharing over every RNS prime exists in
the hazmat layer and is tested, but is not wired here); that a party's *other* shares are
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
from clinograph.core.labels import HASH_THRESHOLD_CKKS_CANARY, HASH_THRESHOLD_CKKS_COMMON_A

from ..hazmat import threshold_ckks as T
from ..hazmat.ckks_context import CkksParams, _load, build_context, dump, pack_fields
from .threshold_messages import DecryptionRequest, DecryptionShare, KeyGenShare


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
    return T.seeded_canary_c1(u_key=keys[0], e_key=keys[1], a=public.a, ring=c.ring, context=c.context,
                              encoder=c.encoder)


def _bytes(poly: np.ndarray) -> bytes:
    return np.ascontiguousarray(poly, dtype="<u8").tobytes()


class ThresholdParty:
    """One key holder's secret share ``s_i``. Redacted repr; refuses to pickle."""

    def __init__(self, *, preset: ThresholdPreset, federation_id: str, name: str):
        self.preset, self.federation_id, self.name = preset, federation_id, name
        self._c = _ctx(preset)
        self._sk = sealapi.KeyGenerator(self._c.context).secret_key()  # SEAL's CSPRNG: ternary s_i
        self._s = T.read_secret_key(self._sk, self._c.ring)

    def keygen_share(self, *, seed: bytes) -> KeyGenShare:
        """This party's collective-key-generation share for the public seed of ``a``."""
        ring = self._c.ring
        a = common_a(seed=seed, federation_id=self.federation_id, ring=ring)
        p0 = T.ckg_share(s=self._s, e=T.key_error(self._sk, self._c.context, self._s, ring), a=a, ring=ring)
        return KeyGenShare(federation_id=self.federation_id, party=self.name,
                           seed_sha256=hashlib.sha256(seed).hexdigest(), p0=_bytes(p0))

    def decryption_share(self, request: DecryptionRequest) -> DecryptionShare:
        """``c1*s_i`` plus fresh smudging noise for every ``c1`` of ``request``."""
        if request.federation_id != self.federation_id:
            raise ProtocolError(f"Decryption request for federation {request.federation_id!r}; "
                                f"{self.name!r} holds a key share of {self.federation_id!r}.")
        limbs, out = self._c.ring.data_count, []
        noises = T.uniform_smudging_many(count=len(request.c1), bits=self.preset.smudging_bits, ring=self._c.ring,
                                         context=self._c.context, limbs=limbs)  # fresh, one per c1
        for i, (raw, noise) in enumerate(zip(request.c1, noises, strict=True)):
            c1 = self._c.poly(raw, limbs, f"c1 {i} of the decryption request")
            out.append(_bytes(T.decryption_share(c1=c1, s=self._s, noise=noise, ring=self._c.ring)))
        return DecryptionShare(federation_id=self.federation_id, round=request.round, party=self.name,
                               request_sha256=request.digest(), shares=tuple(out))

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

    @property
    def digest(self) -> str:
        """SHA-256 of the collective public key's SEAL bytes (plans and updates name it)."""
        return hashlib.sha256(self.public_key_bytes).hexdigest()

    @property
    def holders(self) -> tuple[str, ...]:
        """Every key holder (all are needed to decrypt)."""
        return tuple(sorted(self.p0))

    def encrypt(self, values: np.ndarray) -> list[bytes]:
        """SEAL public-key encryptions of ``values`` (chunks of N/2 slots), SEAL's own bytes."""
        return [dump(ct) for ct in self.encrypt_ciphertexts(values)]

    def encrypt_ciphertexts(self, values: np.ndarray) -> list[sealapi.Ciphertext]:
        """:meth:`encrypt` as SEAL objects (the ``ckks_threshold`` mode packs them itself)."""
        n, scale = self.preset.params.slot_count, 2.0 ** self.preset.params.scale_bits
        flat = np.asarray(values, dtype=np.float64).reshape(-1)
        bound = self.preset.params.max_abs_slot / self.preset.max_parties
        if not np.all(np.isfinite(flat)) or np.any(np.abs(flat) >= bound):
            raise ConfigError(f"Values must be finite and below {bound:.4g} in magnitude under {self.preset.value} "
                              f"(aggregate slots stay below {self.preset.params.max_abs_slot:.4g} for up to "
                              f"{self.preset.max_parties} contributions). Scale every weight down by the same factor.")
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
                 contributions: int, canary_seed: bytes | None = None):
        if not 1 <= contributions <= public.preset.max_parties:
            raise ConfigError(f"The aggregate sums {contributions} encryptions; the smudging of {public.preset.value} is "
                              f"argued for 1..{public.preset.max_parties} (its decryption-noise bound).")
        self.public, self.round = public, round
        self._c = public._c
        polys = [T.read_ciphertext(ct) for ct in aggregate]
        self._c0 = [p[0] for p in polys]
        self._scale = aggregate[0].scale if aggregate else 1.0
        if canary_seed is None:  # hidden canary: the holder cannot tell it from a real c1
            canary, self._u = T.canary_c1(a=public.a, ring=self._c.ring, context=self._c.context,
                                          encoder=self._c.encoder)
        else:  # public canary: the holder recomputes it (ckks_threshold mode, see .threshold_check)
            canary, self._u = seeded_canary(seed=canary_seed, public=public)
        c1 = [p[1] for p in polys]
        # hidden canary: anywhere; public canary: last, where the holders put the one they expand
        self._canary_at = secrets.randbelow(len(c1) + 1) if canary_seed is None else len(c1)
        c1.insert(self._canary_at, canary)
        self.request = DecryptionRequest(federation_id=public.federation_id, round=round,
                                         c1=tuple(_bytes(p) for p in c1))

    def combine(self, shares: Mapping[str, DecryptionShare], *, length: int) -> np.ndarray:
        """The decoded aggregate (``length`` values).

        Raises:
            ProtocolError: a key holder's share is missing (N-of-N: re-run key generation without
                it and redo the round), or a share answers another request.
            IntegrityError: a share fails the canary check (names every such party), or the
                decoded slots are not real-valued (a corrupted share that the canary missed).
        """
        missing = [h for h in self.public.holders if h not in shares]
        if missing:
            raise ProtocolError(f"Decryption shares missing from {', '.join(missing)}: every key holder's share is "
                                "needed (N-of-N). Re-run threshold key generation without them and redo the round.")
        ring, limbs, want = self._c.ring, self._c.ring.data_count, self.request.digest()
        per_party: dict[str, list[np.ndarray]] = {}
        for name in self.public.holders:
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
            m = T.combine_decryption(c0=c0, shares=[per_party[h][k] for h in self.public.holders], ring=ring)
            pt = T.load_plaintext(T.plaintext_bytes(m, ring=ring, parms_id=ring.data_parms_id, scale=self._scale),
                                  self._c.context)
            z = np.asarray(self._c.encoder.decode_complex(pt))
            if np.max(np.abs(z.imag)) > 1e-3:
                raise IntegrityError("The combined aggregate is not real-valued: a decryption share was corrupted.")
            out.append(z.real)
        return np.concatenate(out)[:length] if out else np.zeros(0)


    def _check_canary(self, per_party: Mapping[str, list[np.ndarray]]) -> None:
        """One check of the canary shares' sum against the collective ``p0`` (honest: at most
        n * 2^68 plus a few bits); only when it fails, one check a party, to name who."""
        ring, q = self._c.ring, self._c.ring.q(self._c.ring.data_count)
        total = T.sum_polys([polys[self._canary_at] for polys in per_party.values()], q)
        if T.canary_residual(share=total, u=self._u, p0=self.public.p0_sum, ring=ring,
                             context=self._c.context) <= _CANARY_LIMIT_BITS + 5:  # n <= 32 = 2^5 parties
            return
        bad = [name for name, polys in per_party.items()
               if T.canary_residual(share=polys[self._canary_at], u=self._u, p0=self.public.p0[name], ring=ring,
                                    context=self._c.context) > _CANARY_LIMIT_BITS]
        raise IntegrityError(f"Decryption share(s) of {', '.join(bad) or 'an unidentified key holder'} are not made "
                             "with their key share (canary check against their public key-generation share failed).")


#: An honest canary residual is the smudging noise plus tiny terms, < 2^68 + 2^20; a share under any
#: other key is uniform mod q_0 q_1 (2^120), so its limb-0 value exceeds 2^69 with probability 1 - 2^-50
#: per coefficient (q_0 ~ 2^60: the check reads the centred CRT value, see the hazmat).
_CANARY_LIMIT_BITS = 69.5

__all__ = ["Combiner", "CollectivePublicKey", "DecryptionRequest", "DecryptionShare", "KeyGenShare",
           "ThresholdParty", "ThresholdPreset"]
