"""[simulation] workers: hospitals in forked worker processes give exactly the serial run; no worker outlives a run."""

import json
import multiprocessing
import os
import signal
import threading
import warnings

import numpy as np
import pytest
from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import simulate_one
from clinograph.secure.policy import InsecureOptionWarning
from clinograph.secure.runtime.workers import WorkerError
from sdk_helpers import small_tables

from clinograph.core.errors import ConfigError


def cfg(workers, privacy=None, output="runs/simulation", **fed):
    return SimulationConfig.model_validate({"output": str(output),
        "federation": {"rounds": 2, "secure_mode": "masked", "min_clients": 2, "local_epochs": 1, **fed},
        "model": {"hidden": 8}, "graph": {"k_similar": 0 if privacy else 3}, "training": {"lr": 0.01, "batch_size": 32},
        "simulation": {"workers": workers}, **({"privacy": privacy} if privacy else {})})


def digests(audit_dir):
    """What the audit says the run computed: each accepted report's and each global model's digest."""
    rows = [json.loads(line) for line in (audit_dir / "audit.jsonl").read_text().splitlines()]
    return [(r["kind"], r["payload"].get("report_sha256") or r["payload"]["global_state_digest"]) for r in rows
            if r["kind"] in ("update_accepted", "aggregate", "release")]


def run(tmp_path, workers, tag, secure_mode="masked", **kw):
    tables = small_tables()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureOptionWarning)
        res = simulate_one(tables, tables[0].dictionary, cfg(workers, kw.pop("privacy", None), tmp_path / f"{tag}_out",
                                                          secure_mode=secure_mode),
                           audit_dir=tmp_path / tag, **kw)
    return res, tables


@pytest.mark.parametrize("privacy", [None, {"enabled": True, "planned_rounds": 2, "noise_multiplier": 1.0}],
                         ids=["masked-with-dropout", "local-dp"])
def test_workers_give_the_serial_run_exactly(tmp_path, privacy):
    """Without DP: the same reports, global models, metrics and dropouts; under local DP (random by
    design): the same privacy accounting, and the hospitals come back whole."""
    kw = {"drop_at": {1: {"south": 2}}} if privacy is None else {"privacy": privacy}
    (a, tables), (b, _) = run(tmp_path, 1, "serial", **kw), run(tmp_path, 2, "workers", **kw)
    if privacy is not None:  # the DP noise and sampling draw from os.urandom: no two runs agree, serial or not
        assert a.epsilons == b.epsilons and a.epsilons and all(e > 0 for eps in b.epsilons.values() for e in eps)
        assert b.hospitals["east"].predict_table(tables[0]).shape == (tables[0].n_patients,)
        assert not multiprocessing.active_children()
        return
    assert digests(tmp_path / "serial") == digests(tmp_path / "workers") and len(digests(tmp_path / "serial")) > 5
    assert a.rounds == b.rounds and a.final == b.final and a.dropped == b.dropped and a.epsilons == b.epsilons
    assert a.selection == b.selection
    assert "south" in b.dropped[1]
    for site, t in zip(sorted(a.hospitals), sorted(tables, key=lambda t: t.site), strict=True):  # the members came back, whole
        assert np.array_equal(a.hospitals[site].predict_table(t), b.hospitals[site].predict_table(t))
    assert not multiprocessing.active_children()


def test_no_worker_outlives_a_run_that_raises_or_whose_worker_is_killed(tmp_path):
    def boom(r, metrics):
        raise RuntimeError("the caller's callback fails")

    with pytest.raises(RuntimeError, match="callback fails"):
        run(tmp_path, 2, "raises", on_round=boom)
    assert not multiprocessing.active_children()

    def kill_one(r, metrics):
        if r == 0:
            os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)

    with pytest.raises(WorkerError, match=r"The worker process of hospitals \[.*\] ended \(killed by signal 9\)"):
        run(tmp_path, 3, "killed", on_round=kill_one)  # one hospital a worker: two go on, then its state is missed
    assert not multiprocessing.active_children()
    rows = [json.loads(line) for line in (tmp_path / "killed" / "audit.jsonl").read_text().splitlines()]
    dropped = [r["payload"]["dropped"] for r in rows if r["kind"] == "round_participation" and r["payload"]["dropped"]]
    assert [d["reason"] for d in dropped[0].values()] == ["its worker process ended (killed by signal 9)"]


def test_the_worker_count_is_strict_and_auto_uses_the_idle_cores_only():
    auto, cores = cfg("auto").simulation, len(os.sched_getaffinity(0))
    assert auto.worker_count(1, load=0.0) == 1 and cfg(8).simulation.worker_count(3) == 3
    assert auto.worker_count(100, load=1.0) == cores and auto.worker_count(100, load=cores + 1.0) == 1  # busy: serial
    for bad in (0, "2", True, "many"):
        with pytest.raises((ConfigError, ValueError)):
            cfg(bad)


def test_a_threshold_ckks_run_over_workers_ends_and_its_hospitals_predict_as_the_serial_ones(tmp_path):
    """Its key shares and SEAL objects stay in the workers (never pickled); CKKS is approximate, so the
    serial and parallel runs agree to its precision (two serial runs differ as much), not bit for bit."""
    (a, tables), (b, _) = (run(tmp_path, w, f"thr{w}", secure_mode="ckks_threshold") for w in (1, 2))
    assert a.final.keys() == b.final.keys() == {"east", "north", "south"}
    for site in a.final:
        assert abs(a.final[site]["auroc"] - b.final[site]["auroc"]) < 1e-6
        np.testing.assert_allclose(a.hospitals[site].predict_table(tables[0]), b.hospitals[site].predict_table(tables[0]),
                                   atol=1e-5)
    assert not multiprocessing.active_children()


def test_auto_does_not_fork_a_process_running_other_threads_and_a_count_warns(tmp_path, monkeypatch):
    from clinograph.secure.runtime import workers

    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # an idle machine: 'auto' would fork
    monkeypatch.setattr(workers, "runnable_now", lambda: 1.0)
    forked = []
    stop = threading.Event()
    host = threading.Thread(target=stop.wait, daemon=True)  # the embedding application's own thread
    host.start()
    try:
        run(tmp_path, "auto", "auto", on_round=lambda r, m: forked.append(multiprocessing.active_children()))
        assert forked and not any(forked)
        with pytest.warns(RuntimeWarning, match=r"forks this process while it runs \d+ other Python thread"):
            run(tmp_path, 2, "two", on_round=lambda r, m: forked.append(multiprocessing.active_children()))
        assert any(forked)
    finally:
        stop.set()
        host.join()


def test_auto_reads_a_containers_cpu_quota(tmp_path, monkeypatch):
    from clinograph.sdk import config as config_module
    from clinograph.sdk.config import cpu_quota

    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpu_quota(tmp_path) == 1.5
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(v1) is None and cpu_quota(tmp_path / "none") is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    assert cpu_quota(v1) == 2.0
    monkeypatch.setattr(config_module, "cpu_quota", lambda: 1.5)  # a 1.5-core container on a bigger machine
    assert cfg("auto").simulation.worker_count(100, load=0.0) == 1


def test_auto_does_not_count_this_processs_own_stopped_workers_as_other_work(monkeypatch):
    from clinograph.secure.runtime import workers

    monkeypatch.setattr(workers, "_RAN", [(0.0, 120.0, 2)])  # 2 workers busy for 2 minutes, stopped at t = 120 s
    busy = 2 * (1 - np.exp(-2.0))
    assert workers.own_recent_load(120.0) == pytest.approx(busy)
    assert workers.own_recent_load(180.0) == pytest.approx(busy * np.exp(-1.0))
    from clinograph.secure.runtime.workers import ProcessTransport

    with ProcessTransport({"a": _Named("a"), "b": _Named("b")}, workers=2):  # a real worker set records itself
        pass
    assert workers._RAN[-1][2] == 2 and workers.own_recent_load() > 0


class _Named:
    def __init__(self, name):
        self.name = name


def test_auto_counts_the_tasks_runnable_now(tmp_path):
    from clinograph.secure.runtime.workers import runnable_now

    (tmp_path / "loadavg").write_text("0.79 2.89 3.12 3/80 4066\n")
    assert runnable_now(str(tmp_path / "loadavg")) == 3.0
    assert runnable_now(str(tmp_path / "missing")) == 0.0
    assert cfg("auto").simulation.worker_count(3, load=3.0) == max(1, len(os.sched_getaffinity(0)) - 2)
