"""The whole CKKS key ceremony in one process -- for simulations, tests and benchmarks.

In a deployment every hospital runs its own part on its own machine (the dealer
:meth:`CkksKeyDealer.wrap_for`, the others :meth:`CkksKeyring.unwrap`) and the server only
ever receives :meth:`CkksKeyDealer.public_context`. This helper runs all parts where all
parties share a process; it adds no capability the parts do not have.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from clinograph.core.identity import Identity

from .keys import CkksKeyDealer, CkksKeyring, CkksRecipientKey, CkksServerContext
from .presets import CkksPreset


@dataclass(frozen=True, repr=False)
class InProcessCeremony:
    """Each hospital's keyring and the server's key-less context."""

    keyrings: Mapping[str, CkksKeyring]
    context: CkksServerContext
    dealer: CkksKeyDealer

    def __repr__(self) -> str:
        return f"InProcessCeremony(hospitals={sorted(self.keyrings)}, keys=<redacted>)"


def in_process_ceremony(*, identities: Mapping[str, Identity], dealer: str, federation_id: str,
                        preset: CkksPreset) -> InProcessCeremony:
    """``dealer`` generates the key and wraps it for every other hospital in ``identities``."""
    deal = CkksKeyDealer.create(preset=preset, identity=identities[dealer], federation_id=federation_id)
    rings = {dealer: deal.keyring()}
    for name, ident in identities.items():
        if name == dealer:
            continue
        rk = CkksRecipientKey.generate(identity=ident, federation_id=federation_id)
        pkg = deal.wrap_for(request=rk.request(), requester=ident.public)
        rings[name] = CkksKeyring.unwrap(package=pkg, recipient_key=rk, dealer=identities[dealer].public)
    ctx = CkksServerContext.load(data=deal.public_context(), dealer=identities[dealer].public,
                                 federation_id=federation_id)
    return InProcessCeremony(keyrings=rings, context=ctx, dealer=deal)
