"""Gaussian noise for DP-SGD from a cryptographically secure, OS-seeded source.

Opacus's own ``secure_mode`` needs torchcsprng, which does not install here. Instead each draw
takes a fresh 32-byte key from ``os.urandom`` and expands it with ChaCha20 (``cryptography``)
into uniforms, turned into normals by Box-Muller. As in Opacus's secure mode (Holohan & Braghin
2021, sec. 5.1) each noise value is the sum of four normals of standard deviation σ·C, divided by
2, which blunts floating-point attacks on the low-order bits of a single Gaussian sample
(Mironov 2012; Jin et al. 2022).

**Precision follows the requested dtype.** A float64 draw uses 53-bit uniforms and float64
Box-Muller and four-sum. A float32 draw (what DP-SGD asks for float32 parameters,
:func:`~.per_patient.dp_sgd_step`) runs Box-Muller and the four-sum in float32, which is what
Opacus's ``secure_mode`` itself does: its ``_generate_noise`` sums four ``torch.normal`` draws of
the default dtype (float32: Box-Muller in float32 on 24-bit uniforms) in the parameters' dtype.
Here the float32 uniforms carry 30 bits, (w + 1)·2^-30 rounded once, so a normal's tail reaches
√(2·30·ln 2) ≈ 6.45 (torch's 24-bit uniforms: 5.77), and the source is ChaCha20 instead of
torchcsprng's AES-CTR: not below Opacus's secure mode on any count. It costs about half the
float64 draw (transcendentals on twice the SIMD lanes, half the keystream).

What it is not: a constant-time or exact discrete Gaussian sampler. Box-Muller in floating point
is an approximation; the four-sum is a mitigation, not a proof.

The local-DP engine takes its noise through :class:`NoiseRows` (several steps' rows in one draw).
:func:`install_secure_noise` replaces ``add_noise`` on one Opacus ``DPOptimizer`` instance
(flat clipping); :class:`~clinograph.sdk.privacy.DPTrainer` calls :func:`secure_gaussian`
directly in its default engine. :func:`os_seeded_generator` gives a torch generator seeded from
``os.urandom`` (Mersenne Twister: OS-seeded, **not** cryptographically secure), used by no
engine any more (adaptive clipping's noise is :func:`secure_gaussian` too), only by a research
benchmark of Opacus's own engine; Poisson sampling uses the ChaCha20 ``CsprngUniform``
(docs/privacy.md says so).
"""

from __future__ import annotations

import math
import os
import types

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms


def csprng_uniform(n: int) -> np.ndarray:
    """``n`` floats in (0, 1]: 53 bits each from ChaCha20 keyed by ``os.urandom(32)``, (w + 1)·2^-53."""
    key, nonce = os.urandom(32), os.urandom(16)
    stream = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(8 * n))
    words = (np.frombuffer(stream, dtype=np.uint64) >> np.uint64(11)).view(np.int64)  # < 2^53: exact as int64
    words += 1
    out = words.astype(np.float64)  # signed conversion: one instruction a value (unsigned needs a fix-up)
    out *= 2.0 ** -53
    return out


class Scratch32:
    """Buffers of one float32 draw of ``values`` noise values (4 normals each), kept for the next
    draw of the same size (:class:`NoiseRows`): allocated afresh, a draw's ~13·values·4 bytes of
    temporaries came from new pages every time (glibc maps large blocks and unmaps them when freed):
    106-172 page faults a step at 9-15 k parameters, which doubled the noise's cost. The draw runs in
    place in the keystream's own words (uniforms, then r and θ, then the normals) and the result
    (:func:`standard_gaussian32_into`), 20 bytes a value; the plaintext ChaCha20 encrypts is a 64 KiB block
    of zeros used in turn (the keystream is the same as one call's)."""

    def __init__(self, values: int):
        n = 4 * int(values)  # uniforms = normals: 2 a Box-Muller pair, 2 pairs a value
        self.values = int(values)
        self.words = torch.empty(n, dtype=torch.int32)
        self.word_bytes = self.words.numpy().view(np.uint8)  # made once: ~2.5 µs, ~17 µs cold after a training step
        self.zeros = memoryview(bytes(min(4 * n, ZERO_BLOCK)))  # the plaintext ChaCha20 encrypts into the keystream
        self.out = torch.empty(int(values), dtype=torch.float32)
        #: the next draw's ChaCha20 encryptor under a fresh ``os.urandom`` key, made right after a draw (its
        #: code still hot: ~8 µs, against 50-60 µs made cold at the start of a draw that follows training steps);
        #: dropped with these buffers in a forked child (:class:`NoiseRows`), never pickled
        self.next_cipher = None


#: the plaintext block :class:`Scratch32` encrypts in turn (bytes)
ZERO_BLOCK = 1 << 16


def _cipher():  # noqa: ANN202 - a cryptography CipherContext
    """A ChaCha20 keystream under a fresh ``os.urandom`` key and nonce (one a draw)."""
    return Cipher(algorithms.ChaCha20(os.urandom(32), os.urandom(16)), mode=None).encryptor()


def _uniform32(n: int) -> torch.Tensor:
    """``n`` float32 uniforms in (0, 1]: 30 bits of ChaCha20 keyed by ``os.urandom(32)`` each,
    (w + 1)·2^-30 rounded once (the keystream written straight into an int32 tensor)."""
    words = torch.empty(n, dtype=torch.int32)
    _cipher().update_into(bytes(4 * n), words.numpy().view(np.uint8))
    words.bitwise_and_(0x3FFFFFFF).add_(1)  # w + 1 <= 2^30: exact in int32
    return words.float().mul_(2.0 ** -30)


def csprng_normal(n: int) -> np.ndarray:
    """``n`` standard normals (float64) from :func:`csprng_uniform` by Box-Muller."""
    return _box_muller((n + 1) // 2)[:n].numpy()


def _box_muller(m: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """2m standard normals, [r cos θ (m) | r sin θ (m)], r = √(−2 ln u₁), θ = 2π u₂, in place on one
    CSPRNG draw (torch's vectorised log/cos/sin: half numpy's time). ``dtype`` float64: 53-bit
    uniforms, float64 math; float32: :func:`_uniform32`, float32 math (module docstring)."""
    u = torch.from_numpy(csprng_uniform(2 * m)) if dtype == torch.float64 else _uniform32(2 * m)
    r = u[:m].log_().mul_(-2.0).sqrt_()
    theta = u[m:].mul_(2.0 * math.pi)
    z = torch.empty(2 * m, dtype=u.dtype)
    torch.cos(theta, out=z[:m]).mul_(r)
    torch.sin(theta, out=z[m:]).mul_(r)
    return z


def secure_gaussian(std: float, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """N(0, std²) noise of ``shape``: (Σ of 4 normals of std) / 2, CSPRNG-sourced. The four
    normals of value j are Box-Muller outputs j, n+j, 2n+j, 3n+j (independent: distinct pairs or
    the two coordinates of one pair), summed before the one rounding to ``dtype``: in float64 for
    a float64 result, else in float32, as Opacus's secure mode sums in the parameters' dtype
    (module docstring)."""
    n = math.prod(shape)  # of a torch.Size: numpy's prod converts it to an array first (~3 µs)
    if std == 0 or n == 0:
        return torch.zeros(shape, dtype=dtype)
    z = _box_muller(2 * n, torch.float64 if dtype == torch.float64 else torch.float32)  # 4n normals
    total = z[:n].add(z[n:2 * n]).add_(z[2 * n:3 * n]).add_(z[3 * n:])
    return total.mul_(std / 2.0).to(dtype).reshape(shape)


def standard_gaussian32_into(scratch: Scratch32) -> torch.Tensor:
    """:func:`secure_gaussian` (std 1, float32) of ``scratch.values`` values, computed in ``scratch``'s
    buffers (no allocation; the same values, operation for operation, for the same key and nonce, a
    fresh key a draw): ``scratch.out``. In place in the keystream's words: their uniforms (a float32 view
    of the same memory: each element converted where it is), r and θ, then per half of the pairs
    sin θ into the result buffer, r cos θ into θ's place and r sin θ into r's, and the four-sum into the
    result (1.2 MB a 59 k-value draw, was 4.4 MB: twice the steps a draw for the same memory)."""
    v, w = scratch.values, scratch.words
    n, m = 4 * v, 2 * v
    enc = scratch.next_cipher if scratch.next_cipher is not None else _cipher()
    block, data = len(scratch.zeros), scratch.word_bytes
    for at in range(0, 4 * n, block):  # the same keystream as one call
        end = min(4 * n, at + block)
        enc.update_into(scratch.zeros[:end - at], data[at:end])
    scratch.next_cipher = _cipher()  # one key a draw, as before: the next one's taken now
    w.bitwise_and_(0x3FFFFFFF).add_(1)  # w + 1 <= 2^30: exact in int32
    u = w.view(torch.float32)
    u.copy_(w).mul_(2.0 ** -30)  # the same one rounding as _uniform32, then an exact power of two
    r = u[:m].log_().mul_(-2.0).sqrt_()
    theta = u[m:].mul_(2.0 * math.pi)
    t = scratch.out
    for h in (slice(0, v), slice(v, m)):
        torch.sin(theta[h], out=t)
        theta[h].cos_().mul_(r[h])  # z[h] = r cos θ
        torch.mul(t, r[h], out=r[h])  # z[m + h] = r sin θ
    torch.add(theta[:v], theta[v:], out=t).add_(r[:v]).add_(r[v:])  # z[:v] + z[v:2v] + z[2v:3v] + z[3v:]
    return t.mul_(0.5)


#: :class:`NoiseRows` draws at most this many steps' noise at once (the draw's fixed cost -- a key, a
#: cipher, ~20 tensor operations and their cold code after a training step, 35-80 µs -- shared by them)
NOISE_STEPS = 16
#: ... and at most this many values at once (the draw's buffers, 20 bytes a value, are kept: 2.7 MB at most;
#: 2^16 values with 52 bytes a value before session 52): a larger model draws fewer steps ahead, down to one
NOISE_VALUES = 1 << 17


class NoiseRows:
    """Standard-normal noise rows [n] for consecutive DP-SGD steps, each a fresh
    :func:`secure_gaussian` value (the CSPRNG four-sum, std 1), drawn ``steps`` rows at a time
    (:data:`NOISE_STEPS`, fewer for a large ``n``: :data:`NOISE_VALUES`) and handed out once each.

    Drawing ahead changes no value's distribution or independence (one draw of k·n values is k draws
    of n); it shares the draw's fixed cost among k steps, which at the SDK's model sizes (47-15 000
    trained parameters) is 15-60 % of the noise. A row is never handed out twice; the rows left are
    dropped when the process is not the one that drew them (a fork: parent and child would otherwise
    add the same noise) or the dtype changes. A float32 draw runs in buffers kept from one draw to
    the next (:class:`Scratch32`: the same values as :func:`secure_gaussian`, without its fresh
    pages). Not for use by several threads at once (one per trainer, as the engine it belongs to)."""

    def __init__(self, n: int, dtype: torch.dtype):
        self.n, self.dtype = int(n), dtype
        self.steps = max(1, min(NOISE_STEPS, NOISE_VALUES // max(self.n, 1)))
        self._rows: list[torch.Tensor] = []
        self._pid = os.getpid()
        #: float32 (every model here): the draw's buffers, kept (:class:`Scratch32`), made at the first draw
        self._scratch: Scratch32 | None = None

    def next(self) -> torch.Tensor:
        """The next unused row [n] (a view of the block drawn last, overwritten by the next draw: valid
        until the row after the block's last is asked for)."""
        if self._pid != os.getpid():  # a forked child: nothing drawn or keyed in the parent is used
            self._rows, self._pid, self._scratch = [], os.getpid(), None
        if not self._rows:
            if self._scratch is None and self.dtype == torch.float32 and self.n:
                self._scratch = Scratch32(self.steps * self.n)
            block = (standard_gaussian32_into(self._scratch) if self._scratch is not None
                     else secure_gaussian(1.0, torch.Size([self.steps * self.n]), self.dtype))
            self._rows = list(block.view(self.steps, self.n).unbind(0))
            self._rows.reverse()  # pop() from the end hands them out in drawing order
        return self._rows.pop()

    def __getstate__(self) -> dict:
        """Pickled (a hospital brought back from a worker process) without its rows or buffers: noise
        drawn in one process is never added in another."""
        return {"n": self.n, "dtype": self.dtype, "steps": self.steps}

    def __setstate__(self, state: dict) -> None:
        self.n, self.dtype, self.steps = state["n"], state["dtype"], state["steps"]
        self._rows, self._pid, self._scratch = [], os.getpid(), None

    def __repr__(self) -> str:
        return f"NoiseRows(n={self.n}, dtype={self.dtype}, steps={self.steps})"


def _add_secure_noise(self) -> None:  # noqa: ANN001 - bound to an Opacus DPOptimizer
    """Drop-in for ``DPOptimizer.add_noise`` (same contract: p.grad = summed_grad + noise), with
    one CSPRNG draw for all parameters of the step."""
    from .opacus_import import import_opacus

    import_opacus()  # Opacus's import-time logging.basicConfig: not on the host's root logger
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

    std = self.noise_multiplier * self.max_grad_norm
    sizes = [p.summed_grad.numel() for p in self.params]
    dtypes = {p.summed_grad.dtype for p in self.params}
    flat = secure_gaussian(std, torch.Size([sum(sizes)]), dtypes.pop() if len(dtypes) == 1 else torch.float64)
    for p, chunk in zip(self.params, torch.split(flat, sizes), strict=True):
        _check_processed_flag(p.summed_grad)
        noise = chunk.to(p.summed_grad.dtype).reshape(p.summed_grad.shape)
        p.grad = (p.summed_grad + noise).view_as(p)
        _mark_as_processed(p.summed_grad)


def install_secure_noise(optimizer: object) -> None:
    """Make one flat-clipping Opacus ``DPOptimizer`` draw its noise from :func:`secure_gaussian`."""
    from .opacus_import import import_opacus

    import_opacus()  # Opacus's import-time logging.basicConfig: not on the host's root logger
    from opacus.optimizers import DPOptimizer
    from opacus.optimizers.adaclipoptimizer import AdaClipDPOptimizer

    if not isinstance(optimizer, DPOptimizer) or isinstance(optimizer, AdaClipDPOptimizer):
        raise TypeError("install_secure_noise expects a flat-clipping opacus DPOptimizer")
    optimizer.add_noise = types.MethodType(_add_secure_noise, optimizer)  # type: ignore[method-assign]


def os_seeded_generator() -> torch.Generator:
    """A torch CPU generator seeded with 64 bits from ``os.urandom`` (not a CSPRNG)."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
