"""Named CKKS parameter sets (presets, not knobs).

Every preset satisfies the HomomorphicEncryption.org standard's 128-bit classical security
bound for its ring degree (N = 8192: total coefficient modulus <= 218 bits); SEAL enforces it
when the context is built (``sec_level_type.tc128``). Sizes are bytes a client uploads per
model parameter, measured here with TenSEAL 0.3.18 (SEAL's own zstd serialisation, seeded
ciphertexts; they travel as raw envelope attachments, see :mod:`clinograph.secure.ckks.messages`);
``tests/secure/ckks/test_ckks_presets.py`` pins them.

The mode only *adds* ciphertexts and the hospitals divide by Σ w after decryption, so no
rescale level is needed: a ciphertext lives under the data prime alone (the last prime is
SEAL's special prime, never part of a ciphertext).
"""

from __future__ import annotations

from enum import Enum

from ..hazmat.ckks_context import CkksParams


class CkksPreset(str, Enum):
    """Pick one of these; free parameters exist only in :mod:`clinograph.secure.hazmat`."""

    ADD_ONLY_128 = "add_only_128"
    ADD_ONLY_128_COMPACT = "add_only_128_compact"
    NVFLARE_DEFAULT = "nvflare_default"

    @property
    def params(self) -> CkksParams:
        """The SEAL parameters behind the preset (hazmat)."""
        return _PARAMS[self]

    @property
    def security_bits(self) -> int:
        """Classical security level per the HE standard (SEAL enforces it)."""
        return 128

    @property
    def upload_bytes_per_param(self) -> float:
        """Measured upload (SEAL bytes, seeded) per model parameter, 1 M parameters."""
        return _MEASURED_BYTES[self]

    @property
    def max_abs_sum(self) -> float:
        """Largest |value| any aggregated slot may reach without wrapping modulo q."""
        return self.params.max_abs_slot


_PARAMS = {
    CkksPreset.ADD_ONLY_128: CkksParams(8192, (60, 40), 40),
    CkksPreset.ADD_ONLY_128_COMPACT: CkksParams(8192, (56, 40), 36),
    CkksPreset.NVFLARE_DEFAULT: CkksParams(8192, (60, 40, 40), 40),
}

# Measured by benchmarks/secure_aggregation_cost/secure_aggregation_ckks.py (seeded, zstd, P = 1e6): SEAL bytes / P.
_MEASURED_BYTES = {
    CkksPreset.ADD_ONLY_128: 16.05,
    CkksPreset.ADD_ONLY_128_COMPACT: 15.16,
    CkksPreset.NVFLARE_DEFAULT: 28.04,
}

CkksPreset.ADD_ONLY_128.__doc__ = (
    "N = 8192, primes [60, 40], scale 2^40, additions only. 128-bit (HE standard: 100 of 218 "
    "bits allowed at N = 8192). Upload 16.05 bytes/parameter seeded (NVFLARE's default: 57.6 "
    "with TenSEAL's serialisation). Max abs error ~1e-9 per slot; |aggregate slot| < 2^18.")
CkksPreset.ADD_ONLY_128_COMPACT.__doc__ = (
    "N = 8192, primes [56, 40], scale 2^36, additions only. 128-bit (96 of 218 bits). Upload "
    "15.16 bytes/parameter seeded (a 56-bit data prime leaves a zero byte per coefficient "
    "that zstd removes). Max abs error ~1.5e-8 per slot; |aggregate slot| < 2^18.")
CkksPreset.NVFLARE_DEFAULT.__doc__ = (
    "N = 8192, primes [60, 40, 40], scale 2^40: NVFLARE's default, kept as the reference "
    "anchor. 128-bit (140 of 218 bits). Its spare rescale level costs a second data prime: "
    "28.04 bytes/parameter even seeded (57.6 through TenSEAL's ckks_vector serialisation).")


def preset_named(name: object) -> CkksPreset:
    """The preset called ``name``; a miss lists the options."""
    for p in CkksPreset:
        if p.value == name:
            return p
    raise ValueError(f"Unknown CKKS preset {name!r}. Registered: {', '.join(p.value for p in CkksPreset)}.")
