"""Raw CKKS through Microsoft SEAL (``tenseal.sealapi``): free-parameter contexts, seeded
symmetric encryption, ciphertext (de)serialisation and addition. Hazmat.

Only :mod:`clinograph.secure.ckks` imports this; everyone else picks a
:class:`~clinograph.secure.ckks.presets.CkksPreset`. Nothing here checks protocol context
(round, sender, plan); it only checks that bytes are a well-formed ciphertext for *these*
parameters at the data level and scale given.

Why ``sealapi`` and not TenSEAL's ``ckks_vector``: only SEAL's ``encrypt_symmetric`` returning a
``Serializable<Ciphertext>`` gives *seeded* ciphertexts (the uniformly random ``c1`` is replaced
by the 64-byte PRNG seed that generated it), which halves the upload. ``sealapi`` saves and
loads through file paths only, so every (de)serialisation goes through an anonymous
in-memory file (``memfd_create``): secret-key bytes never touch a disk on Linux. Elsewhere a
private 0600 temporary file is used and removed at once.

Ciphertexts are only *added*: the hospitals divide by the weight sum after decryption, so no
rescale level is needed and the chain is ``[data prime, special prime]`` (the special prime
is not part of a ciphertext at the data level).
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import tenseal.sealapi as seal


@dataclass(frozen=True)
class CkksParams:
    """Free CKKS parameters: ring degree N, coefficient-modulus prime sizes, scale 2**scale_bits."""

    poly_modulus_degree: int
    coeff_bits: tuple[int, ...]
    scale_bits: int

    @property
    def slot_count(self) -> int:
        """Values per ciphertext (N/2)."""
        return self.poly_modulus_degree // 2

    @property
    def data_bits(self) -> int:
        """Bits of the modulus a fresh ciphertext lives under (all primes but the special one)."""
        bits = self.coeff_bits[:-1] if len(self.coeff_bits) > 1 else self.coeff_bits
        return sum(bits)

    @property
    def max_abs_slot(self) -> float:
        """Largest |slot| that decodes correctly: the constant coefficient Δ·x must stay well
        below q/2 (one bit of margin for noise), i.e. |x| < 2**(log2 q - 2 - scale_bits)."""
        return float(2.0 ** min(self.data_bits - 2 - self.scale_bits, 40))


@contextmanager
def _scratch() -> Iterator[tuple[int, str]]:
    """An anonymous read-write file and a path SEAL can open (in memory on Linux)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("clinograph-ckks", os.MFD_CLOEXEC)
        try:
            yield fd, f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="clinograph-ckks-") as tmp:  # 0700 directory
        path = os.path.join(tmp, "obj")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            yield fd, path
        finally:
            os.close(fd)


def dump(obj: Any) -> bytes:
    """SEAL's own serialisation (zstd-compressed when SEAL was built with it) of ``obj``."""
    with _scratch() as (fd, path):
        obj.save(path)
        return os.pread(fd, os.fstat(fd).st_size, 0)


_SEAL_MAGIC, _ZSTD_MAGIC = 0xA15E, 0xFD2FB528
_COMPR_NONE, _COMPR_ZSTD = 0, 2


def check_framing(data: bytes) -> None:
    """Refuse bytes whose framing does not add up, before SEAL reads them: SEAL's 16-byte header
    (magic, header size, the total size equal to ``len(data)``, compression none or zstd) and, under
    zstd, one frame whose blocks end exactly where the data ends. SEAL 4's zstd reader aborts the
    whole process (``std::terminate``) on some frames cut short or padded inside; SEAL checks the
    members themselves. Raises ValueError naming what does not add up."""
    if len(data) < 16:
        raise ValueError(f"{len(data)} bytes are shorter than SEAL's serialisation header")
    magic, header_size, _major, _minor, compr, _reserved, size = struct.unpack_from("<HBBBBHQ", data)
    if magic != _SEAL_MAGIC or header_size != 16:
        raise ValueError("the bytes are not SEAL's serialisation (magic or header size)")
    if size != len(data):
        raise ValueError(f"the SEAL header says {size} bytes, {len(data)} were given")
    if compr == _COMPR_ZSTD:
        _check_zstd_frame(memoryview(data)[16:])
    elif compr != _COMPR_NONE:
        raise ValueError(f"compression mode {compr} is not one Clinograph's SEAL writes (0 none, 2 zstd)")


def _check_zstd_frame(frame: memoryview) -> None:
    """One zstd frame (RFC 8878, 3.1.1) whose block headers walk exactly to its end."""
    if len(frame) < 6 or struct.unpack_from("<I", frame)[0] != _ZSTD_MAGIC:
        raise ValueError("the zstd frame does not start with zstd's magic number")
    fhd = frame[4]
    fcs_flag, single, reserved, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 3) & 1, (fhd >> 2) & 1, fhd & 3
    if reserved:
        raise ValueError("the zstd frame header sets its reserved bit")
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag] + ((1 if single else 0), 2, 4, 8)[fcs_flag]
    while True:
        if pos + 3 > len(frame):
            raise ValueError("the zstd frame ends inside a block header")
        head = int.from_bytes(frame[pos:pos + 3], "little")
        last, kind, size = head & 1, (head >> 1) & 3, head >> 3
        if kind == 3:
            raise ValueError("the zstd frame holds a block of the reserved type")
        pos += 3 + (1 if kind == 1 else size)  # RLE: one byte; raw and compressed: size bytes
        if pos > len(frame):
            raise ValueError("a zstd frame block runs past the end of the data")
        if last:
            break
    if pos + 4 * checksum != len(frame):
        raise ValueError(f"the zstd frame ends {len(frame) - pos - 4 * checksum} byte(s) before the data does")


def _seal_load(obj: Any, path: str, context: seal.SEALContext | None) -> None:
    obj.load(path) if context is None else obj.load(context, path)


def _load(obj: Any, data: bytes, context: seal.SEALContext | None) -> None:
    check_framing(data)
    with _scratch() as (fd, path):
        view, pos = memoryview(data), 0
        while pos < len(data):
            pos += os.pwrite(fd, view[pos:], pos)
        try:
            _seal_load(obj, path, context)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"SEAL refused the bytes: {exc}") from None


def build_context(params: CkksParams) -> tuple[seal.SEALContext, bytes]:
    """A SEAL context enforcing the HE-standard 128-bit bound, and its parameter bytes."""
    parms = seal.EncryptionParameters(seal.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(params.poly_modulus_degree)
    parms.set_coeff_modulus(seal.CoeffModulus.Create(params.poly_modulus_degree, list(params.coeff_bits)))
    return _context_of(parms), dump(parms)


def _context_of(parms: seal.EncryptionParameters) -> seal.SEALContext:
    ctx = seal.SEALContext(parms, True, seal.SEC_LEVEL_TYPE.TC128)
    if not ctx.parameters_set():
        raise ValueError(f"CKKS parameters rejected by SEAL at 128-bit security: {ctx.parameters_error_message()}")
    return ctx


class CkksEvaluator:
    """Parameters only, no key of any kind: loads ciphertexts and adds them (the server side)."""

    def __init__(self, params: CkksParams, parms_bytes: bytes):
        parms = seal.EncryptionParameters(seal.SCHEME_TYPE.CKKS)
        _load(parms, parms_bytes, None)
        if (parms.poly_modulus_degree() != params.poly_modulus_degree
                or [m.bit_count() for m in parms.coeff_modulus()] != list(params.coeff_bits)):
            raise ValueError("SEAL parameter bytes do not match the preset's ring degree and primes")
        self.params = params
        self.context = _context_of(parms)
        self._evaluator = seal.Evaluator(self.context)

    def load_ciphertext(self, data: bytes) -> seal.Ciphertext:
        """Parse one ciphertext and check it is fresh-shaped: 2 polynomials, NTT form, data
        level of *these* parameters, the preset's scale. Raises ValueError otherwise."""
        ct = seal.Ciphertext()
        _load(ct, data, self.context)  # SEAL checks parms_id and data validity here
        if ct.size() != 2 or not ct.is_ntt_form() or ct.is_transparent():
            raise ValueError("ciphertext is not a 2-component NTT-form ciphertext")
        if list(ct.parms_id()) != list(self.context.first_parms_id()):
            raise ValueError("ciphertext is not at the data level of these parameters")
        if ct.scale != 2.0 ** self.params.scale_bits:
            raise ValueError(f"ciphertext scale is 2^{np.log2(ct.scale):.1f}, expected 2^{self.params.scale_bits}")
        return ct

    def add_inplace(self, acc: seal.Ciphertext, other: seal.Ciphertext) -> None:
        """acc <- acc + other (homomorphic addition; scales and levels already checked)."""
        self._evaluator.add_inplace(acc, other)


class CkksSecretContext(CkksEvaluator):
    """Parameters plus the secret key: encrypts (seeded, symmetric) and decrypts. Redacted repr,
    refuses to pickle."""

    def __init__(self, params: CkksParams, parms_bytes: bytes, secret_key: bytes | None = None):
        super().__init__(params, parms_bytes)
        self.parms_bytes = parms_bytes
        if secret_key is None:
            self._sk = seal.KeyGenerator(self.context).secret_key()  # SEAL's CSPRNG (Blake2xb, OS-seeded)
        else:
            self._sk = seal.SecretKey()
            _load(self._sk, secret_key, self.context)
        self._encoder = seal.CKKSEncoder(self.context)
        self._encryptor = seal.Encryptor(self.context, self._sk)
        self._decryptor = seal.Decryptor(self.context, self._sk)

    @classmethod
    def generate(cls, params: CkksParams) -> CkksSecretContext:
        """Fresh parameters and a fresh secret key."""
        _, parms_bytes = build_context(params)
        return cls(params, parms_bytes)

    def secret_key_bytes(self) -> bytes:
        """The serialised secret key (only ever wrapped for a peer hospital)."""
        return dump(self._sk)

    def encrypt(self, values: np.ndarray) -> list[bytes]:
        """Seeded symmetric encryptions of ``values`` in chunks of N/2 slots (last chunk
        zero-padded by the encoder)."""
        n, scale = self.params.slot_count, 2.0 ** self.params.scale_bits
        out: list[bytes] = []
        pt = seal.Plaintext()
        flat = np.asarray(values, dtype=np.float64).reshape(-1)
        for start in range(0, max(len(flat), 1), n):
            self._encoder.encode(flat[start:start + n].tolist(), scale, pt)
            out.append(dump(self._encryptor.encrypt_symmetric(pt)))
        return out

    def decrypt(self, ciphertexts: Sequence[seal.Ciphertext], length: int) -> np.ndarray:
        """Decrypt and decode, concatenated and cut to ``length`` values."""
        pt = seal.Plaintext()
        parts = []
        for ct in ciphertexts:
            self._decryptor.decrypt(ct, pt)
            parts.append(np.asarray(self._encoder.decode_double(pt), dtype=np.float64))
        return np.concatenate(parts)[:length] if parts else np.zeros(0)

    def __repr__(self) -> str:
        return f"CkksSecretContext(N={self.params.poly_modulus_degree}, secret_key=<redacted>)"

    def __reduce__(self) -> Any:  # noqa: D105
        raise TypeError("CkksSecretContext holds a secret key and refuses to be pickled.")


def dump_ciphertext(ct: seal.Ciphertext) -> bytes:
    """A full (unseeded) ciphertext's bytes, e.g. an aggregate."""
    return dump(ct)


def pack_fields(parts: Sequence[bytes]) -> bytes:
    """Length-prefixed concatenation (no ambiguity between fields)."""
    return b"".join(struct.pack(">I", len(p)) + p for p in parts)


def unpack_fields(data: bytes, count: int) -> list[bytes]:
    """Inverse of :func:`pack_fields`; ValueError unless exactly ``count`` fields fill ``data``."""
    out, pos = [], 0
    for _ in range(count):
        if pos + 4 > len(data):
            raise ValueError("truncated field header")
        (size,) = struct.unpack_from(">I", data, pos)
        pos += 4
        if pos + size > len(data):
            raise ValueError("truncated field")
        out.append(data[pos:pos + size])
        pos += size
    if pos != len(data):
        raise ValueError("trailing bytes")
    return out
