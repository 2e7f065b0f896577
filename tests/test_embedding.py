"""Clinograph embedded in a host's process (docs/quickstart.md, "Embedding Clinograph"): the
documented calls -- read and ingest a table (and a bad one), simulate a federation, verify its
audit directory, render its report, the federation's split, predict, export and load a model --
leave the process's global state as they found it: torch's, numpy's and Python's random
generators, torch's threads, dtype and flags, logging, warnings filters, the environment, the
working folder, structlog, threads, signal handlers, sys.path, atexit, matplotlib's backend, the
temporary folder. Two simulations in one process, one after the other or in two threads, give
what each gives alone.

Third-party packages that Clinograph loads lazily change some of that *at their own import*
(scikit-learn sets KMP_* variables; scipy.special, urllib3, requests, sympy and PyG add warnings
filters; torch's inductor sets TORCHINDUCTOR_CACHE_DIR): theirs, not Clinograph's calls', so
they are imported before the snapshot. Opacus's import-time ``logging.basicConfig`` is guarded
by Clinograph (tests/sdk/privacy/test_opacus_import.py); the report figures' import-time
backend switch is gone (tests/secure/audit/test_plots_backend.py).
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import signal
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import clinograph as cg

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "data"
SITES = ("north", "south", "east")
#: third-party imports whose import-time effects are theirs (see the module docstring)
THIRD_PARTY = ("sklearn", "scipy.special", "urllib3", "requests", "sympy", "torch._inductor.config", "torch_geometric")


def _host_state() -> dict[str, object]:
    import matplotlib
    import structlog

    return {
        "torch RNG": torch.random.get_rng_state().tolist(),
        "numpy RNG": [a.tolist() if isinstance(a, np.ndarray) else a for a in np.random.get_state()],
        "random RNG": random.getstate(),
        "torch threads": (torch.get_num_threads(), torch.get_num_interop_threads()),
        "torch dtype, flags": (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
                               torch.is_grad_enabled(), torch.is_anomaly_enabled()),
        "root logger": (list(logging.root.handlers), logging.root.level, logging.root.manager.disable),
        "log record factory": logging.getLogRecordFactory(),
        "warnings": (list(warnings.filters), warnings.showwarning, warnings.formatwarning),
        "environment": dict(os.environ),
        "cwd": os.getcwd(),
        "structlog": (structlog.is_configured(), repr(structlog.get_config())),
        "threads": sorted(t.name for t in threading.enumerate()),
        "signals": [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)],
        "sys.path": list(sys.path),
        "excepthooks": (sys.excepthook, threading.excepthook),
        "numpy errors": np.geterr(),
        "matplotlib backend": matplotlib.get_backend(),
    }


def _changed(before: dict[str, object], after: dict[str, object]) -> list[str]:
    out = []
    for key, value in before.items():
        if after[key] != value:
            if key == "environment":
                value = sorted(k for k in set(value) | set(after[key]) if value.get(k) != after[key].get(k))
                out.append(f"environment: {value}")
            elif key == "warnings":
                out.append(f"warnings: +{[f for f in after[key][0] if f not in value[0]]}")
            else:
                out.append(key)
    return out


def _tables(dictionary: cg.FeatureDictionary, rows: int = 60) -> list:
    """The quickstart's example exports (examples/data), their first ``rows`` patients each."""
    return [cg.ingest(cg.read_table(EXAMPLES / f"{site}.csv").head(rows),
                      schema=cg.SiteSchema.from_toml(EXAMPLES / f"{site}_schema.toml"), dictionary=dictionary)
            for site in SITES]


def _config(seed: int = 0) -> cg.SimulationConfig:
    # the GNN with the piecewise value encoding (KnotLinear: tests/sdk/model/test_knot_sorted.py)
    return cg.SimulationConfig.model_validate({
        "federation": {"id": "embedded", "rounds": 1, "seed": seed, "local_epochs": 1},
        "model": {"hidden": 4, "deep": True, "value_encoding": "piecewise"}})


def _simulate(tables: list, dictionary: cg.FeatureDictionary, config: cg.SimulationConfig, audit: Path):
    return cg.simulate(tables, dictionary, config, audit_dir=audit, choose=False)


def _outcome(result) -> tuple:  # noqa: ANN001 - a SimulationResult
    weights = {n: [p.detach().clone() for p in m.active.task.model.parameters()] for n, m in result.hospitals.items()}
    return result.rounds, result.final, weights


def _same(a: tuple, b: tuple) -> bool:
    return a[:2] == b[:2] and all(
        all(torch.equal(x, y) for x, y in zip(a[2][n], b[2][n], strict=True)) for n in a[2])


@pytest.fixture(scope="module")
def dictionary() -> cg.FeatureDictionary:
    for name in THIRD_PARTY:
        __import__(name)
    return cg.FeatureDictionary.from_toml(EXAMPLES / "dictionary.toml")


def test_the_documented_calls_leave_the_host_process_as_they_found_it(dictionary, tmp_path, monkeypatch):
    import matplotlib
    from clinograph.sdk.model.load import load_exported
    from clinograph.secure.policy import InsecureOptionWarning

    cwd, temp = tmp_path / "cwd", tmp_path / "temp"  # the host's working and temporary folders: what is left in them
    cwd.mkdir()
    temp.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    torch.manual_seed(20260)  # the host's own choices, none of them Clinograph's
    np.random.seed(7)
    random.seed(3)
    previous_backend = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        before = _host_state()
        atexits = atexit._ncallbacks()
        changed = []
        tables = _tables(dictionary)
        changed += [f"ingest: {c}" for c in _changed(before, _host_state())]
        with pytest.raises(cg.SchemaError):
            cg.ingest(cg.read_table(EXAMPLES / "north.csv").head(20).assign(Sodium=140.0),
                      schema=cg.SiteSchema.from_toml(EXAMPLES / "north_schema.toml"), dictionary=dictionary)
        config = _config()
        result = _simulate(tables, dictionary, config, tmp_path / "run" / "audit")
        changed += [f"simulate: {c}" for c in _changed(before, _host_state())]
        assert cg.verify_audit_dir(result.audit_dir).ok
        cg.render_report(result.audit_dir, out=tmp_path / "run" / "report.html")
        cg.split_patients(tables[0], config=config)
        changed += [f"audit, report, split: {c}" for c in _changed(before, _host_state())]
        task = result.hospitals["north"].active.task  # section 8: predict, export, load the export
        task.predict_table(tables[0])
        signer = cg.Identity.generate("north")
        task.export(tmp_path / "model.safetensors", signer=signer)
        with pytest.warns(InsecureOptionWarning):
            load_exported(tmp_path / "model.safetensors", trusted=signer.public, insecure_untrusted_model=True)
        changed += [f"predict, export, load: {c}" for c in _changed(before, _host_state())]
        assert not changed, "\n".join(changed)
        assert atexit._ncallbacks() == atexits
        assert sorted(p.name for p in temp.iterdir()) == []
        assert sorted(p.name for p in cwd.iterdir()) == []  # the run's files beside its audit directory
        assert {p.name for p in (tmp_path / "run").iterdir()} >= {"audit", "privacy_state"}
    finally:
        matplotlib.use(previous_backend)


def test_two_simulations_in_one_process_give_what_each_gives_alone(dictionary, tmp_path):
    tables = _tables(dictionary, rows=40)
    first = _outcome(_simulate(tables, dictionary, _config(), tmp_path / "a1" / "audit"))
    _simulate(tables, dictionary, _config(seed=5), tmp_path / "b" / "audit")
    torch.manual_seed(99)  # and a host drawing from, and reseeding, the global generators in between
    np.random.seed(99)
    torch.rand(7)
    again = _outcome(_simulate(tables, dictionary, _config(), tmp_path / "a2" / "audit"))
    assert _same(first, again)

    out: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            out[seed] = _outcome(_simulate(tables, dictionary, _config(seed=seed), tmp_path / f"t{seed}" / "audit"))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in (0, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    assert _same(out[0], first)
    assert not _same(out[5], first)  # the seed moves the run: the comparison above can fail
