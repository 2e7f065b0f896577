"""Hospital half of the ``ckks`` mode.

Stage 1 (:meth:`CkksClient.first_message`): encrypt the full slot vector of :mod:`.layout`
(every shared module, zeros where not trained, weight/count/tag slots) with the federation's
secret key -- seeded symmetric CKKS -- and send it signed.
Stage 2 (:meth:`CkksClient.handle`): verify the server's signed aggregate, decrypt it, check
the contributor tags and ``plan.min_clients``, and keep the :class:`ModuleSums` for
:meth:`CkksClient.decrypted_result` (the mean is Σ w_i Δ_i / Σ w_i, taken after decryption).

Constructing: the base constructor's signature is fixed, so the keyring is an extra required
keyword: ``CkksClient(keyring=ring, plan=..., identity=..., server=..., peers=..., update=...)``
or, where a factory with the base signature is needed, ``CkksClient.with_keyring(ring)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from clinograph.core.errors import ConfigError, ProtocolError

from ..aggregation.base import AggregationClient, ModuleSums
from ..wire import open_envelope, parse_envelope, seal
from .keys import CkksKeyring, check_plan_options
from .layout import SlotLayout
from .messages import CkksAggregate, CkksUpdate


class CkksClient(AggregationClient):
    """Encrypts this hospital's update; decrypts and checks the aggregate."""

    mode = "ckks"

    def __init__(self, *, keyring: CkksKeyring | None = None, **kw: Any):
        super().__init__(**kw)
        if keyring is None:
            raise ConfigError("CkksClient needs the hospital's CKKS keyring: build it with "
                              "CkksClient.with_keyring(keyring)(plan=..., ...) or CkksClient(keyring=..., ...). "
                              "Get a keyring from the key ceremony (CkksKeyring.unwrap).")
        check_plan_options(self.plan.options, preset=keyring.preset.value, digest=keyring.context_digest,
                           who=f"hospital {self.identity.name!r}")
        if keyring.federation_id != self.plan.federation_id:
            raise ConfigError(f"CKKS keyring is for federation {keyring.federation_id!r}, the plan for "
                              f"{self.plan.federation_id!r}.")
        self._keyring = keyring
        self._layout = SlotLayout.from_plan(self.plan)
        self._result: ModuleSums | None = None

    @classmethod
    def with_keyring(cls, keyring: CkksKeyring) -> Callable[..., CkksClient]:
        """A factory with the base constructor's signature, bound to ``keyring``."""
        return functools.partial(cls, keyring=keyring)

    def first_message(self) -> bytes:
        """Seal the encrypted slot vector. Raises ConfigError if a value could make the
        aggregate overflow the preset's range (the mean is unchanged by scaling every weight
        down, e.g. weight = samples / 1000)."""
        me = self.identity.name
        if me not in self.plan.participants:
            raise ProtocolError(f"{me!r} is not a participant of round {self.plan.round}.")
        try:
            vec = self._layout.pack(self.update, client=me,
                                    tag=self._keyring.contributor_tag(round_=self.plan.round, client=me))
        except ValueError as exc:
            raise ConfigError(f"Update of {me!r} does not fit the plan: {exc}.") from None
        if not np.all(np.isfinite(vec)):
            raise ConfigError(f"Update of {me!r} contains NaN or infinity; nothing was sent.")
        bound = self._keyring.preset.max_abs_sum / len(self.plan.participants)
        if float(np.max(np.abs(vec[:self._layout.tag_offset]), initial=0.0)) > bound:
            raise ConfigError(f"Update of {me!r} exceeds the per-hospital bound {bound:.4g} of CKKS preset "
                              f"{self._keyring.preset.value} ({len(self.plan.participants)} participants, aggregate "
                              f"slots must stay below {self._keyring.preset.max_abs_sum:.4g}). Scale every weight "
                              "down by the same factor (the mean is unchanged), e.g. weight = samples / 1000.")
        msg = CkksUpdate(federation_id=self.plan.federation_id, round=self.plan.round, client=me,
                         spec_digest=self.plan.spec.digest(), dictionary_hash=self.plan.dictionary_hash,
                         context_digest=self._keyring.context_digest,
                         ciphertexts=tuple(self._keyring.context.encrypt(vec)))
        return seal(msg, self.identity)

    def handle(self, data: bytes) -> bytes | None:
        """Verify, decrypt and check the server's aggregate; nothing to send back.

        Raises:
            IntegrityError: bad server signature, or the decrypted tags/counts show tampering
                (see :meth:`.layout.SlotLayout.unpack`).
            ProtocolError: wrong stage/round/context, malformed ciphertexts, or the
                aggregate covers fewer than ``plan.min_clients`` hospitals.
        """
        msg = open_envelope(parse_envelope(data), sender=self.server, model=CkksAggregate)
        plan = self.plan
        if msg.federation_id != plan.federation_id or msg.round != plan.round:
            raise ProtocolError(f"CKKS aggregate is for federation {msg.federation_id!r} round {msg.round}; "
                                f"this is {plan.federation_id!r} round {plan.round}.")
        if msg.spec_digest != plan.spec.digest() or msg.context_digest != self._keyring.context_digest:
            raise ProtocolError("CKKS aggregate is for a different ModelSpec or CKKS context than this round's.")
        expected = self._layout.ciphertext_count(self._keyring.preset.params.slot_count)
        if len(msg.ciphertexts) != expected:
            raise ProtocolError(f"CKKS aggregate has {len(msg.ciphertexts)} ciphertexts; this plan needs {expected}.")
        cts = []
        for i, raw in enumerate(msg.ciphertexts):
            try:
                cts.append(self._keyring.context.load_ciphertext(raw))
            except ValueError as exc:
                raise ProtocolError(f"CKKS aggregate ciphertext {i} does not load under this round's context: "
                                    f"{exc}.") from None
        vec = self._keyring.context.decrypt(cts, self._layout.length)
        sums = self._layout.unpack(vec, claimed=msg.contributors, tag_of=self._tag)
        if len(sums.contributors) < plan.min_clients:
            raise ProtocolError(f"CKKS aggregate covers {len(sums.contributors)} hospital(s); the plan needs at least "
                                f"{plan.min_clients}. Refused: a smaller aggregate could expose one hospital's update.")
        self._result = sums
        return None

    def _tag(self, client: str) -> float:
        return self._keyring.contributor_tag(round_=self.plan.round, client=client)

    def decrypted_result(self) -> ModuleSums:
        """The decrypted, checked per-module sums. Raises ProtocolError before stage 2."""
        if self._result is None:
            raise ProtocolError("No CKKS aggregate has been decrypted yet in this round "
                                "(the server's aggregate message was not handled or was refused).")
        return self._result


__all__ = ["CkksClient"]
