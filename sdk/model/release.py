"""An exported model checked against the federation's audit trail: the global part of the
weights is the model the server released, signed by the server.

The hospital's signature (:mod:`.description`) vouches for the whole export; this adds the
server's word for the shared modules. The description's ``release``
(:class:`~.description.ReleaseBinding`) names the federation round whose global model the kept
shared modules hold. :func:`check_release`, given the audit directory and the server's key:

1. verifies the whole trail under that key (:func:`clinograph.secure.audit.verify_audit_dir`:
   hash chain, signatures, artefacts);
2. finds the round's published ``global_model`` artefact of that federation, checks its bytes
   against the digest the trail recorded, and opens it as a :class:`GlobalModel` signed by the
   server;
3. requires that the run that published it released a model (its next ``release`` /
   ``run_ended`` entry is a ``release``);
4. checks every module of the rebuilt model that is not one of the hospital's personal modules
   against it, value for value as float32 (what the hospital loaded), and that the global model
   has each of them -- and that every weight module the server released is one of them (the
   description chooses its personal modules and its architecture: a released module called
   personal, or left out of the model, would escape the check). Only the two-value selection
   statistic ``metric/validation`` is not a weight of the export;
5. requires that the signed plan of that round carried the digest of the description's
   weight-free model settings (:mod:`.settings`: ``deep``, ``negative_slope``, ``value_clip``,
   the survival breaks, ...), which every hospital checked against its own when it trained.

It runs on the parsed tensors (data) before the model computes anything. What it does not
cover: the personal modules, the calibration and ``features_used`` (the hospital's signature
only); federations in a mode where the server never holds the global model (``ckks``,
distributed DP: no published global model, refused with that reason); a stolen server key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
from clinograph.secure.audit import verify_audit_dir
from clinograph.secure.messages import GlobalModel, RoundPlan
from clinograph.secure.wire import open_envelope, parse_envelope
from torch import nn

from clinograph.core.codec import decode_array
from clinograph.core.errors import ClinographError, ConfigError, IntegrityError
from clinograph.core.fileio import read_regular
from clinograph.core.identity import PublicIdentity
from clinograph.core.spec import ModuleKind

from . import settings
from .description import ModelDescription, ReleaseBinding
from .nsfl_modules import SELECTION_MODULE, nsfl_modules

#: bound on the audit log read here (a long federation's log is a few MB)
MAX_LOG_BYTES = 256 * 2**20
M = TypeVar("M")
_FIX = ("Fix: give the audit directory of the federation the model was trained in and the server's public key "
        "([server] public_key in federation.toml, or server.pub), or leave out --audit to rely on the hospital's "
        "signature alone.")


def check_release(description: ModelDescription, model: nn.Module, *, audit_dir: Path, server: PublicIdentity,
                  source: Path) -> int:
    """Check ``model``'s shared modules (built from the weights of ``source``) against the global
    model the server published and released, as recorded in ``audit_dir``. Returns the round.

    Raises:
        ConfigError: ``audit_dir`` is not a directory.
        IntegrityError: the description names no release, the trail does not verify under
            ``server``, has no published global model of that round and federation, or no release
            after it, or a shared module differs from it.
    """
    rel = description.release
    if rel is None:
        raise IntegrityError(f"Model {source}: its description names no federation round (it was not exported from "
                             f"a federation run, or by a hospital that restarted before its next round). {_FIX}")
    if not Path(audit_dir).is_dir():
        raise ConfigError(f"--audit {audit_dir} is not a directory. {_FIX}")
    report = verify_audit_dir(Path(audit_dir), trusted_server_key=server.raw)
    if not report.ok or not report.trusted:
        raise IntegrityError(f"Audit trail {audit_dir} does not verify under the server key "
                             f"{server.fingerprint[:16]}: {'; '.join(report.problems[:5]).rstrip('.') or 'not signed by it'}. "
                             f"The model's release cannot be checked against it. {_FIX}")
    lines = read_regular(Path(audit_dir) / "audit.jsonl", limit=MAX_LOG_BYTES).decode("utf-8").splitlines()
    entries = [json.loads(x) for x in lines if x.strip()]  # verified above: well-formed, chained, signed
    at, glob = _published(Path(audit_dir), entries, rel.federation_id, rel.round, server=server, source=source)
    modules = nsfl_modules(model.model, list(description.features))
    if getattr(model.model, "hazard_baseline", None) is not None:  # survival head, as the task's module map
        modules.add_submodule("head/hazard_baseline", ModuleKind.SHARED, model.model.hazard_baseline)
    shared = [n for n in modules.names(ModuleKind.SHARED) if not _personal(n, rel.personal_modules)]
    # the description chooses its personal modules and its architecture: every weight module the
    # server released must be one of the shared modules checked below (not called personal, not
    # left out of the rebuilt model)
    claimed = sorted(n for n in glob if n not in shared and n != SELECTION_MODULE)
    if claimed:
        raise IntegrityError(f"Model {source}: its description calls personal (or lacks) {len(claimed)} module(s) that "
                             f"the server released for round {rel.round} of {rel.federation_id!r} (e.g. "
                             f"{', '.join(claimed[:5])}), so they cannot be checked against it. These weights are not "
                             "shown to be the federation's model. Fix: use the export the hospital wrote at the end of "
                             "the run, with that run's audit directory.")
    missing = [n for n in shared if n not in glob]
    differ = [n for n in shared if n in glob
              and not np.array_equal(modules.get(n).astype(np.float32), glob[n].astype(np.float32))]
    if missing or differ:
        shown = ", ".join((missing + differ)[:5])
        raise IntegrityError(f"Model {source}: {len(differ)} shared module(s) differ from the global model the server "
                             f"released for round {rel.round} of {rel.federation_id!r}, and {len(missing)} are not in "
                             f"it (e.g. {shown}). These weights are not the federation's model. Fix: use the export "
                             "the hospital wrote at the end of the run, with that run's audit directory.")
    _check_settings(description, rel, Path(audit_dir), _audit_run(entries, at), server=server, source=source)
    return rel.round


def _personal(name: str, personal: tuple[str, ...]) -> bool:
    """``[personal] modules`` semantics (:func:`clinograph.sdk.training.personal.personal_module_map`):
    an exact name, or a prefix ending in ``/``."""
    return any(name == p or (p.endswith("/") and name.startswith(p)) for p in personal)


def _end_of_federation(entries: list[dict], federation_id: str) -> str | None:
    """The kind of the first ``release`` / ``run_ended`` entry of ``federation_id`` among ``entries``
    (the entries after one of its rounds): an entry belongs to the federation of its audit run's
    latest ``manifest``. A candidate's run that early elimination paused goes on in a later audit
    run (``run_resumed``, with its manifest again) after other candidates' runs; their ends are not
    its own."""
    fed: str | None = federation_id  # the entries right after the round are its own run's
    for x in entries:
        kind, payload = x.get("kind"), x.get("payload") or {}
        if kind in ("audit_open", "audit_reopen"):
            fed = None
        elif kind == "manifest":
            fed = payload.get("federation_id")
        elif kind in ("release", "run_ended") and fed == federation_id:
            return str(kind)
    return None


def _audit_run(entries: list[dict], at: int) -> list[dict]:
    """The entries of the audit run (since its ``audit_open`` / ``audit_reopen``) up to index ``at``."""
    start = max((i for i, e in enumerate(entries[:at]) if e.get("kind") in ("audit_open", "audit_reopen")), default=0)
    return entries[start:at]


def _check_settings(description: ModelDescription, rel: ReleaseBinding, audit_dir: Path, entries: list[dict], *,
                    server: PublicIdentity, source: Path) -> None:
    """The weight-free model settings of ``description`` must be the ones every signed plan of
    the released round carried (:mod:`.settings`; ``entries``: the audit run that published the
    released global model, up to it): the weights check alone would pass a description that
    rebuilds the released weights with another forward pass."""
    name, key = f"round-{rel.round:04d}/plan.json", settings.PLAN_OPTION
    carried = [msg.options.get(key) for _, msg in _artefacts(audit_dir, entries, name, kind="round_plan",
                                                          model=RoundPlan, server=server)
               if msg.federation_id == rel.federation_id]
    ours = settings.description_settings_digest(description)
    if carried and all(c == ours for c in carried):
        return
    found = ("the trail holds no signed plan of that round" if not carried else
             "its signed plan names no model settings (a federation run before plans carried them)"
             if any(c is None for c in carried) else
             f"its signed plan names model settings {str(carried[0])[:12]}…")
    raise IntegrityError(f"Model {source}: its description's model settings ([model] deep, negative_slope, "
                         f"value_clip, ... and the survival breaks) digest to {ours[:12]}…, but for round {rel.round} "
                         f"of {rel.federation_id!r} {found}. The same weights compute other risks under other "
                         "settings, so this is not shown to be the federation's model. Fix: use the export the "
                         "hospital wrote at the end of the run (its description unchanged), with that run's audit "
                         "directory.")


def _artefacts(audit_dir: Path, entries: list[dict], name: str, *, kind: str, model: type[M],
               server: PublicIdentity) -> Iterator[tuple[int, M]]:
    """Each published artefact ``name`` of ``kind`` in the verified trail, with its index in
    ``entries``, opened as ``model`` signed by ``server`` (IntegrityError if one is not)."""
    for i, e in enumerate(entries):
        p = e.get("payload") or {}
        if e.get("kind") != "artefact" or p.get("name") != name or p.get("kind") != kind:
            continue
        data = read_regular(audit_dir / "artefacts" / p["sha256"], limit=int(p["size"]))
        if hashlib.sha256(data).hexdigest() != p["sha256"]:
            raise IntegrityError(f"Audit artefact {name} changed after verification. Verify the directory again.")
        try:
            env = parse_envelope(data)  # the key is what is trusted, not the name it is given here
            msg = open_envelope(env, sender=PublicIdentity(env.sender, server.raw), model=model)
        except ClinographError as exc:
            raise IntegrityError(f"Audit artefact {name} is not a {kind} signed by the server "
                                 f"({type(exc).__name__}). {_FIX}") from None
        yield i, msg


def _published(audit_dir: Path, entries: list[dict], federation_id: str, round_: int, *, server: PublicIdentity,
               source: Path) -> tuple[int, dict[str, np.ndarray]]:
    """The global model of ``round_`` of ``federation_id`` that the (verified) trail in
    ``audit_dir`` published, provided a ``release`` follows it, and the index of its entry."""
    name = f"round-{round_:04d}/global_model.json"
    for i, msg in _artefacts(audit_dir, entries, name, kind="global_model", model=GlobalModel, server=server):
        if msg.federation_id != federation_id:
            continue
        try:
            out = {t.name: decode_array(t.data, dtype=t.dtype, length=msg.spec.module(t.name).size,
                                        what=f"module {t.name!r}") for t in msg.modules}
        except (ClinographError, KeyError) as exc:
            raise IntegrityError(f"Audit artefact {name} is not a global model signed by the server "
                                 f"({type(exc).__name__}). {_FIX}") from None
        if _end_of_federation(entries[i + 1:], federation_id) != "release":  # its run ended with its release
            raise IntegrityError(f"Model {source}: the audit trail published round {round_} of {federation_id!r} but "
                                 "records no release after it (the run did not end). Export the model the run "
                                 "released.")
        return i, out
    raise IntegrityError(f"Model {source}: the audit trail {audit_dir} publishes no global model for round {round_} of "
                         f"federation {federation_id!r} (another federation's trail, or a mode where the server never "
                         f"holds the global model: ckks, distributed DP). {_FIX}")
