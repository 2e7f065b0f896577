"""The server is a lean install: no torch, PyG, Opacus, pgmpy or clinograph.sdk.

Two tiers. The fast tests block imports inside the full install: every clinograph.secure
module imports without those, and ``clinograph audit`` runs on the base dependencies alone
(an auditor's install: no Flower, TenSEAL or pycryptodome either). The slow tests use the
real thing, ``.venv-server`` built with ``pip install -e '.[server]'`` (fixture
``lean_server_python`` from tests/lean_env.py, which also checks that torch, torch_geometric,
opacus and pgmpy fail to import there): every server module imports there, and
``clinograph audit verify`` / ``audit report`` run there on an audit directory that this
(full) install wrote.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from lean_env import lean_server_python  # noqa: F401  (session fixture: .venv-server's python)

SECURE_MODULES = textwrap.dedent("""
    import importlib, pkgutil, sys
    import clinograph.secure as s
    names = [m.name for m in pkgutil.walk_packages(s.__path__, "clinograph.secure.")]
    for name in names:
        importlib.import_module(name)
    leaked = sorted(k for k in sys.modules if k.split(".")[0] in ("torch", "torch_geometric", "opacus", "pgmpy")
                    or k.startswith("clinograph.sdk"))
    assert not leaked, leaked
    print(len(names))
    print(" ".join(names))
""")

BLOCK = textwrap.dedent("""
    import sys
    BLOCKED = ("torch", "torch_geometric", "opacus", "pgmpy", "clinograph.sdk")
    class Block:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"blocked: {name}")
            return None
    sys.meta_path.insert(0, Block())
""")


def _secure_modules(python: str | Path, *, prelude: str = "") -> list[str]:
    out = subprocess.run([str(python), "-c", prelude + SECURE_MODULES], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    count, names = out.stdout.strip().splitlines()[-2:]
    assert int(count) >= 20
    return names.split()


def test_secure_imports_without_torch_or_sdk():
    """Fast: in the full install, with torch, PyG, Opacus, pgmpy and the SDK blocked."""
    names = _secure_modules(sys.executable, prelude=BLOCK)
    assert "clinograph.secure.transport.flower.serverapp" in names


@pytest.mark.slow
def test_every_secure_module_imports_in_the_server_install(lean_server_python):  # noqa: F811
    names = _secure_modules(lean_server_python)
    assert "clinograph.secure.transport.flower.serverapp" in names
    assert "clinograph.secure.audit.plots" in names


def write_audit_dir(directory: Path) -> Path:
    """A small, valid audit directory written the way the server writes one (two hospitals, two rounds)."""
    from clinograph.secure.audit import AuditTrail
    from clinograph.secure.messages import ClientReport, LedgerEntry
    from clinograph.secure.wire import seal

    from clinograph.core.identity import Identity

    dictionary_hash, fed = hashlib.sha256(b"dictionary v1").hexdigest(), "fed-lean"
    server = Identity.generate("server")
    hospitals = {n: Identity.generate(n) for n in ("hosp-a", "hosp-b")}
    tick = iter(range(10_000))
    trail = AuditTrail(directory, identity=server, clock=lambda: 1_700_000_000.0 + next(tick))
    trail.record("manifest", {
        "federation_id": fed, "server": {"name": server.name, "public_key": server.public.b64()},
        "hospitals": {n: h.public.b64() for n, h in sorted(hospitals.items())},
        "dictionary_hash": dictionary_hash, "secure_mode": "masked", "strategy": "module_wise",
        "dp_policy": {"required": True, "max_epsilon": 8.0, "delta": 1e-5, "min_noise_multiplier": 0.5,
                      "max_clip_norm": 1.0},
        "spec_digest": hashlib.sha256(b"spec").hexdigest(), "insecure_options": [], "environment": "development",
    })
    for r in range(2):
        plan = json.dumps({"round": r}).encode()
        trail.record("round_plan", {"round": r, "participants": sorted(hospitals),
                                    "plan_sha256": hashlib.sha256(plan).hexdigest(), "secure_mode": "masked",
                                    "strategy": "module_wise", "weights": dict.fromkeys(hospitals, 1.0),
                                    "spec_version": 0})
        trail.publish(f"round-{r:04d}/plan.json", plan, kind="round_plan")
        per_client = {}
        for i, (name, ident) in enumerate(sorted(hospitals.items())):
            ledger = LedgerEntry(round=r, noise_multiplier=1.0, sample_rate=0.01, steps=100 * (r + 1), clip_norm=1.0,
                                 accountant="rdp", epsilon=1.0 + r + 0.5 * i, delta=1e-5, budget_epsilon=8.0)
            report = ClientReport(federation_id=fed, round=r, client=name, dictionary_hash=dictionary_hash,
                                  ledger=ledger, metrics={"auroc": 0.7 + 0.05 * r + 0.01 * i})
            digest = trail.store_envelope(seal(report, ident), kind="client_report", sender=name)
            trail.record("update_accepted", {"round": r, "client": name, "report_sha256": digest})
            trail.record("ledger", {"client": name, **ledger.model_dump(mode="json")})
            per_client[name] = dict(report.metrics)
        trail.record("aggregate", {"round": r, "contributors": sorted(per_client),
                                   "module_coverage": {"gnn/layer1/has_feature": 2, "head/task": 2},
                                   "global_state_digest": hashlib.sha256(bytes([r])).hexdigest(),
                                   "modules_updated": 2})
        trail.record("metrics", {"round": r, "per_client": per_client})
        trail.publish(f"round-{r:04d}/global_model.json", f"model {r}".encode(), kind="global_model",
                      meta={"round": r})
    trail.close()
    return directory


@pytest.mark.slow
def test_audit_verify_and_report_run_in_the_server_install(lean_server_python, tmp_path):  # noqa: F811
    audit = write_audit_dir(tmp_path / "audit")  # written by this, the full, install
    clinograph = str(Path(lean_server_python).parent / "clinograph")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([clinograph, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)

    out = run("audit", "verify", str(audit))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("OK: ") and "entries verified" in out.stdout

    report = tmp_path / "report.html"
    out = run("audit", "report", str(audit), "--out", str(report))
    assert out.returncode == 0, out.stdout + out.stderr
    html = report.read_text()
    assert "<img" in html and "data:image/png;base64," in html  # matplotlib's figures, drawn on the server

    log = audit / "audit.jsonl"
    log.write_bytes(log.read_bytes().replace(b"hosp-b", b"hosp-x", 1))
    out = run("audit", "verify", str(audit))
    assert out.returncode == 1 and "FAILED" in out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_hospital_commands_name_the_missing_extra_in_the_server_install(lean_server_python, tmp_path):  # noqa: F811
    clinograph = str(Path(lean_server_python).parent / "clinograph")
    out = subprocess.run([clinograph, "demo", "--rounds", "1", "--out", str(tmp_path / "demo")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "clinograph demo needs the hospital install: pip install 'clinograph[hospital]'" in out.stderr
    assert "Traceback" not in out.stderr


AUDITOR_CLI = textwrap.dedent("""
    import sys
    BLOCKED = ("torch", "torch_geometric", "opacus", "pgmpy", "sklearn", "pandas", "flwr", "grpc", "tenseal",
               "Crypto")
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED or name.startswith("clinograph.sdk"):
                raise ModuleNotFoundError(f"blocked: {name}", name=name)
            return None
    sys.meta_path.insert(0, Block())
    from clinograph.cli import main
    sys.argv = ["clinograph", *sys.argv[1:]]
    main()
""")


def test_audit_commands_need_only_the_base_install(tmp_path):
    """Fast: an auditor's bare `pip install clinograph` (no server extra: no Flower, TenSEAL,
    pycryptodome) verifies and renders; simulated by blocking those in the full install."""
    audit = write_audit_dir(tmp_path / "audit")
    for args in (["audit", "verify", str(audit)], ["audit", "report", str(audit), "--out", str(tmp_path / "r.html")]):
        out = subprocess.run([sys.executable, "-c", AUDITOR_CLI, *args], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert (tmp_path / "r.html").stat().st_size > 10_000


# The lean server serving a federation to full-install hospitals, with real processes, is
# tests/integration/test_flower_deployment.py: its SuperLink and ServerApp run from this
# fixture's venv (checked through the ServerApp's "started" event: that install, no torch), the
# SuperNodes from the full install, for masked and for CKKS, with a hospital killed mid-round.
