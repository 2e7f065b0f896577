"""The ``ckks_threshold`` mode's set-up, how a hospital joins a round, and the report's account.

- **Set-up**: collective key generation relayed over the run's transport
  (:func:`.threshold_relayed.run_threshold_keygen` with ``distribute=True``): every reachable
  enrolled hospital makes a secret share, the server sums the public shares, every holder
  rebuilds and confirms the collective key; then every holder re-shares its key share t-of-N
  (:mod:`.threshold_reshare`), t = ``[federation] tckks_threshold`` or N (N-of-N). The run goes
  on with the holders; audited as ``tckks_key_holders`` (rule, t, each holder's Shamir index).
- **Plan options**: the preset and the collective key's digest.
- **Joining**: the hospital's :class:`~.threshold_client.ThresholdClient` over the share its key
  holder (:attr:`.holder.CkksKeyHolder.threshold`) made at set-up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clinograph.core.errors import ConfigError, ProtocolError

from ..aggregation import AggregationClient, LocalUpdate, ModeRun


def prepare_threshold(*, federation: Any, transport: Any, run_id: str, enrolled: Mapping[str, Any],
                      max_weight: float, context: object | None,
                      on_event: Callable[[str, Mapping[str, Any]], None]) -> ModeRun:
    """Collective key generation over ``transport`` (or the ``context`` a caller made), then the
    server's key-bound factory."""
    from .threshold import CollectivePublicKey, ThresholdPreset
    from .threshold_client import OPTION_DIGEST, OPTION_PRESET, OPTION_THRESHOLD
    from .threshold_relayed import run_threshold_keygen
    from .threshold_server import ThresholdServer

    preset = ThresholdPreset.THRESHOLD_128
    if context is None:
        if transport is None:
            raise ConfigError("secure_mode = 'ckks_threshold' generates its key over the run's transport "
                              "(clinograph.secure.runtime.assemble.ServerSide does); none was given.")
        names = tuple(sorted(set(transport.hospitals()) & set(enrolled)))
        if len(names) > preset.max_parties:
            raise ConfigError(f"secure_mode = 'ckks_threshold' takes at most {preset.max_parties} hospitals (the "
                              f"smudging bound of {preset.value}); {len(names)} are enrolled and reachable.")
        if len(names) < 2:
            raise ConfigError(f"secure_mode = 'ckks_threshold' needs at least 2 enrolled, reachable hospitals (a sum "
                              f"of one is that hospital's update); {len(names)} answered.")
        threshold = getattr(federation, "tckks_threshold", None)
        if threshold is not None and threshold > len(names):
            raise ConfigError(f"[federation] tckks_threshold = {threshold} exceeds the {len(names)} enrolled, reachable "
                              "hospitals (the key holders). Lower it, or enrol more hospitals.")
        # every run re-shares: the holders' zero-sharing masks and per-member Shamir shares are what let
        # them open a sum of own-key encryptions (.threshold_sum); N-of-N is t = N
        threshold = threshold or len(names)
        context, _ = run_threshold_keygen(transport, federation_id=run_id, participants=names, enrolled=enrolled,
                                          preset=preset, min_holders=min(federation.min_clients, len(names)),
                                          distribute=True, min_contributors=max(2, min(federation.min_clients, len(names))),
                                          threshold=threshold)
    if not isinstance(context, CollectivePublicKey):
        raise ConfigError("secure_mode = 'ckks_threshold' needs the collective public key of its set-up "
                          "(a CollectivePublicKey).")
    holders = context.holders
    on_event("tckks_keys", {"holders": list(holders)})
    options: dict[str, float | int | str | bool] = {OPTION_PRESET: preset.value, OPTION_DIGEST: context.digest}
    held: dict[str, Any] = {"holders": list(holders), "preset": preset.value, "public_key_digest": context.digest,
                            "rule": context.rule}
    if context.threshold is not None:
        options[OPTION_THRESHOLD] = context.threshold
        held.update(threshold=context.threshold, share_index={h: i + 1 for i, h in enumerate(holders)})
    audit = (("tckks_key_holders", held),)
    return ModeRun(server=ThresholdServer.with_key(context), options=lambda participants: dict(options),
                   hospitals=holders, audit=audit)


def join_threshold(*, plan: Any, identity: Any, server: Any, peers: Mapping[str, Any], update: LocalUpdate,
                   keys: Any) -> AggregationClient:
    """The hospital's threshold client over the share its key holder made at set-up."""
    from .threshold_client import ThresholdClient

    holder = getattr(keys, "threshold", None)
    if holder is None:
        raise ProtocolError(f"Hospital {identity.name!r} holds no threshold CKKS key share.")
    return ThresholdClient(holder=holder, plan=plan, identity=identity, server=server, peers=peers, update=update)


def describe_threshold(options: Mapping[str, Any], kinds: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[
        str, list[tuple[str, object]]]:
    """(paragraph, rows): who holds which share, the rule (N-of-N or t-of-N), who decrypted each
    round, and that no single party holds the key."""
    aggregates = kinds.get("aggregate", ())
    used = sorted({c for a in aggregates for c in a["contributors"]})
    entries = kinds.get("tckks_key_holders") or ()
    keys = entries[-1] if entries else None
    t = keys.get("threshold") if keys else None
    if keys and t is not None:
        index = keys.get("share_index", {})
        holders = ", ".join(f"{h} (index {index.get(h, '?')})" for h in keys["holders"])
        held = (f"{holders} -- each keeps its own key share s_i, which encrypts its own updates, and holds one "
                f"Shamir share (degree {t - 1}) of every holder's s_i, dealt at this run's set-up")
        whole = (f"no one: the key exists nowhere; any {t} of the {len(keys['holders'])} holders open a sum together "
                 f"({keys['rule']}), {t - 1} or fewer learn nothing about another holder's key share")
    else:
        held = (f"{', '.join(keys['holders'])} -- one share s_i each, made at this run's set-up" if keys
                else "not recorded in this run")
        whole = "no one: the key s = sum of the shares exists nowhere; decrypting needs every holder's share (N-of-N)"
    rounds = "; ".join(f"round {a['round']}: {', '.join(a['decrypted_by'])}" for a in aggregates if a.get("decrypted_by"))
    rows: list[tuple[str, object]] = [
        ("preset", options.get("tckks.preset", keys["preset"] if keys else "?")),
        ("collective public key digest", options.get("tckks.public_key_digest",
                                                     keys["public_key_digest"] if keys else "?")),
        ("rule", keys["rule"] if keys else "?"),
        ("who holds a share of the secret key", held),
        ("who holds the whole secret key", whole),
        ("the server", "holds the public key-generation shares only; it adds the hospitals' ciphertexts, combines the "
                       "holders' decryption shares and learns the round's sum, never an update: each holder opens only "
                       "the sum of the signed commitment set it encrypted for, of at least the minimum size"),
        ("key holders whose shares opened each round", rounds or "none yet"),
        ("hospitals whose updates were summed", ", ".join(used) or "none yet"),
        ("minimum hospitals a round", options.get("min_clients", "?"))]
    return ("Threshold CKKS: each hospital encrypts under its own share of a key that exists nowhere; the server "
            "adds ciphertexts and opens only the checked sum with the holders' decryption shares."), rows
