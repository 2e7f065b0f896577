"""Review pass 44 of the hospitals in worker processes (``secure/runtime/workers.py``, ``[simulation]
workers``, ec73135): what a run reports and brings back must not depend on where the hospitals ran."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import simulate_one
from clinograph.secure.policy import InsecureOptionWarning

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sdk_helpers import small_tables  # noqa: E402

LOCAL_DP = {"enabled": True, "planned_rounds": 2, "noise_multiplier": 1.0}


def _run(tmp_path: Path, tag: str, *, workers: int, privacy: dict | None = None, drop_at=None, **fed):
    tables = small_tables()
    config = SimulationConfig.model_validate({
        "output": str(tmp_path / f"{tag}_out"), "simulation": {"workers": workers},
        "federation": {"rounds": 2, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1, **fed},
        "model": {"hidden": 8}, "graph": {"k_similar": 0 if privacy else 3}, "training": {"lr": 0.01, "batch_size": 32},
        **({"privacy": privacy} if privacy else {})})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        return simulate_one(tables, tables[0].dictionary, config, audit_dir=tmp_path / tag, drop_at=drop_at), tables


def test_every_hospital_that_contributed_keeps_its_epsilon_in_a_round_where_another_dropped(tmp_path):
    """Round 1 drops 'south': 'north' and 'east' still trained under local DP and spent ε in it."""
    res, _ = _run(tmp_path, "dp_drop", workers=1, privacy=LOCAL_DP, drop_at={1: {"south": 2}})
    assert "south" in res.dropped[1]
    assert {n: len(e) for n, e in res.epsilons.items()} == {"east": 2, "north": 2, "south": 1}
    assert res.epsilons["north"][1] > res.epsilons["north"][0] > 0
    assert res.timings["local_training_seconds"][1] > 0  # the two that trained did train


@pytest.mark.parametrize("mode", ["ckks", "ckks_threshold"])
def test_a_ckks_run_in_worker_processes_brings_its_hospitals_back_without_their_secret_keys(tmp_path, mode):
    """The hospitals' CKKS secret keys refuse to be pickled: the run must not be lost at its end for it.
    The parent gets every hospital back (its model, its metrics); the secret stays in the worker."""
    from clinograph.secure.runtime.workers import WorkerError

    res, tables = _run(tmp_path, mode, workers=2, secure_mode=mode)
    assert not multiprocessing.active_children()
    assert sorted(res.hospitals) == ["east", "north", "south"] and len(res.rounds) == 2
    north = next(t for t in tables if t.site == "north")
    assert np.isfinite(res.hospitals["north"].predict_table(north)).all()
    holder = res.hospitals["north"].client.ckks
    secret = holder.keyring if mode == "ckks" else holder.threshold.party
    with pytest.raises(WorkerError, match=r"stayed in its simulation worker process.*\[simulation\] workers = 1"):
        secret.preset  # noqa: B018 - any use of the withheld object says where it is


def test_a_survival_run_in_worker_processes_brings_its_hospitals_back(tmp_path):
    """The survival trainer's hazard objective must survive the trip back (it was a closure)."""
    pytest.importorskip("lifelines")
    from sdk_helpers import SURVIVAL_TARGET, lung_survival

    d, lung = lung_survival()
    config = SimulationConfig.model_validate({
        "federation": {"rounds": 1, "secure_mode": "masked", "local_epochs": 1, "min_clients": 2},
        "model": {"hidden": 8}, "graph": {"k_similar": 0}, "selection": {"enabled": False, "candidates": []},
        "output": str(tmp_path / "out"), "target": SURVIVAL_TARGET, "simulation": {"workers": 2}})
    res = simulate_one(list(lung), d, config, audit_dir=tmp_path / "audit")
    assert not multiprocessing.active_children()
    assert sorted(res.hospitals) == sorted(t.site for t in lung)
    assert np.isfinite(res.hospitals[lung[0].site].predict_table(lung[0])).all()


class _HoldsAClosure:
    """A hospital holding a local function (it comes back: made before the fork, it is an anchor)
    and, for hospital a, something no pickler can carry (a lock)."""

    def __init__(self, name: str):
        self.name, self.score = name, lambda x: x
        self.lock = threading.Lock() if name == "a" else None


def test_hospitals_that_cannot_come_back_say_which_and_what_to_do():
    from clinograph.secure.runtime.workers import ProcessTransport, WorkerError

    with ProcessTransport({n: _HoldsAClosure(n) for n in ("a", "b")}, workers=2) as t:
        with pytest.raises(WorkerError, match=r"cannot be brought back.*members: TypeError \(hospitals \['a'\]\).*"
                                              r"\[simulation\] workers = 1"):
            t.members()


def test_an_agat_run_in_worker_processes_is_the_serial_run(tmp_path):
    """AGAT's dropout drew from torch's process-wide generator, whose state each forked worker copies:
    its hospitals' results depended on which process they ran in."""
    tables = small_tables()

    def run(workers: int):
        config = SimulationConfig.model_validate({
            "task": "agat", "agat": {"hidden": 16, "k_neighbours": 4, "temporal_hidden": 8},
            "federation": {"rounds": 2, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1},
            "training": {"lr": 0.01, "batch_size": 32}, "simulation": {"workers": workers},
            "output": str(tmp_path / f"out{workers}")})
        return simulate_one(tables, tables[0].dictionary, config, audit_dir=tmp_path / f"audit{workers}")

    serial, workers = run(1), run(2)
    assert serial.rounds == workers.rounds and serial.final == workers.final


class _DisplayStream:
    """A stand-in for a live display's stream proxy (rich's, while `clinograph simulate` shows its
    progress bar) whose lock its refresh thread held at the moment the workers were forked."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lock.acquire()

    def write(self, text: str) -> int:
        if not self.lock.acquire(timeout=2):  # a forked copy of a held lock is never released
            raise RuntimeError("the display's lock was held at the fork")
        self.lock.release()
        return len(text)

    def flush(self) -> None:
        pass


def _say(participant) -> bool:
    print(f"hospital {participant.name}: a warning", file=sys.stderr)
    return True


def test_a_worker_writes_to_its_own_stderr_not_to_a_display_stream_locked_at_the_fork(monkeypatch):
    from clinograph.secure.runtime.workers import ProcessTransport

    monkeypatch.setattr(sys, "stderr", _DisplayStream())
    with ProcessTransport({n: _HoldsAClosure(n) for n in ("a", "b")}, workers=2) as t:
        assert t.call(_say) == {"a": True, "b": True}


def test_auto_stays_in_process_on_macos_where_fork_is_unsafe(monkeypatch):
    """Python's docs: on macOS 'the fork start method should be considered unsafe as it can lead to
    crashes of the subprocess' (system libraries start threads); 'auto' must not fork there."""
    auto = SimulationConfig.model_validate({"simulation": {"workers": "auto"}}).simulation
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert auto.worker_count(3, load=0.0) == 1
    monkeypatch.setattr(sys, "platform", "linux")
    assert auto.worker_count(3, load=0.0) == 3


class _Hangs:
    """A hospital whose answer never comes (a deadlock in its native code, a lock copied at the fork)."""

    def __init__(self, name: str):
        self.name = name

    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        threading.Event().wait()  # forever
        raise AssertionError("unreachable")


def test_a_hospital_that_never_answers_is_dropped_after_the_reply_timeout():
    from clinograph.secure.runtime.workers import ProcessTransport

    assert SimulationConfig.model_validate({"simulation": {"reply_timeout": 30}}).simulation.reply_timeout == 30
    with pytest.raises(ValueError, match="reply_timeout"):
        SimulationConfig.model_validate({"simulation": {"reply_timeout": 0}})

    with ProcessTransport({"a": _HoldsAClosure("a"), "b": _Hangs("b")}, workers=2, reply_timeout=0.5) as t:
        answers, failed = t.exchange("plan", {"b": {"data": b"/p"}}, round_=0)
        assert not answers and failed["b"] == "its worker process ended (no reply within 0.5 s)"
    assert not multiprocessing.active_children()
