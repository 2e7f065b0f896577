"""The slot vector every hospital encrypts, derived from the plan alone (same on every side).

Layout (M shared modules in ``plan.spec`` order, n participants in ``plan.participants``
order)::

    [ module_1 ... module_M | weight_1 ... weight_M | count_1 ... count_M | tag_1 ... tag_n ]

A hospital writes ``w·Δ`` for the modules it trained (zeros elsewhere), ``w`` and ``1`` in
their weight and count slots, and its *contributor tag* ``t_i`` (a per-round value in
[1024, 2048) keyed by a secret only hospitals hold) in its own tag slot. After decryption
the sum gives, per module, Σ w_i Δ_i, Σ w_i and the count (F-CMs 4.2.3: each module over its
contributors), and the tag slots show exactly who was added, once: a slot holding 0 means
absent, ``t_j`` means present, anything else (``2·t_j`` from a ciphertext added twice, an
integer multiple, a plaintext the server added) means the aggregate was tampered with.
The server cannot make a tag slot read ``t_j`` for a hospital whose ciphertext it did not
add without guessing ``t_j`` to within :data:`TAG_TOLERANCE` (probability ~2e-8 per try).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from clinograph.core.errors import IntegrityError

from ..aggregation.base import LocalUpdate, ModuleSums
from ..messages import RoundPlan

TAG_TOLERANCE = 1e-5
COUNT_TOLERANCE = 1e-3


@dataclass(frozen=True)
class SlotLayout:
    """Offsets of every part of the slot vector for one plan."""

    modules: tuple[tuple[str, int, int], ...]  # (name, offset, size)
    participants: tuple[str, ...]
    weight_offset: int
    count_offset: int
    tag_offset: int
    length: int

    @classmethod
    def from_plan(cls, plan: RoundPlan) -> SlotLayout:
        """The layout for ``plan`` (shared modules only; personal modules never leave)."""
        mods, off = [], 0
        for m in plan.spec.shared:
            mods.append((m.name, off, m.size))
            off += m.size
        n_mod = len(mods)
        return cls(modules=tuple(mods), participants=tuple(plan.participants), weight_offset=off,
                   count_offset=off + n_mod, tag_offset=off + 2 * n_mod,
                   length=off + 2 * n_mod + len(plan.participants))

    def ciphertext_count(self, slot_count: int) -> int:
        """Ciphertexts needed at ``slot_count`` slots each."""
        return -(-self.length // slot_count)

    def pack(self, update: LocalUpdate, *, client: str, tag: float) -> np.ndarray:
        """The vector ``client`` encrypts. ``update.modules`` must be a subset of the shared
        modules with the right sizes (ValueError otherwise, naming the module)."""
        vec = np.zeros(self.length, dtype=np.float64)
        index = {name: (i, off, size) for i, (name, off, size) in enumerate(self.modules)}
        for name, values in update.modules.items():
            if name not in index:
                raise ValueError(f"module {name!r} is not a shared module of the plan's ModelSpec")
            i, off, size = index[name]
            flat = np.asarray(values, dtype=np.float64).reshape(-1)
            if flat.size != size:
                raise ValueError(f"module {name!r} has {flat.size} values, the ModelSpec says {size}")
            vec[off:off + size] = flat
            vec[self.weight_offset + i] = float(update.weight)
            vec[self.count_offset + i] = 1.0
        vec[self.tag_offset + self.participants.index(client)] = tag
        return vec

    def unpack(self, vec: np.ndarray, *, claimed: tuple[str, ...],
               tag_of: Callable[[str], float]) -> ModuleSums:
        """Check the tag slots against the server's claimed contributors, then split the
        decrypted sum into :class:`ModuleSums`.

        Raises:
            IntegrityError: a tag slot holds neither 0 nor that hospital's tag, the decrypted
                contributors differ from ``claimed``, or a count slot is not a whole number in
                [0, contributors].
        """
        present = []
        for j, name in enumerate(self.participants):
            v = float(vec[self.tag_offset + j])
            if abs(v) < TAG_TOLERANCE:
                continue
            if abs(v - tag_of(name)) >= TAG_TOLERANCE:
                raise IntegrityError(f"CKKS aggregate: the contributor slot of {name!r} holds neither 0 nor its tag "
                                     "(a ciphertext added twice or scaled, or a value added by the server). "
                                     "Aggregate refused; report the server.")
            present.append(name)
        if sorted(present) != sorted(claimed):
            raise IntegrityError(f"CKKS aggregate: the server claims {len(claimed)} contributor(s) "
                                 f"{sorted(claimed)} but the decrypted tags show {len(present)}: {sorted(present)}. "
                                 "Aggregate refused; report the server.")
        sums: dict[str, np.ndarray] = {}
        weights: dict[str, float] = {}
        counts: dict[str, int] = {}
        for i, (name, off, size) in enumerate(self.modules):
            c = float(vec[self.count_offset + i])
            k = int(round(c))
            if abs(c - k) > COUNT_TOLERANCE or not 0 <= k <= len(present):
                raise IntegrityError(f"CKKS aggregate: the count slot of module {name!r} is not a whole number "
                                     f"between 0 and {len(present)}. Aggregate refused; report the server.")
            if k == 0:
                continue
            sums[name] = vec[off:off + size].copy()
            weights[name] = float(vec[self.weight_offset + i])
            counts[name] = k
        return ModuleSums(sums=sums, weights=weights, counts=counts, contributors=tuple(sorted(present)))
