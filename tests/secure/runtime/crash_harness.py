"""A small masked (or CKKS) federation in one process, journalled, that a test can SIGKILL.

Run as a script (``python crash_harness.py WORKDIR --mode masked --rounds 2 [--kill STAGE]``):
it builds four real :class:`HospitalClient` s over a tiny deterministic task (full-batch
gradient descent on fixed synthetic data, a real privacy ledger counting one step a round),
the server through ``build_server``, and runs ``run_rounds(..., journal=...)``. Keys, the audit
directory, the journal and every hospital's state directory live in WORKDIR, so a second run
resumes the first. ``--kill STAGE`` is the test hook: the process SIGKILLs itself right after
the first journal boundary named STAGE (``plan``, ``stage 1``, ``close``, ``end``, ...) that
this process writes. At the end it writes ``WORKDIR/result.json`` (the final model, exact as
float hex; each hospital's ledger rounds; the server's ledger view).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import numpy as np
import torch
from clinograph.sdk.config import ReleaseSection
from clinograph.sdk.federation.client import HospitalClient
from clinograph.sdk.model.modules import ModuleMap
from clinograph.sdk.privacy.accountant import PrivacyLedger, merge_step
from clinograph.sdk.training.trainer import TrainOutcome
from clinograph.secure.audit import AuditTrail
from clinograph.secure.messages import DPPolicy
from clinograph.secure.runtime import (
    InProcessTransport,
    build_server,
    run_rounds,
)
from clinograph.secure.runtime.build import InitialModel
from clinograph.secure.runtime.config import FederationSection
from clinograph.secure.runtime.journal import Journal

from clinograph.core.identity import Identity
from clinograph.core.spec import ModuleKind

HOSPITALS = ("h1", "h2", "h3", "h4")
FEDERATION = "fed-crash"
DICTIONARY_HASH = "c" * 64
SIGMA, RATE = 1.0, 0.1

#: Signs the ledgers of LineTasks made without a signer (in-process callers); :func:`main` signs with
#: WORKDIR/keys/ledger.pem instead, so that a run in a fresh process resumes a ledger an earlier one signed.
LEDGER_SIGNER = Identity.generate("ledger")


class LineTask:
    """Linear regression by full-batch gradient descent: the update depends only on the global
    model it starts from (no randomness), so an aborted-and-rerun round trains the same."""

    name = "toy"

    def __init__(self, site: str, state_dir: Path, *, budget: float = 1e6, signer: Identity | None = None):
        torch.set_num_threads(1)
        self.model = torch.nn.Linear(4, 1)
        with torch.no_grad():
            self.model.weight.zero_()
            self.model.bias.zero_()
        self.modules = ModuleMap()
        self.modules.add_submodule("head", ModuleKind.SHARED, self.model)
        rng = np.random.default_rng(sum(site.encode()))  # the hospital's fixed data (not a secret)
        x = rng.normal(size=(32, 4))
        self.x = torch.tensor(x, dtype=torch.float32)
        self.y = torch.tensor(x @ np.array([0.5, -0.3, 0.2, 0.1]) + 0.05 * rng.normal(size=32),
                              dtype=torch.float32).reshape(-1, 1)
        self.ledger = PrivacyLedger(state_dir, site=site, budget_epsilon=budget, delta=1e-5,
                                    signer=signer or LEDGER_SIGNER)

    @property
    def num_samples(self) -> int:
        return 32

    def train(self, *, round_, epochs, plan_options):
        self.ledger.check_round(round_=round_, noise_multiplier=SIGMA, sample_rate=RATE, steps=1)
        opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
            loss.backward()
            opt.step()
        entry = self.ledger.commit(round_=round_, history=merge_step(self.ledger.history, noise_multiplier=SIGMA,
                                                                     sample_rate=RATE, steps=1),
                                   noise_multiplier=SIGMA, sample_rate=RATE, clip_norm=1.0)
        return TrainOutcome(loss=float(loss), used_similar_to=False, ledger=entry)

    def trained_modules(self, outcome):
        return self.modules.names(ModuleKind.SHARED)

    def after_round(self):
        return None

    def evaluate(self, split):
        return {}

    def quality(self):
        return {}

    def feature_relevance(self):
        return {}


def identities(work: Path) -> dict[str, Identity]:
    keys = work / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in ("server", "ledger", *HOSPITALS):
        path = keys / f"{name}.pem"
        if not path.exists():
            Identity.generate(name).save(path)
        out[name] = Identity.load(name, path)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--mode", default="masked")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kill", default=None, help="SIGKILL this process after the first journal boundary so named")
    ap.add_argument("--no-journal", action="store_true")
    ap.add_argument("--events", action="store_true", help="write the run's progress events to WORKDIR/events.jsonl")
    ap.add_argument("--budget", type=float, default=1e6, help="every hospital's ε budget (small: they refuse)")
    args = ap.parse_args(argv)
    work: Path = args.work
    ids = identities(work)
    publics = {n: ids[n].public for n in HOSPITALS}
    hospitals = {n: HospitalClient(task=LineTask(n, work / "state" / n, budget=args.budget,
                                                                  signer=ids["ledger"]), identity=ids[n], server=ids["server"].public,
                                   peers=publics, dictionary_hash=DICTIONARY_HASH, federation_id=FEDERATION,
                                   release=ReleaseSection(secure_modes=(args.mode,)), state_dir=work / "state" / n)
                 for n in HOSPITALS}
    transport = InProcessTransport(hospitals)
    section = FederationSection(id=FEDERATION, secure_mode=args.mode, strategy="fedavg", min_clients=3,
                                local_epochs=1, max_weight=1.0, masked_clip=1.0)
    mode_run = None
    if args.mode in ("ckks", "ckks_threshold"):  # the key set-up over the transport, as the ServerSide runs it
        from clinograph.secure.aggregation import create_mode
        from clinograph.secure.runtime.build import build_strategy, weight_bound

        mode_run = create_mode(args.mode).open_run(federation=section, transport=transport, run_id=FEDERATION,
                                                enrolled=publics, max_weight=weight_bound(build_strategy(section),
                                                                                          section))
    first = hospitals["h1"].task
    initial = InitialModel.create(task="toy", dictionary_hash=DICTIONARY_HASH, spec=first.modules.spec(version=1),
                                  state=LineTask("h0", work / "scratch").modules.state(ModuleKind.SHARED))
    policy = DPPolicy(required=True, max_epsilon=1e6, delta=1e-5, min_noise_multiplier=0.5, max_clip_norm=1.0)
    audit = AuditTrail(work / "audit", identity=ids["server"])

    def kill(stage: str, round_: int) -> None:
        if stage == args.kill:
            os.kill(os.getpid(), signal.SIGKILL)

    journal = None if args.no_journal else Journal(work / "journal.sqlite", on_saved=kill)
    server = build_server(federation=section, identity=ids["server"], enrolled=publics, initial=initial, audit=audit,
                          dp_policy=policy, mode_run=mode_run)
    events: list[dict] = []
    try:
        run_rounds(server, transport, rounds=args.rounds, journal=journal,
                   on_event=lambda kind, data: events.append({"event": kind, **data}))
    finally:
        if args.events:
            (work / "events.jsonl").write_text("".join(json.dumps(e, default=str) + "\n" for e in events))
        audit.close()
        if journal is not None:
            journal.close()
    h1 = hospitals["h1"]
    result = {
        "global": {n: [float(x).hex() for x in v] for n, v in sorted(h1._global.items())},
        "hospital_globals_equal": all(all(np.array_equal(h._global[n], h1._global[n]) for n in h1._global)
                                      for h in hospitals.values()),
        "ledger_rounds": {n: [e["round"] for e in h.task.ledger.entries] for n, h in hospitals.items()},
        "ledger_steps": {n: sum(t for *_, t in h.task.ledger.history) for n, h in hospitals.items()},
        "server_ledger_rounds": {n: v["last"]["round"] for n, v in server.ledger_view().items()},
        "server_round": server.round,
        "history": [r.round for r in server.history],
    }
    (work / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))


#: What the forkserver imports once, so that each child starts with it loaded (~3 s a child otherwise):
#: this module's imports, not this module -- Python 3.11's forkserver does not apply the caller's
#: sys.path before preloading, so a module found only through it (this one) would fail silently.
PRELOAD = ("numpy", "torch", "clinograph.sdk.config", "clinograph.sdk.federation.client",
           "clinograph.sdk.model.modules", "clinograph.sdk.privacy.accountant", "clinograph.secure.audit",
           "clinograph.secure.runtime", "clinograph.secure.runtime.journal", "clinograph.secure.aggregation",
           "clinograph.secure.masking", "clinograph.core.identity")


def run_in_child(work: Path, *args: str, timeout: float = 300) -> int:
    """:func:`main` on ``[work, *args]`` in a child process; its exit code (-SIGKILL when the run
    killed itself at its ``--kill`` boundary).

    The child is forked from a ``forkserver`` (a fresh interpreter that has imported :data:`PRELOAD`
    and nothing else has run in), not from the caller: a pytest-xdist worker has threads, and a
    child forked from a threaded process that has used torch's thread pool can crash before it
    runs a line (seen: SIGSEGV, about one fresh-clone suite in five). The forkserver starts once
    per process, so each run costs a fork, not an interpreter start."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # no effect if this process's forkserver already runs
    proc = ctx.Process(target=main, args=([str(work), *args],))
    proc.start()
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        raise AssertionError(f"harness run {list(args)} did not finish within {timeout:.0f} s")
    return int(proc.exitcode)


if __name__ == "__main__":
    main(sys.argv[1:])
