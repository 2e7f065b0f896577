"""What client and server halves of the ``masked`` mode share: vector layout, derivation
contexts, share encryption and the unmask-request consistency check.

Vector layout (module-wise, documented choice). Every client masks one vector of length
``L = sum_m |m| + 2M`` over *all* M shared modules of ``plan.spec`` in spec order: the values
``w_i * Delta_i,m`` of module m (zeros if it did not train m), then M weight slots (``w_i`` if
it trained m, else 0) and M count slots (1 or 0). After unmasking the server holds
per-module ``sum_i w_i Delta_i,m``, ``sum_i w_i`` and the contributor count -- and, because
every vector has the same length and untrained modules are masked zeros, nothing about which
client trained which module. The price is bandwidth for modules a client did not train.
"""

from __future__ import annotations

import functools
import os
import re
import struct
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from clinograph.core.errors import IntegrityError, ProtocolError
from clinograph.core.identity import PublicIdentity
from clinograph.core.labels import KDF_SHARE_ENCRYPTION_DIRECTED

from ..aggregation.base import LocalUpdate, ModuleSums
from ..hazmat import fixedpoint
from ..hazmat.shamir import SHARE_BYTES
from ..hazmat.x25519 import encode_context, hkdf
from ..messages import ID_PATTERN, RoundPlan, WireMessage
from ..wire import SIGNATURE_BYTES, kind_of, open_signed
from .messages import MASKING_VERSION as MASKING_VERSION  # re-exported: it lives with the messages
from .params import MaskingParams

M = TypeVar("M", bound=WireMessage)
_ID = re.compile(ID_PATTERN)

STAGES = ("advertise_keys", "share_keys", "masked_input", "consistency_check", "unmask", "done")


@dataclass(frozen=True)
class Layout:
    """Offsets of each shared module and of the weight / count slots in the masked vector."""

    names: tuple[str, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, plan: RoundPlan) -> Layout:
        """The layout for ``plan.spec``'s shared modules, in spec order."""
        names, offs, sizes, pos = [], [], [], 0
        for m in plan.spec.shared:
            names.append(m.name)
            offs.append(pos)
            sizes.append(m.size)
            pos += m.size
        return cls(tuple(names), tuple(offs), tuple(sizes))

    @property
    def n_values(self) -> int:
        """Number of parameter words (all shared modules)."""
        return sum(self.sizes)

    @property
    def length(self) -> int:
        """Total words: values, then one weight slot and one count slot per module."""
        return self.n_values + 2 * len(self.names)


def check_update(update: LocalUpdate, *, layout: Layout, params: MaskingParams) -> dict[str, int]:
    """Validate an update against the plan without encoding it; return per-module clip counts.

    Raises ProtocolError for an unknown module, a wrong size, a weight out of range, NaN or
    infinity, or (unless the plan sets ``masked.out_of_range = "clip"``) a value outside
    ``[-clip, clip]``. Messages carry counts and bounds, never values.
    """
    unknown = sorted(set(update.modules) - set(layout.names))
    if unknown:
        raise ProtocolError(f"Update has module(s) {unknown} that are not shared modules of the plan's ModelSpec.")
    w = float(update.weight)
    if not (np.isfinite(w) and 0 < w <= params.max_weight):
        raise ProtocolError(f"Update weight is outside (0, {params.max_weight}] (masked.max_weight). Normalise "
                            "weights, or raise masked.max_weight in masked_plan_options().")
    clipped: dict[str, int] = {}
    for name, size in zip(layout.names, layout.sizes, strict=True):
        if name not in update.modules:
            continue
        vec = np.asarray(update.modules[name], dtype=np.float64).reshape(-1)
        if vec.size != size:
            raise ProtocolError(f"Module {name!r} has {vec.size} values; the ModelSpec says {size}.")
        if size and -params.clip <= vec.min() and vec.max() <= params.clip:  # NaN fails both: two passes, no copy
            continue
        n_in = int(np.count_nonzero(np.abs(vec) <= params.clip))  # NaN compares False
        n_bad = int(np.count_nonzero(~np.isfinite(vec))) if n_in < size else 0
        n_out = size - n_in if not n_bad else 0
        if n_bad or (n_out and not params.clip_out_of_range):
            what = f"{n_bad} value(s) are NaN or infinite" if n_bad else \
                f"{n_out} of {size} value(s) are outside [-{params.clip}, {params.clip}]"
            raise ProtocolError(f"Module {name!r}: {what} (masked.clip). Clip the update (DP clipping bounds it), "  # noqa: S608
                                "raise masked.clip, or set out_of_range='clip' to clip and count.")
        if n_out:
            clipped[name] = n_out
    return clipped


def encode_update(update: LocalUpdate, *, layout: Layout, params: MaskingParams,
                  checked: bool = False) -> list[np.ndarray]:
    """The client's plaintext ring vector x_u as its two parts: the values (uint32, or uint16 in
    the quantised mode) and the weight and count slots (uint32), see module doc.

    ``checked``: the caller already ran :func:`check_update` on this update (no second pass).
    Raises ProtocolError as :func:`check_update` does.
    """
    if not checked:
        check_update(update, layout=layout, params=params)
    w = float(update.weight)
    m = len(layout.names)
    cut = np.dtype(params.value_dtype).itemsize * layout.n_values
    frame = np.zeros(cut + 8 * m, dtype=np.uint8)  # one buffer: to_words copies it once
    values = frame[:cut].view(params.value_dtype)
    slots = frame[cut:].view(np.uint32)
    w_word = round(w * params.weight_scale)  # fixedpoint eq. (1), rint: 0 < w <= max_weight (checked), no wrap
    for j, (name, off, size) in enumerate(zip(layout.names, layout.offsets, layout.sizes, strict=True)):
        if name in update.modules:
            _encode_checked(update.modules[name], out=values[off:off + size], params=params)
            slots[j], slots[m + j] = w_word, 1  # weight slot, count slot (untrained: 0, 0)
    return [values, slots]


def _encode_checked(vec: np.ndarray, *, out: np.ndarray, params: MaskingParams) -> None:
    """fixedpoint eq. (1) (or params.py eq. (2)) for values :func:`check_update` already found
    finite and in range (clipped here when configured): q = rint(x * scale), written into ``out``
    as two's complement. |q| <= clip * scale + 1/2 < 2^31 (2^15) by the no-wrap scale, so the
    signed cast is exact; one float temporary, no int64 pass (fixedpoint.encode re-checks and
    was the largest cost of a client's masked input at P = 1e6)."""
    x = np.asarray(vec, dtype=np.float64).reshape(-1)
    if params.clip_out_of_range:
        x = np.clip(x, -params.clip, params.clip)
    t = np.multiply(x, params.scale)
    np.rint(t, out=t)
    np.copyto(out.view(np.int16 if out.dtype == np.uint16 else np.int32), t, casting="unsafe")  # exact: integral, in range


def to_words(parts: list[np.ndarray]) -> bytes:
    """The masked vector's wire bytes: little-endian values, then slots.

    Parts made by :func:`encode_update` are consecutive views of one buffer: on a
    little-endian host that buffer is copied once (no per-part copy and join)."""
    base = parts[0].base
    if sys.byteorder == "little" and isinstance(base, np.ndarray) and base.dtype == np.uint8 \
            and base.flags.c_contiguous and all(p.base is base and p.flags.c_contiguous for p in parts) \
            and sum(p.nbytes for p in parts) == base.nbytes and _tile(parts, base.ctypes.data):
        return base.tobytes()
    return b"".join(p.astype(p.dtype.newbyteorder("<"), copy=False).tobytes() for p in parts)


def _tile(parts: list[np.ndarray], start: int) -> bool:
    """Whether ``parts`` lie back to back in memory from address ``start`` (one address read a
    part: this check was most of a small vector's ``to_words``)."""
    for p in parts:
        if p.ctypes.data != start:
            return False
        start += p.nbytes
    return True


def from_words(words: bytes, *, layout: Layout, params: MaskingParams, sender: str) -> list[np.ndarray]:
    """Inverse of :func:`to_words` (read-only views); a wrong length is a ProtocolError."""
    vb = np.dtype(params.value_dtype).itemsize
    expected = vb * layout.n_values + 4 * 2 * len(layout.names)
    if len(words) != expected:
        raise ProtocolError(f"Masked vector from {sender!r} has {len(words)} bytes; expected {expected} "
                            f"({vb} bytes x {layout.n_values} values + 4 bytes x {2 * len(layout.names)} slots).")
    cut = vb * layout.n_values
    return [np.frombuffer(words, dtype="<u2" if vb == 2 else "<u4", count=layout.n_values),
            np.frombuffer(words, dtype="<u4", offset=cut)]


def word_bytes(layout: Layout, params: MaskingParams) -> int:
    """Bytes of one masked vector on the wire."""
    return np.dtype(params.value_dtype).itemsize * layout.n_values + 8 * len(layout.names)


def _signed(values: np.ndarray) -> np.ndarray:
    """Signed (two's complement) view of ring values, 16- or 32-bit; no copy."""
    return values.view(np.int16) if values.dtype == np.uint16 else values.view(np.int32)


def _signed_values(values: np.ndarray, *, scale: float) -> np.ndarray:
    """Signed reading of ring values divided by ``scale`` (float64; one allocation, the result)."""
    out = _signed(values).astype(np.float64)
    out /= scale
    return out


def split_modules(parts: list[np.ndarray], *, layout: Layout) -> list[np.ndarray]:
    """(values, slots) -> one array per module, then the slots (views; the same keystream order)."""
    values, slots = parts
    return [values[off:off + size] for off, size in zip(layout.offsets, layout.sizes, strict=True)] + [slots]


def _modules(total: list[np.ndarray], layout: Layout) -> tuple[list[np.ndarray], np.ndarray]:
    """Per-module arrays and slots of a ring vector given as (values, slots) or per module."""
    if len(total) == len(layout.names) + 1:
        return total[:-1], total[-1]
    return split_modules(total, layout=layout)[:-1], total[-1]


def decode_sum(total: list[np.ndarray], *, layout: Layout, params: MaskingParams,
               contributors: Iterable[str], consume: bool = False) -> ModuleSums:
    """Unmasked ring sum -> per-module sums, weight sums and counts (modules with count 0 omitted).

    ``total`` is (values, slots) or one array per module then the slots. ``consume`` (per-module
    form only): drop each module's ring array from ``total`` once decoded, so the float64 result
    never coexists with the whole ring sum (server memory stays under 3 vectors).
    """
    modules, slots = _modules(total, layout)
    per_module = len(total) == len(layout.names) + 1
    m = len(layout.names)
    weights = fixedpoint.decode(slots[:m], scale=params.weight_scale)
    counts = slots[m:].view(np.int32).astype(np.int64)
    sums, wsum, cnt = {}, {}, {}
    for j, name in enumerate(layout.names):
        if counts[j] > 0:
            sums[name] = _signed_values(modules[j], scale=params.scale)
            wsum[name], cnt[name] = float(weights[j]), int(counts[j])
        if consume and per_module:
            modules[j] = total[j] = None  # type: ignore[call-overload]
    return ModuleSums(sums=sums, weights=wsum, counts=cnt, contributors=tuple(sorted(contributors)))


def check_total(total: list[np.ndarray], *, layout: Layout, params: MaskingParams, plan: RoundPlan,
                survivors: Iterable[str]) -> None:
    """Refuse an unmasked ring sum that no set of plan-abiding survivors can produce.

    Only the sender enforces its own bounds (check_update), and the server never sees one
    vector, so a hospital running the real protocol can put anything into its slots. This
    checks everything the plan lets the server check, per module m with count c_m and weight
    sum W_m (n survivors, fixed-point tolerances of one unit per contributor):

    * counts: 0 <= c_m <= n;
    * weights: c_m = 0 implies W_m = 0; otherwise W_m lies between the sums of the c_m smallest
      and the c_m largest weights the plan publishes for the survivors (``weight/<name>``;
      exactly their sum when c_m = n), or, without published weights, in (0, c_m * weight.max];
    * values: every |sum_i w_i Delta_i| <= c_m * clip (so ||sum||_2 <= c_m * clip * sqrt(|m|)),
      and all zero when c_m = 0.

    What still goes through: any aggregate inside these bounds (SECURITY.md, "Masked-mode poisoning").

    Raises:
        ProtocolError: naming the module and the slot that is out of bounds (never values); the
            round aborts (the server cannot tell from this sum whose vector it was; the round
            loop's group testing, :mod:`clinograph.secure.runtime.attribution`, finds it).
    """
    who = sorted(survivors)
    modules, slots = _modules(total, layout)
    n, m = len(who), len(layout.names)
    weights = fixedpoint.decode(slots[:m], scale=params.weight_scale)
    counts = slots[m:].view(np.int32).astype(np.int64)
    w_tol, v_tol = n / params.weight_scale, n / params.scale
    cap = min(params.max_weight, float(plan.options.get("weight.max", params.max_weight)))
    published = [plan.options.get(f"weight/{c}") for c in who]
    fixed = sorted(float(w) for w in published) if all(isinstance(w, float) for w in published) else None
    problems = []
    for j, (name, size) in enumerate(zip(layout.names, layout.sizes, strict=True)):
        c, w = int(counts[j]), float(weights[j])
        if not 0 <= c <= n:
            problems.append(f"module {name!r}: contributor count slot is {c}, outside [0, {n}] (survivors)")
            continue
        if c == 0:
            lo = hi = 0.0
        elif fixed is not None:
            lo, hi = sum(fixed[:c]), sum(fixed[-c:])
        else:
            lo, hi = 0.0, c * cap
        if c > 0 and w <= w_tol:
            problems.append(f"module {name!r}: weight sum is not positive ({c} contributor(s))")
        elif not lo - w_tol <= w <= hi + w_tol:
            how = "the weights the plan publishes" if fixed is not None and c else "weight.max"
            problems.append(f"module {name!r}: weight sum {w:.6g} is outside [{lo:.6g}, {hi:.6g}] for {c} "
                            f"contributor(s) ({how})")
        seg = _signed(modules[j])
        peak = max(int(seg.max()), -int(seg.min())) / params.scale if size else 0.0  # no P-sized temporary
        if peak > c * params.clip + v_tol:
            problems.append(f"module {name!r}: a summed value exceeds {c} contributor(s) x masked.clip = "
                            f"{c * params.clip:.6g}")
    if problems:
        raise ProtocolError(f"The unmasked aggregate breaks the plan's bounds ({len(problems)} problem(s): "
                            + "; ".join(problems[:8]) + "). A participant put out-of-bound values into its "
                            "masked vector; the round is aborted and nothing is applied or published.")


def round_context(plan: RoundPlan, *parts: str | bytes) -> bytes:
    """Context binding a derivation to this federation and round (and the given parts)."""
    return _round_prefix(plan.federation_id, plan.round) + encode_context(parts)


@functools.lru_cache(maxsize=64)
def _round_prefix(federation_id: str, round_: int) -> bytes:
    """``encode_context([federation_id, round_])``: the fields are length-prefixed one by one, so
    this prefix followed by the encoded parts is the encoding of the whole list."""
    return encode_context([federation_id, round_])


def pair_context(plan: RoundPlan, a: str, b: str) -> bytes:
    """Context of the unordered pair {a, b} (both ends derive the same seed)."""
    lo, hi = sorted((a, b))
    return round_context(plan, lo, hi)


def pairwise_sign(u: str, v: str) -> int:
    """Client u adds PRG(s_uv) if u < v and subtracts it otherwise, so each pair cancels."""
    return 1 if u < v else -1


def open_relayed(plan: RoundPlan, *, client: str, payload: bytes, signature: bytes, key: PublicIdentity,
                 model: type[M], spec_digest: str | None = None) -> M:
    """Open a client message the server relayed as received (``payload`` and ``signature`` of the
    client's own envelope): the signature is verified over those exact bytes under the
    envelope's context and the message's kind, the payload is parsed strictly as ``model`` and
    must name ``client``, this federation and round, the plan's ModelSpec and dictionary
    (``spec_digest``: ``plan.spec.digest()`` if the caller already has it), the global model
    the plan starts from (``global_state_digest``) and the plan itself (``plan_digest``,
    :meth:`RoundPlan.digest`): masked/3, a peer sent another model or plan cannot share a round
    with this hospital.

    This is what makes an envelope signature serve as the protocol's key signature
    (:class:`~.messages.AdvertiseKeys`, Bonawitz et al. 2017 round 0) and consistency signature
    (:class:`~.messages.ConsistencySignature`, round 4): see :mod:`.consistency` for why it is
    the same guarantee as a separate signature.

    Raises:
        IntegrityError: the signature does not verify (forged, altered, another kind or key).
        ProtocolError: the payload does not parse, or names another client, federation, round,
            ModelSpec, dictionary, starting global model or plan.
    """
    kind = kind_of(model)
    if len(signature) != SIGNATURE_BYTES or not _ID.fullmatch(client):  # what an Envelope of them would refuse
        raise ProtocolError(f"Relayed {kind!r} message of {client[:64]!r} is malformed.")
    try:
        if key.name != client:
            raise IntegrityError(f"Relayed message names {client!r} but is checked against {key.name!r}.")
        msg = open_signed(payload, signature, sender=key, model=model)  # verified before it is parsed
    except IntegrityError:
        raise IntegrityError(f"Relayed {kind!r} message of {client!r} does not verify under {client!r}'s key: the "
                             f"server relayed, in a message it signed, something {client!r} did not sign (forged, "
                             "altered or misattributed). Refused; the server's signed message is the evidence."
                             ) from None
    got = (msg.client, msg.federation_id, msg.round, msg.spec_digest, msg.dictionary_hash)  # type: ignore[attr-defined]
    if got != (client, plan.federation_id, plan.round, spec_digest or plan.spec.digest(), plan.dictionary_hash):
        raise ProtocolError(f"Relayed {kind!r} message of {client!r} is for another client, federation, round, "
                            "ModelSpec or dictionary. Refused (replayed or misrouted by the server).")
    if msg.global_state_digest != plan.global_state_digest:  # type: ignore[attr-defined]
        raise ProtocolError(f"Relayed {kind!r} message of {client!r} starts from another global model (digest "
                            f"{msg.global_state_digest[:12]}…) than this hospital's plan for round {plan.round} "  # type: ignore[attr-defined]
                            f"({plan.global_state_digest[:12]}…): the server sent hospitals different models for "
                            "one round. Refused; nothing of this round is revealed (report the server: its signed "
                            "plan and the signed message relaying this one are the evidence).")
    if msg.plan_digest != plan.digest():  # type: ignore[attr-defined]
        raise ProtocolError(f"Relayed {kind!r} message of {client!r} answers another plan (digest "
                            f"{msg.plan_digest[:12]}…) than this hospital's for round {plan.round} "  # type: ignore[attr-defined]
                            f"({plan.digest()[:12]}…): the server sent hospitals different plans for one round "
                            "(participants, min_clients, weights or options). Refused; nothing of this round is "
                            "revealed (report the server: its signed plans are the evidence).")
    return msg


def holders(graph: Mapping[str, frozenset[str]], owner: str) -> tuple[str, ...]:
    """Share holders of ``owner``'s secrets in index order: its neighbours and itself."""
    cached = getattr(graph, "holders", None)  # a NeighbourGraph keeps them
    return cached(owner) if cached is not None else tuple(sorted(graph[owner] | {owner}))


def _share_key(shared_secret: bytes, context: bytes) -> bytes:
    return hkdf(shared_secret, label=KDF_SHARE_ENCRYPTION_DIRECTED, context=context)


def encrypt_share(shared_secret: bytes, *, plan: RoundPlan, sender: str, recipient: str,
                  index: int, b_share: bytes, s_share: bytes) -> bytes:
    """AEAD-encrypt one holder's shares under a key for the direction sender -> recipient."""
    nonce = os.urandom(12)
    ad = round_context(plan, sender, recipient)  # also the key's HKDF context
    body = struct.pack(">H", index) + b_share + s_share
    return nonce + ChaCha20Poly1305(_share_key(shared_secret, ad)).encrypt(nonce, body, ad)


def decrypt_share(shared_secret: bytes, *, plan: RoundPlan, sender: str, recipient: str,
                  ciphertext: bytes) -> tuple[int, bytes, bytes]:
    """Inverse of :func:`encrypt_share`; ProtocolError if it does not authenticate."""
    ad = round_context(plan, sender, recipient)
    try:
        body = ChaCha20Poly1305(_share_key(shared_secret, ad)).decrypt(
            ciphertext[:12], ciphertext[12:], ad)
    except InvalidTag:
        raise ProtocolError(f"Encrypted share from {sender!r} does not authenticate (tampered or misrouted).") from None
    if len(body) != 2 + 2 * SHARE_BYTES:
        raise ProtocolError(f"Encrypted share from {sender!r} holds {len(body)} bytes, not {2 + 2 * SHARE_BYTES}.")
    return struct.unpack(">H", body[:2])[0], body[2:2 + SHARE_BYTES], body[2 + SHARE_BYTES:]


def check_unmask_request(*, me: str, survivors: Iterable[str], dropped: Iterable[str],
                         masked_with: Iterable[str], threshold: int) -> None:
    """Refuse an unmask request that could reveal a live client's update (Bonawitz et al. 2017, 4.2).

    A server that lists one client both as surviving and as dropped would get shares of its
    self-mask seed b *and* of its pairwise key s_sk, i.e. its update in the clear. Also refused:
    lists that omit this client, leave out a neighbour it masked with, or are shorter than t.
    """
    surv, drop = set(survivors), set(dropped)
    both = sorted(surv & drop)
    if both:
        raise ProtocolError(f"Unmask request lists {both} as both surviving and dropped; revealing shares would "
                            "expose their update. Refused (malicious or broken server).")
    if me not in surv:
        raise ProtocolError(f"Unmask request does not list {me!r} itself among survivors. Refused.")
    if len(surv) < threshold:
        raise ProtocolError(f"Unmask request lists {len(surv)} survivor(s), below the threshold {threshold}. Refused.")
    unknown = sorted(set(masked_with) - surv - drop)
    if unknown:
        raise ProtocolError(f"Unmask request lists neighbour(s) {unknown} neither as surviving nor as dropped. "
                            "Refused.")
