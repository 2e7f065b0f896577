"""The CKKS key ceremony, relayed by the server over any transport (in-process or Flower).

One hospital (the first participant by name) deals: it generates the CKKS secret context and
returns the *public* context, sealed; every other hospital sends a signed request carrying a
fresh X25519 key; the dealer wraps the key bundle to each request; each recipient unwraps.
The server relays sealed bytes it cannot open and keeps only the public context, which it
checks against the dealer's enrolled key. Hospitals that fail a step are left out, and the
run goes on with those that hold the key (at least ``min_holders``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from clinograph.core.errors import ProtocolError
from clinograph.core.identity import PublicIdentity

from .keys import CkksServerContext
from .presets import CkksPreset

if TYPE_CHECKING:  # the runtime builds this mode; only the annotation needs its transport
    from ..runtime.transport import Transport


def run_ckks_ceremony(transport: Transport, *, federation_id: str, participants: tuple[str, ...],
                      enrolled: Mapping[str, PublicIdentity], preset: CkksPreset,
                      min_holders: int) -> tuple[CkksServerContext, tuple[str, ...]]:
    """Run the ceremony; return the server's key-less context and the hospitals holding the key.

    Raises:
        ProtocolError: the dealer failed, or fewer than ``min_holders`` hospitals hold the key.
    """
    names = tuple(sorted(participants))
    if not names:
        raise ProtocolError("The CKKS key ceremony needs at least one hospital.")
    dealer, others = names[0], names[1:]
    fid = federation_id.encode()
    deal, failed = transport.exchange("setup", {dealer: {"step": b"ckks/deal", "federation": fid,
                                                          "preset": preset.value.encode()}}, round_=0)
    if dealer in failed or "context" not in deal.get(dealer, {}):
        raise ProtocolError(f"CKKS key ceremony: the dealer {dealer!r} did not deal: "
                            f"{failed.get(dealer, 'no context returned')[:300]}")
    context = CkksServerContext.load(data=deal[dealer]["context"], dealer=enrolled[dealer], federation_id=federation_id)
    requests, _ = transport.exchange("setup", {n: {"step": b"ckks/request", "federation": fid} for n in others},
                                     round_=0)
    asked = {f"request/{n}": a["request"] for n, a in requests.items() if "request" in a}
    packages: dict[str, bytes] = {}
    if asked:
        wrapped, failed = transport.exchange("setup", {dealer: {"step": b"ckks/wrap", **asked}}, round_=0)
        if dealer in failed:
            raise ProtocolError(f"CKKS key ceremony: the dealer {dealer!r} did not wrap keys: {failed[dealer][:300]}")
        packages = {k.removeprefix("package/"): v for k, v in wrapped.get(dealer, {}).items()}
    done, _ = transport.exchange("setup", {n: {"step": b"ckks/unwrap", "package": p, "dealer": dealer.encode()}
                                           for n, p in sorted(packages.items())}, round_=0)
    holders = tuple(sorted({dealer, *done}))
    if len(holders) < min_holders:
        raise ProtocolError(f"CKKS key ceremony: only {len(holders)} hospital(s) hold the key ({', '.join(holders)}); "
                            f"the federation needs {min_holders}.")
    return context, holders
