"""The CSPRNG Gaussian's float32 path (what DP-SGD draws for float32 parameters): its uniforms, its
distribution, and the dtype the four-sum ends in. (The float64 path: test_trainer.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clinograph.sdk.privacy import noise
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy import stats


def test_float32_uniforms_are_30_bits_of_the_chacha20_stream_plus_one_scaled_into_0_1(monkeypatch):
    monkeypatch.setattr(noise.os, "urandom", lambda n: bytes(range(n)))  # a known key and nonce
    got = noise._uniform32(5_000).numpy()
    stream = Cipher(algorithms.ChaCha20(bytes(range(32)), bytes(range(16))), mode=None).encryptor().update(bytes(20_000))
    words = np.frombuffer(stream, dtype="<u4").astype(np.int64)
    want = ((words & (2 ** 30 - 1)) + 1).astype(np.float64) * 2.0 ** -30  # exact, then one rounding
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert got.min() > 0.0 and got.max() <= 1.0


def test_float32_noise_is_gaussian_with_the_right_scale_by_ks_and_moments_and_fresh_each_call():
    z = noise.secure_gaussian(2.0, torch.Size([200_000]), torch.float32)
    assert z.dtype == torch.float32 and z.shape == (200_000,)
    x = z.double().numpy()
    assert abs(x.mean()) < 0.03 and abs(x.std() - 2.0) < 0.02
    assert abs(stats.kurtosis(x, fisher=False) - 3.0) < 0.1 and abs(stats.skew(x)) < 0.05
    assert stats.kstest(x / 2.0, "norm").pvalue > 1e-6  # rejects a Laplace of the same σ, or σ 3 % off
    halves = x.reshape(2, -1)  # the four-sum pairs draw j with n+j: the values must stay uncorrelated
    assert abs(np.corrcoef(halves)[0, 1]) < 0.02
    a, b = (noise.secure_gaussian(1.0, torch.Size([8]), torch.float32) for _ in range(2))
    assert not torch.equal(a, b)


def test_half_precision_noise_is_summed_in_float32_and_rounded_once():
    z = noise.secure_gaussian(1.0, torch.Size([3, 50_000]), torch.bfloat16)
    assert z.dtype == torch.bfloat16 and z.shape == (3, 50_000)
    assert abs(float(z.double().std()) - 1.0) < 0.02


def _counting_draws(monkeypatch) -> list[int]:
    """Record the number of values of every draw NoiseRows makes (float32: into its kept buffers;
    the real draw still runs)."""
    sizes: list[int] = []
    real = noise.standard_gaussian32_into

    def draw(scratch):
        sizes.append(scratch.values)
        return real(scratch)

    monkeypatch.setattr(noise, "standard_gaussian32_into", draw)
    return sizes


@pytest.mark.parametrize("values", [1000, 5000], ids=["one-plaintext-block", "three-plaintext-blocks"])
def test_the_buffered_float32_draw_is_secure_gaussian_value_for_value(monkeypatch, values):
    """NoiseRows draws into kept buffers (fresh ones each draw came as 106-172 page faults a step), in
    place in the keystream's words, encrypting a 64 KiB zero block in turn; the values must be exactly
    the allocating draw's for the same ChaCha20 key and nonce."""
    monkeypatch.setattr(noise.os, "urandom", lambda n: bytes(range(7, 7 + n)))  # a known key and nonce
    want = noise.secure_gaussian(1.0, torch.Size([values]), torch.float32)
    scratch = noise.Scratch32(values)
    scratch.out.fill_(float("nan"))  # what the last draw left must not matter
    scratch.words.fill_(-1)
    got = noise.standard_gaussian32_into(scratch)
    assert torch.equal(got, want)
    again = noise.standard_gaussian32_into(scratch)  # the same buffers, the same key: the same values
    assert torch.equal(again, want) and again.data_ptr() == got.data_ptr()


def test_noise_rows_hand_out_each_row_of_one_draw_once_then_draw_again(monkeypatch):
    sizes = _counting_draws(monkeypatch)
    rows = noise.NoiseRows(40, torch.float32)
    assert rows.steps == noise.NOISE_STEPS
    got = [rows.next().clone() for _ in range(rows.steps + 3)]
    assert sizes == [rows.steps * 40] * 2  # one draw for 16 steps, the next on the 17th
    flat = torch.stack(got)
    assert flat.shape == (rows.steps + 3, 40) and flat.dtype == torch.float32
    assert len({tuple(r.tolist()) for r in got}) == len(got)  # no row twice
    x = flat.double().numpy().ravel()
    assert abs(x.mean()) < 0.15 and abs(x.std() - 1.0) < 0.1  # N(0, 1): 760 values, ~5 s.e. bounds
    assert noise.NoiseRows(noise.NOISE_VALUES, torch.float32).steps == 1  # a large model draws a step at a time


def test_noise_rows_drawn_before_a_fork_are_dropped_in_the_child(monkeypatch):
    sizes = _counting_draws(monkeypatch)
    rows = noise.NoiseRows(8, torch.float32)
    first = rows.next().clone()
    assert len(sizes) == 1
    monkeypatch.setattr(noise.os, "getpid", lambda: -1)  # what the child of a fork sees: another pid
    child = rows.next()
    assert len(sizes) == 2  # the child drew its own block instead of the parent's 15 rows left
    assert not torch.equal(first, child)


def test_noise_rows_travel_to_another_process_without_their_rows():
    """A hospital brought back from a worker process is pickled: NoiseRows held a memoryview (not
    picklable: test_parallel_hospitals' local-DP run failed), and rows drawn in one process must never
    be added in another."""
    import pickle

    rows = noise.NoiseRows(8, torch.float32)
    used = rows.next().clone()
    left = [r.clone() for r in reversed(rows._rows)]  # the 15 rows this process would hand out next
    back = pickle.loads(pickle.dumps(rows))
    fresh = back.next()
    assert back.n == 8 and back.steps == rows.steps and fresh.shape == (8,)
    assert not any(torch.equal(fresh, r) for r in [used, *left])


def test_each_draw_has_its_own_key_taken_after_the_last_and_a_forked_child_takes_none_of_the_parents(monkeypatch):
    """NoiseRows keys its next draw right after a draw (Scratch32.next_cipher: made while the cipher's code is
    hot). Each draw still uses one fresh os.urandom key and nonce, never one twice; a forked child drops the
    parent's buffers with the key prepared in them (parent and child would otherwise draw the same noise)."""
    keys: list[bytes] = []
    real = noise.os.urandom

    def urandom(n):
        keys.append(real(n))
        return keys[-1]

    monkeypatch.setattr(noise.os, "urandom", urandom)
    rows = noise.NoiseRows(8, torch.float32)
    for _ in range(2 * rows.steps):  # two draws
        rows.next()
    assert len(keys) == 6 and len(set(keys)) == 6  # key, nonce: the two draws' and the third's, prepared
    prepared = rows._scratch.next_cipher
    assert prepared is not None
    monkeypatch.setattr(noise.os, "getpid", lambda: -1)  # what the child of a fork sees
    rows.next()
    assert rows._scratch.next_cipher is not prepared and len(keys) == 10  # the child keyed its own draw
