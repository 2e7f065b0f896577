"""HospitalClient: the one hospital side of a round, over any task and any secure mode.

On a plan it verifies the server's signature, the dictionary and the model version, loads the
global shared modules, lets its :class:`~clinograph.sdk.federation.task.Task` train, and hands
*only* the deltas of the shared modules the task trained to the plan's secure-aggregation mode.
Personal modules never leave: they are not in any outgoing message (tested). What else leaves
is the hospital's :class:`~clinograph.sdk.config.ReleaseSection`, nothing more.

Deltas follow NS-FL's sign convention everywhere: Δ = θ_global − θ_local (eq. 7); the server's
strategy subtracts the weighted mean. Weight: the task's training-sample count, capped at the
plan's public bound ``weight.max``, unless the strategy fixed a weight in the plan.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from clinograph.secure.aggregation import AggregationClient, LocalUpdate, ModuleSums, create_mode
from clinograph.secure.aggregation.checks import decode_modules
from clinograph.secure.ckks.holder import CkksKeyHolder
from clinograph.secure.messages import ClientReport, GlobalModel, RoundPlan
from clinograph.secure.policy import InsecureOptionWarning
from clinograph.secure.runtime.models import RunFinish, RunStart
from clinograph.secure.runtime.participant import part
from clinograph.secure.runtime.selection import STATUS_PART, SelectionStatus
from clinograph.secure.state import UNKNOWN_STATE, state_digest
from clinograph.secure.strategies import Strategy, create_strategy, reads_sum_at_server
from clinograph.secure.wire import open_envelope, parse_envelope, seal

from clinograph.core.errors import ConfigError, IntegrityError, ProtocolError
from clinograph.core.identity import Identity, PublicIdentity
from clinograph.core.spec import ModelSpec, ModuleKind

from ..config import ReleaseSection
from ..model.settings import check_plan_settings
from ..training.trainer import TrainOutcome
from .anchor import HospitalAnchor, RefusalOmitted
from .task import Task


class HospitalClient:
    """One hospital in a federation (a :class:`clinograph.secure.runtime.RoundParticipant`)."""

    def __init__(self, *, task: Task, identity: Identity, server: PublicIdentity,
                 peers: Mapping[str, PublicIdentity], dictionary_hash: str, federation_id: str,
                 release: ReleaseSection, state_dir: Path | None = None):
        """``state_dir``: where the hospital keeps its audit anchor and last global model
        (:mod:`.anchor`); with it, a restarted hospital resumes where it stopped and refuses a
        rolled-back server, and after every round it writes the model it would keep so far
        (selected on validation, calibrated; safetensors weights + a description signed with its
        identity) to :attr:`model_path`, ready
        for ``clinograph predict`` without the federation. None: nothing is kept (in-memory
        replay guard only)."""
        self.name = identity.name
        self.task = task
        self.identity = identity
        self.server = server
        self.peers = dict(peers)
        self.federation_id = federation_id
        self.dictionary_hash = dictionary_hash
        self.release = release
        if release.insecure_accept_plaintext:
            warnings.warn("[release] insecure_accept_plaintext is set: this hospital joins rounds the server plans "
                          "under insecure_plaintext, where the server sees its contribution in the clear "
                          "(development only).", InsecureOptionWarning, stacklevel=2)
        self.ckks = CkksKeyHolder(identity=identity, peers=self.peers, federation_id=federation_id,
                                  tckks_threshold=release.tckks_threshold)
        self.plan: RoundPlan | None = None  # the last plan this hospital verified and trained on
        # the plan being answered once it extends the anchored history: (federation, round, its digest,
        # the digests of earlier refusals its refusal would name as left out of the log)
        self._checked_plan: tuple[str, int, str, tuple[str, ...]] | None = None
        self.last: TrainOutcome | None = None
        self.last_train_seconds = 0.0
        self._mode_client: AggregationClient | None = None
        self._strategy: tuple[tuple, Strategy] | None = None
        self._global: dict[str, np.ndarray] = task.modules.state(ModuleKind.SHARED)
        self.outgoing: list[bytes] = []  # every byte this hospital sent (for audits and tests)
        self.finished = False  # run/finish ran: the task holds the kept, calibrated model
        self._run_first: int | None = None  # the run.first_round of the run this hospital follows
        self._trained: dict[str, int] = {}  # federation id -> last round this hospital trained for
        self._loaded_round: int | None = None  # GlobalModel.round of the last global model on_round_end loaded
        #: a catch-up model loaded but not yet vouched for by a plan: what to put back if the plan is refused
        self._caught_up: tuple[dict[str, np.ndarray], int | None, object] | None = None
        self._applied: tuple[str, int] | None = None  # (federation, round) of the last decrypted aggregate applied
        self.anchor = HospitalAnchor(state_dir, server=server) if state_dir is not None else None
        self.model_path = (Path(state_dir) / "models" / f"{federation_id}.safetensors"
                           if state_dir is not None and getattr(task, "exportable", False) else None)
        if self.anchor is not None:
            self._resume(federation_id)

    def __repr__(self) -> str:
        return f"HospitalClient(name={self.name!r}, task={self.task.name!r})"

    # -- RoundParticipant ------------------------------------------------------------------
    def on_setup(self, step: str, parts: Mapping[str, bytes]) -> dict[str, bytes]:
        """Set-up steps: the CKKS key ceremony before the first round; ``run/finish`` after the last."""
        if step == "run/finish":
            return self._finish(parts)
        if step == "run/start":
            return self._start(parts)
        return self.ckks.on_setup(step, parts)

    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        self._checked_plan = None
        try:
            p = self._verify_plan(plan)
        except BaseException:
            self._settle_catch_up(accepted=False)
            raise
        return self._train(plan, p)

    def _verify_plan(self, plan: bytes) -> RoundPlan:
        """The plan, opened and checked: the anchor (rollback, logged refusals), freshness, and
        :meth:`_check_plan` (the model digest among them). Raises the refusal."""
        envelope = parse_envelope(plan)
        p = open_envelope(envelope, sender=self.server, model=RoundPlan)
        if self.anchor is not None:
            try:
                self.anchor.check(p)  # a rolled-back server (older audit head) is refused first, by name
            except RefusalOmitted as exc:  # the plan extends the history; its refusal names the missing ones
                self._checked_plan = (p.federation_id, p.round, envelope.digest(), exc.owed)
                raise
            self._checked_plan = (p.federation_id, p.round, envelope.digest(), ())
        self._check_fresh(p)
        if self._caught_up is not None and not create_mode(p.secure_mode).server_sees_sum:
            raise ProtocolError(f"Plan for round {p.round} under secure_mode {p.secure_mode!r}, where the server holds "
                                "no model, came with a model of the server's to load. Refused; nothing was trained "
                                "or loaded.")
        if self._loaded_round is not None and self._loaded_round > p.round:
            raise ProtocolError(f"Plan for round {p.round}: the global model this hospital was sent is numbered as "
                                f"published after round {self._loaded_round - 1}, which is not before this plan's "
                                "round (a model of a round that has not closed). Refused; nothing was trained.")
        self._check_plan(p)
        return p

    def _train(self, plan: bytes, p: RoundPlan) -> tuple[bytes, bytes]:
        """Train for the verified plan ``p`` and answer it (report, the secure mode's first message)."""
        self._trained[p.federation_id] = p.round  # before training: a failed round is not retried either
        if self.anchor is not None:
            self.anchor.keep(p, plan)  # write-ahead: survives this hospital's restart
        self._settle_catch_up(accepted=True, federation_id=p.federation_id)
        self.plan = p
        modules = self.task.modules
        modules.load(self._global)
        self._follow_run(p)
        t0 = time.perf_counter()
        outcome = self.task.train(round_=p.round, epochs=p.local_epochs, plan_options=dict(p.options))
        self.last_train_seconds = time.perf_counter() - t0
        self.last = outcome
        weight = self._weight(p)
        deltas = {n: weight * (self._global[n] - modules.get(n)) for n in self.task.trained_modules(outcome)}
        metrics = self._released_metrics()
        update = LocalUpdate(modules=deltas, weight=weight, metrics=metrics)
        self._mode_client = create_mode(p.secure_mode).make_client(plan=p, identity=self.identity, server=self.server,
                                                                   peers=self.peers, update=update, keys=self.ckks)
        relevance = self.task.feature_relevance() if self.release.feature_relevance else None
        report = ClientReport(federation_id=p.federation_id, round=p.round, client=self.name,
                              dictionary_hash=self.dictionary_hash, ledger=outcome.ledger, metrics=metrics,
                              feature_relevance=relevance)
        out = (seal(report, self.identity), self._mode_client.first_message())
        self.outgoing.extend(out)
        return out

    def on_refused(self, stage: str, parts: Mapping[str, bytes], refusal: bytes) -> None:
        """The transport sealed this hospital's refusal of ``parts``. A refused plan that extended
        the anchored history (it passed :meth:`HospitalAnchor.check`), or a refused stage or round-end
        message of the round whose plan this hospital anchored, is kept in the anchor, and a later
        plan must prove the server logged it (SECURITY.md, "Audited artefacts")."""
        if self.anchor is None:
            return
        if stage in ("stage", "end"):
            if self.plan is not None:  # the message belongs to the round of the last plan this hospital took
                self.anchor.note_refusal(self.plan.federation_id, self.plan.round, refusal)
            return
        if stage != "plan" or self._checked_plan is None:
            return
        federation_id, round_, digest, owed = self._checked_plan
        data = parts.get("data")
        if data is not None and parse_envelope(data).digest() == digest:
            self.anchor.note_refusal(federation_id, round_, refusal, discloses=owed)

    def on_stage(self, data: bytes) -> bytes | None:
        if self._mode_client is None:
            raise ProtocolError("Stage message before any plan.")
        reply = self._mode_client.handle(data)
        if reply is not None:
            self.outgoing.append(reply)
        return reply

    @property
    def last_planned_round(self) -> int | None:
        """The round of the last plan this hospital verified (None: none yet)."""
        return self.plan.round if self.plan is not None else None

    def decrypted_result(self) -> ModuleSums | None:
        """In modes where the server never sees the sum (ckks), the aggregate this hospital decrypted."""
        return self._mode_client.decrypted_result() if self._mode_client is not None else None

    def on_round_end(self, global_model: bytes | None) -> bytes | None:
        """Load the new global shared modules; personal modules keep this hospital's values.
        Returns this hospital's signed :class:`~clinograph.secure.runtime.selection.SelectionStatus`
        (the federated validation loss it decoded from the model) when its task selects models."""
        plan = self.plan
        if plan is None:
            if global_model is None:
                raise ProtocolError("End of a round this hospital did not take part in.")
            return self._first_catch_up(global_model)  # it missed every round so far (or restarted without state)
        if global_model is not None:
            if not create_mode(plan.secure_mode).server_sees_sum:  # ckks: the hospitals decrypt, the server holds no model
                raise ProtocolError(f"Round {plan.round} ran under secure_mode {plan.secure_mode!r}, where this hospital "
                                    "applies the aggregate it decrypted and the server holds no model; the server sent "
                                    "a model of its own (at the round's end or as a catch-up). Refused; nothing was "
                                    "loaded.")
            msg = open_envelope(parse_envelope(global_model), sender=self.server, model=GlobalModel)
            if msg.federation_id != plan.federation_id:  # a model of another federation the server signed, replayed
                raise ProtocolError(f"Global model of federation {msg.federation_id!r} sent to this hospital's round "
                                    f"{plan.round} of federation {plan.federation_id!r}. Refused; nothing was loaded.")
            new = _global_modules(plan.spec, msg)
            if ((msg.round <= plan.round or msg.round == self._loaded_round)  # digests only for a possible copy
                    and state_digest(new) == state_digest(self._global)):
                return None  # a model this hospital already loaded, delivered again (a restarted server, a catch-up)
            if msg.round > plan.round + 1:
                return self._catch_up(msg.round, new, plan.federation_id)
            if msg.round != plan.round + 1:
                raise ProtocolError("Global model is not the one following this hospital's last round.")
            if msg.validation is not None and msg.validation.contributors > len(plan.participants):
                # the noise the selection rule reads grows with √contributors (released_loss_noise)
                raise ProtocolError(f"Global model of round {plan.round}: its metric/validation aggregate names "
                                    f"{msg.validation.contributors} contributors, but the round's signed plan has "
                                    f"{len(plan.participants)} participants. Refused; nothing was loaded.")
            self._loaded_round = msg.round
        else:
            if self._applied == (plan.federation_id, plan.round):
                return None  # applied once already: a round end delivered again (a restarted server, a replay)
            sums = self.decrypted_result()
            if sums is None:
                raise ProtocolError("No global model and no decrypted aggregate at the end of the round.")
            new = self._strategy_for(plan).apply(self._global, sums)
            self._applied = (plan.federation_id, plan.round)
        self._global = new
        if hasattr(self.task, "validation_aggregate"):  # distributed DP: to read the released loss's noise
            self.task.validation_aggregate = msg.validation if global_model is not None else None
        self.task.modules.load(self._global)
        if hasattr(self.task, "global_origin"):  # an export names the published global model it holds
            self.task.global_origin = (plan.federation_id, plan.round)
        selection = getattr(self.task, "selection", None)
        seen = len(selection.losses) if selection is not None else 0
        self.task.after_round()
        if self.anchor is not None:  # the checkpoint first: a restart prefers it to the kept model
            self._keep_checkpoint(plan.federation_id)
            self.anchor.keep_model(plan.federation_id, self._global)
        if self.model_path is not None and plan.federation_id == self.model_path.stem:
            self.task.export_kept(self.model_path, signer=self.identity)  # type: ignore[call-arg]
        if selection is None:
            return None
        new_loss = len(selection.losses) > seen
        noise = selection.noises[-1] if new_loss and selection.noises else 0.0
        status = SelectionStatus(federation_id=plan.federation_id, round=plan.round, client=self.name,
                                 scored=selection.rounds[-1] if new_loss else None,
                                 loss=selection.losses[-1] if new_loss else None, noise=noise or None)
        return seal(status, self.identity)

    def _follow_run(self, p: RoundPlan) -> None:
        """The run's options in the signed plan: an evaluation-only round (``run.phase = "score"``)
        trains nothing, and the selection keeps its best model by the plan's ``min_delta``."""
        if hasattr(self.task, "evaluate_only") or p.options.get("run.phase") == "score":
            self.task.evaluate_only = p.options.get("run.phase") == "score"
        selection = getattr(self.task, "selection", None)
        first = p.options.get("run.first_round")
        if selection is not None and isinstance(first, int):
            if self._run_first is not None and first != self._run_first:  # an extended federation's new run
                from ..training.selection import ModelSelection

                selection = ModelSelection(patience=selection.patience, min_delta=selection.min_delta)
                self.task.selection = selection
            self._run_first = first
        if selection is not None and isinstance(p.options.get("selection.min_delta"), float):
            selection.min_delta = float(p.options["selection.min_delta"])

    def _start(self, parts: Mapping[str, bytes]) -> dict[str, bytes]:
        """``run/start`` of a one-model run (a :class:`~.member.FederationMember` -- the SuperNode's
        default participant -- handles runs of several candidates and the DP horizon)."""
        msg = open_envelope(parse_envelope(part(parts, "data", "setup")), sender=self.server, model=RunStart)
        if msg.count != 1 or msg.run_id != self.federation_id:
            raise ProtocolError(f"run/start names run {msg.run_id!r} of {msg.count} candidate(s); this hospital is one "
                                f"model of federation {self.federation_id!r}. Serve candidates with "
                                "clinograph.sdk.federation.node:make_hospital (a FederationMember).")
        return {"ok": b"1"}

    def _finish(self, parts: Mapping[str, bytes]) -> dict[str, bytes]:
        """``run/finish``: keep the selected model (global + personal) and fit the calibration
        (:meth:`Task.finish`); answer with the round kept, signed."""
        msg = open_envelope(parse_envelope(part(parts, "data", "setup")), sender=self.server, model=RunFinish)
        plan = self.plan
        if plan is None or msg.federation_id != plan.federation_id or msg.round != plan.round:
            raise ProtocolError(f"run/finish for federation {msg.federation_id!r} round {msg.round} does not follow "
                                f"this hospital's last round ({plan.federation_id + ' ' + str(plan.round) if plan else 'none'}).")
        if hasattr(self.task, "evaluate_only"):
            self.task.evaluate_only = False
        finish = getattr(self.task, "finish", None)
        kept = finish().get("round") if callable(finish) else None
        self.finished = True
        if self.model_path is not None and plan.federation_id == self.model_path.stem:
            self.task.export_kept(self.model_path, signer=self.identity)  # type: ignore[call-arg]
        status = SelectionStatus(federation_id=plan.federation_id, round=plan.round, client=self.name,
                                 kept=None if kept is None else int(kept))
        return {STATUS_PART: seal(status, self.identity)}

    # -- using the model at the hospital ------------------------------------------------------
    def predict_table(self, table):  # noqa: ANN001, ANN201 - a PatientTable -> np.ndarray
        """Per-patient risks for new patients of this hospital (personal layers and calibration
        included); nothing leaves the hospital. Needs a task with ``predict_table`` (NS-FL)."""
        predict = getattr(self.task, "predict_table", None)
        if predict is None:
            raise ConfigError(f"Task {self.task.name!r} cannot score new patients (no predict_table); use task = 'nsfl'.")
        return predict(table)

    def _first_catch_up(self, global_model: bytes) -> None:
        """The current global model sent to a hospital that has taken no plan of this federation yet (it
        missed the first rounds, or restarted without a state directory): decoded against this hospital's
        own model spec, loaded as a catch-up (:meth:`_catch_up`) that the plan riding with it must name."""
        msg = open_envelope(parse_envelope(global_model), sender=self.server, model=GlobalModel)
        if msg.federation_id != self.federation_id:
            raise ProtocolError(f"Global model of federation {msg.federation_id!r} sent to this hospital of federation "
                                f"{self.federation_id!r}. Refused; nothing was loaded.")
        local = self._local_spec(msg.spec, "Global model's", "Refused; nothing was loaded.")
        new = _global_modules(local, msg)
        if state_digest(new) == state_digest(self._global):
            return None  # the model it starts from (the initial one)
        return self._catch_up(msg.round, new, msg.federation_id)

    def _catch_up(self, model_round: int, new: dict[str, np.ndarray], federation_id: str) -> None:
        """Load the federation's current global model after rounds this hospital missed (dropped,
        suspended, restarted): the server sends it with the next plan it invites the hospital to
        (:func:`clinograph.secure.runtime.loop.run_round`). Only the model is loaded -- the task's
        after-round step (personal fine-tuning, the selection statistic) belongs to rounds the hospital
        took part in. It is bound to the federation by that plan: :meth:`on_plan` refuses a plan whose
        ``global_state_digest`` is not this model's, as for any round's model, and then puts back the
        model the hospital held (:meth:`_settle_catch_up`); it is kept in the anchor only once a plan
        that names it passed every check."""
        if self._caught_up is None:  # a second copy before the plan: the first one's predecessor stays the one to restore
            self._caught_up = (self._global, self._loaded_round, getattr(self.task, "global_origin", None))
        self._global = new
        self._loaded_round = model_round
        self.task.modules.load(new)
        if hasattr(self.task, "global_origin"):  # the published model it holds: that of round model_round - 1
            self.task.global_origin = (federation_id, model_round - 1)

    def _settle_catch_up(self, accepted: bool, federation_id: str = "") -> None:
        """After the checks of the plan that followed a catch-up (:meth:`_catch_up`): keep the model in
        the anchor if the plan names it (``accepted``), else put back the model this hospital held -- a
        model no plan vouched for (another digest, a rolled-back or forked server's) is not kept."""
        staged, self._caught_up = self._caught_up, None
        if staged is None:
            return
        if accepted:
            if self.anchor is not None:
                self.anchor.keep_model(federation_id, self._global)  # the plan just anchored names it
            return
        self._global, self._loaded_round, origin = staged
        self.task.modules.load(self._global)
        if hasattr(self.task, "global_origin"):
            self.task.global_origin = origin

    # -- helpers -----------------------------------------------------------------------------
    def _resume(self, federation_id: str) -> None:
        """After a restart: the anchored plan (replay guard, round end) and global model, if any."""
        last = self.anchor.get(federation_id) if self.anchor is not None else None
        if last is None:
            return
        self.plan = open_envelope(parse_envelope(last.plan), sender=self.server, model=RoundPlan)
        self._trained[federation_id] = self.plan.round
        kept = self.anchor.model(federation_id, names=self.task.modules.names(ModuleKind.SHARED))
        if kept is not None:
            self._global = kept
            self.task.modules.load(kept)
        self._restore_checkpoint(federation_id)

    def _keep_checkpoint(self, federation_id: str) -> None:
        """After a round: the task's :meth:`~.task.Task.checkpoint` and the global model it loaded,
        in one file beside the anchor (its digest in the anchor record)."""
        checkpoint = getattr(self.task, "checkpoint", None)  # optional: a task need not subclass TaskBase
        got = checkpoint() if callable(checkpoint) else None
        if got is None or self.anchor is None:
            return
        import torch
        from safetensors.torch import save

        meta, tensors = got
        tensors = {f"task/{k}": v.detach().contiguous().clone() for k, v in tensors.items()}
        tensors.update({f"global/{k}": torch.from_numpy(np.ascontiguousarray(v)) for k, v in self._global.items()})
        data = save(tensors, metadata={"clinograph": json.dumps(meta, sort_keys=True)})
        self.anchor.keep_blob(federation_id, "checkpoint", data)

    def _restore_checkpoint(self, federation_id: str) -> None:
        """Take back :meth:`_keep_checkpoint` after a restart: the task's state and the global model of
        the last round this hospital closed (newer than, or the same as, the kept global model)."""
        data = self.anchor.blob(federation_id, "checkpoint", what="restart checkpoint") if self.anchor else None
        restore = getattr(self.task, "restore", None)
        if data is None or not callable(restore):
            return
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            tensors = load(data)
            meta = json.loads(_safetensors_metadata(data)["clinograph"])
        except (SafetensorError, KeyError, ValueError):
            raise IntegrityError(f"The restart checkpoint of hospital {self.name!r} is not a Clinograph checkpoint. "
                                 "Restore the state directory from its backup.") from None
        names = set(self.task.modules.names(ModuleKind.SHARED))
        held = {k[7:]: v.numpy() for k, v in tensors.items() if k.startswith("global/")}
        if set(held) != names:
            raise IntegrityError("The restart checkpoint holds another model than this hospital's config builds; the "
                                 "state directory belongs to another model version.")
        try:
            restore(meta, {k[5:]: v for k, v in tensors.items() if k.startswith("task/")})
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):  # a record of another shape
            raise IntegrityError(f"The restart checkpoint of hospital {self.name!r} holds a record that is not a "
                                 "Clinograph checkpoint's. Restore the state directory from its backup.") from None
        self._global = held
        self.task.modules.load(held)

    def _check_fresh(self, p: RoundPlan) -> None:
        """Round numbers strictly advance per federation: a replayed or old plan would train
        (and spend privacy budget) again for a round this hospital already trained."""
        last = self._trained.get(p.federation_id)
        if last is not None and p.round <= last:
            raise ProtocolError(f"Plan for round {p.round} of federation {p.federation_id!r} refused: this hospital "
                                f"already trained for round {last} (a replayed or old plan). Nothing was trained; "
                                "the next plan must be for a later round.")

    def _local_spec(self, spec: ModelSpec, whose: str, then: str) -> ModelSpec:
        """This hospital's own ModelSpec at ``spec``'s version, or a ProtocolError when they differ."""
        local = self.task.modules.spec(version=spec.version)
        if local.digest() != spec.digest():
            raise ProtocolError(f"{whose} ModelSpec v{spec.version} differs from this hospital's model "
                                f"(task, model settings or SDK version). {then}")
        return local

    def _check_plan(self, p: RoundPlan) -> None:
        if self.name not in p.participants:
            raise ProtocolError(f"Plan for round {p.round} does not list {self.name!r}.")
        if p.dictionary_hash != self.dictionary_hash:
            raise ProtocolError(f"Plan uses feature dictionary {p.dictionary_hash[:12]}…, this hospital has "
                                f"{self.dictionary_hash[:12]}…. Both must use the same dictionary file.")
        self._local_spec(p.spec, "Plan's", "Align the hospital config with the server's.")
        check_plan_settings(p.options, task=self.task, hospital=self.name, round_=p.round)  # weight-free settings
        mode = create_mode(p.secure_mode)
        if mode.insecure and not self.release.insecure_accept_plaintext:
            raise ProtocolError(f"Round {p.round}: the server plans secure_mode {p.secure_mode!r}, under which it would "
                                f"see {self.name!r}'s contribution in the clear; this hospital does not accept that. Refused. "
                                "If the federation really runs without secure aggregation (development only), put "
                                "insecure_accept_plaintext = true under [release] in the hospital config.")
        if not mode.insecure and p.secure_mode not in self.release.secure_modes:
            raise ProtocolError(
                f"Round {p.round}: the server plans secure_mode {p.secure_mode!r}; this hospital joins rounds only "
                f"under {', '.join(repr(m) for m in self.release.secure_modes)} ([release] secure_modes), each of "
                f"which releases something else. Refused; nothing was trained. If the federation really runs under "
                f"{p.secure_mode!r}, add it to [release] secure_modes in the hospital config (docs/deployment.md "
                f"says what each mode lets the server, and colluding hospitals, learn).")
        mode.check_plan(p, release=self.release)  # the mode's parameters and this hospital's own rules, before training
        self._check_weights(p)
        server_blind = p.global_state_digest == UNKNOWN_STATE and not mode.server_sees_sum
        if not server_blind and state_digest(self._global) != p.global_state_digest:
            raise ProtocolError(f"Round {p.round}: this hospital's global model does not match the plan's "
                                "(missed a round?). Refused; nothing was trained. A server sends the current model "
                                "with the plan to a hospital that missed rounds; this plan came without it (a "
                                "server whose mode holds no plaintext model cannot: ckks), or with another model.")

    def _check_weights(self, p: RoundPlan) -> None:
        """Refuse published weights that make the sum this hospital's update (``[release] max_weight_share``):
        the worst case is the smallest round the server may close, min_clients survivors, the others the lightest."""
        own = p.options.get(f"weight/{self.name}")
        if own is None or self.release.max_weight_share >= 1:
            return
        if isinstance(own, bool) or not isinstance(own, (int, float)) or not own >= 0:
            raise ProtocolError(f"Round {p.round}: the plan's weight/{self.name} is not a non-negative number. "
                                "Refused; nothing was trained.")
        others = sorted(float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 else 0.0
                        for c in p.participants if c != self.name for w in [p.options.get(f"weight/{c}", 0.0)])
        lightest = sum(others[:max(p.min_clients - 1, 1)])
        share = float(own) / (float(own) + lightest) if float(own) > 0 else 0.0
        if share > self.release.max_weight_share + 1e-9:  # equal weights of n: exactly 1/2 at min_clients = 2
            raise ProtocolError(
                f"Round {p.round}: the plan fixes this hospital's weight at {float(own):.3g} and the lightest other "
                f"weights at {lightest:.3g} in all, so in a round of {max(p.min_clients, 2)} hospitals its update would "
                f"be {share:.1%} of the sum the server learns (this hospital's rule: at most "
                f"{self.release.max_weight_share:.0%}, [release] max_weight_share). Refused; nothing was trained. "
                "If the federation's weighting (dq_weighted) really must give it that share, raise [release] "
                "max_weight_share in the hospital config (1: no limit).")

    def _weight(self, p: RoundPlan) -> float:
        fixed = p.options.get(f"weight/{self.name}")
        if fixed is not None:
            return float(fixed)
        cap = float(p.options.get("weight.max", float("inf")))
        return float(min(self.task.num_samples, cap))

    def _released_metrics(self) -> dict[str, float]:
        if self.release.metrics == "quality":
            return self.task.quality()
        if self.release.metrics == "validation":
            return {f"val_{k}": v for k, v in self.task.evaluate("validation").items()}
        return {}

    def _strategy_for(self, plan: RoundPlan) -> Strategy:
        """One strategy instance for the whole run (FedOpt keeps its moments across rounds),
        built from the options the signed plan carries."""
        if reads_sum_at_server(plan.strategy):  # its options (a rule space path) are the server's to read
            raise ProtocolError(f"The plan asks this hospital to apply strategy {plan.strategy!r}, which reads the "
                                "summed update on the server; a hospital never runs it (the server refuses it under "
                                "a mode where hospitals decrypt the sum). Refused; nothing was read.")
        opts = {k.removeprefix("strategy."): v for k, v in plan.options.items() if k.startswith("strategy.")}
        key = (plan.strategy, tuple(sorted(opts.items())))
        if self._strategy is None or self._strategy[0] != key:
            self._strategy = (key, create_strategy(plan.strategy, **opts))
        return self._strategy[1]


def _safetensors_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's header (a length-prefixed JSON object)."""
    import struct

    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8 or length > 100_000_000:
        raise ValueError("header length")
    return dict(json.loads(data[8:8 + length]).get("__metadata__") or {})


def _global_modules(spec: ModelSpec, msg: GlobalModel) -> dict[str, np.ndarray]:
    """The shared modules of a global model, decoded against ``spec``: every shared module of it, each
    once and of its size (a model lacking one would leave that module out of this hospital's global
    model, and its next round's delta of it would fail)."""
    new = {n: v.astype(np.float64) for n, v in
           decode_modules(SimpleNamespace(spec=spec), msg.modules, sender="server").items()}  # type: ignore[arg-type]
    missing = sorted(m.name for m in spec.shared if m.name not in new)
    if missing:
        raise ProtocolError(f"Global model of round {msg.round} lacks {len(missing)} shared module(s) of the model "
                            f"spec ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}). Refused; nothing "
                            "was loaded.")
    return new
