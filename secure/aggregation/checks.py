"""Boundary checks every mode applies to a client's message before using it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..codec import decode_array
from ..errors import ProtocolError
from ..messages import ModuleTensor, RoundPlan
from ..spec import ModuleKind


def check_header(plan: RoundPlan, *, sender: str, federation_id: str, round_: int,
                 spec_digest: str | None = None, dictionary_hash: str | None = None) -> None:
    """Refuse a message from another federation, round, model version or dictionary."""
    if sender not in plan.participants:
        raise ProtocolError(f"{sender!r} is not a participant of round {plan.round}.")
    if federation_id != plan.federation_id:
        raise ProtocolError(f"Message is for federation {federation_id!r}, this is {plan.federation_id!r}.")
    if round_ != plan.round:
        raise ProtocolError(f"Out-of-round message: it is for round {round_}, the current round is {plan.round}.")
    if spec_digest is not None and spec_digest != plan.spec.digest():
        raise ProtocolError(f"Message is for a different ModelSpec (digest {spec_digest[:12]}…), "
                            f"the plan uses v{plan.spec.version} ({plan.spec.digest()[:12]}…).")
    if dictionary_hash is not None and dictionary_hash != plan.dictionary_hash:
        raise ProtocolError(f"Wrong feature dictionary: message has {dictionary_hash[:12]}…, the federation "
                            f"uses {plan.dictionary_hash[:12]}…. Update the hospital's dictionary.")


def decode_modules(plan: RoundPlan, modules: Sequence[ModuleTensor], *, sender: str) -> dict[str, np.ndarray]:
    """Decode module tensors, refusing unknown, personal, repeated or wrongly sized modules."""
    out: dict[str, np.ndarray] = {}
    for t in modules:
        try:
            spec = plan.spec.module(t.name)
        except KeyError as exc:
            raise ProtocolError(f"{sender!r} sent {exc.args[0]}") from None
        if spec.kind != ModuleKind.SHARED:
            raise ProtocolError(f"{sender!r} sent personal module {t.name!r}; personal modules never leave a hospital.")
        if t.name in out:
            raise ProtocolError(f"{sender!r} sent module {t.name!r} twice.")
        out[t.name] = decode_array(t.data, dtype=t.dtype, length=spec.size, what=f"module {t.name!r} from {sender!r}")
    return out


def encode_modules(modules: Mapping[str, np.ndarray], dtype: str = "<f4") -> tuple[ModuleTensor, ...]:
    """Module vectors as wire tensors, in name order."""
    from ..codec import encode_array

    return tuple(ModuleTensor(name=n, dtype=dtype, data=encode_array(v, dtype)) for n, v in sorted(modules.items()))
