"""The auditor's six questions, answered from the rendered page after real runs (headless Chromium).

Each scenario is a real federation (``tests/secure/runtime/crash_harness.py``: four hospitals,
the server through ``build_server``, a journal, real DP ledgers), run in a child process so a
crash can be a real SIGKILL: a clean masked run, a crash and resume, a budget refusal that ends
the run, a CKKS run and an extension of an ended run; and ``simulate()`` (the one federation run
the Flower ServerApp also drives) of the four default candidate models, for model selection. The report of each is rendered in headless
Chromium and the page's *text* must answer: who took part; what was refused, dropped or aborted
and why; privacy spent (ε, δ, mechanism); which model was released and whether it is in the
trail; whether the trail verifies and under which key; which secure mode with which parameters.
(The existing report tests run no axe-core, so neither does this one.)
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest
from clinograph.secure.audit.report import render_report

from clinograph.core.identity import Identity

HERE = Path(__file__).resolve().parents[1] / "runtime"
APP = Path(__file__).resolve().parents[3] / "examples" / "flower_deployment" / "app"
sys.path.insert(0, str(HERE))

import crash_harness  # noqa: E402
from axe_check import describe, violations  # noqa: E402

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
HOSPITALS = crash_harness.HOSPITALS
pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="chromium/chromedriver not installed "
                                 "(apt-get install -y chromium chromium-driver)")]


def _run(work: Path, *args: str) -> int:
    """One harness run in a child process (:func:`crash_harness.run_in_child`); its exit code."""
    return crash_harness.run_in_child(work, *args)


def _payloads(work: Path, kind: str) -> list[dict]:
    lines = (work / "audit" / "audit.jsonl").read_text().splitlines()
    return [e["payload"] for e in map(json.loads, filter(None, lines)) if e["kind"] == kind]


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scenarios")
    assert _run(root / "clean", "--rounds", "2") == 0
    assert _run(root / "crash", "--rounds", "2", "--kill", "stage 2") == -signal.SIGKILL
    assert _run(root / "crash", "--rounds", "2") == 0
    assert _run(root / "budget", "--rounds", "4", "--budget", "2.5") == 0  # ε 2.13, 2.41, then 2.61 > 2.5
    assert _run(root / "ckks", "--rounds", "2", "--mode", "ckks") == 0
    assert _run(root / "extended", "--rounds", "1") == 0
    assert _run(root / "extended", "--rounds", "2") == 0  # the ended federation goes on to 2 rounds
    return {name: root / name for name in ("clean", "crash", "budget", "ckks", "extended")}


class Page:
    """The rendered report of one scenario: its text, whole and by element id."""

    def __init__(self, driver, work: Path, out: Path):
        key = Identity.load("server", work / "keys" / "server.pem").public.raw
        self.fingerprint = hashlib.sha256(key).hexdigest()
        render_report(work / "audit", out=out, trusted_server_key=key)
        driver.get(out.as_uri())
        self.driver = driver
        self.text = driver.find_element("tag name", "body").text
        found = violations(driver)  # every scenario's report is axe-core clean
        assert not found, f"{out.name}: {describe(found)}"

    def __getitem__(self, ident: str) -> str:
        element = self.driver.find_element("id", ident)
        assert element.is_displayed(), ident
        return element.text


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory() as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-dev-shm-usage", "--no-first-run", f"--user-data-dir={profile}",
                     "--window-size=1100,1400"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def _verified_and_signed(page: Page) -> None:
    """Question 5: the trail verifies and is signed by the trusted server key (named by fingerprint)."""
    assert "Verified:" in page["verification"] and "Signer checked" in page["verification"]
    assert page.fingerprint in page["verification"]


def _took_part(page: Page, rounds: list[int]) -> None:
    """Question 1: who contributed in each round, by name."""
    text = page["participation"]
    for r in rounds:
        assert any(line.startswith(f"{r} ") and all(h in line for h in HOSPITALS) for line in text.splitlines()), r


def _privacy(page: Page, *, epsilon: str, mechanism: str = "subsampled Gaussian (DP-SGD)") -> str:
    """Question 3: ε, δ, σ, clip, sampling rate, accountant and mechanism per hospital."""
    table = page["privacy-spent"]
    assert "ε (cumulative)" in table and "δ" in table and "σ (noise multiplier)" in table
    for h in HOSPITALS:
        row = next(line for line in table.splitlines() if line.startswith(f"{h} "))
        # ε composed, of DP-SGD alone (the same: no model selection nor set-up sum here), of each release kind alone (0)
        assert f"{mechanism} {epsilon} {epsilon} 0.000 0.000 - 1e-05 1 1 0.1 1 rdp" in row, row
    return table


def _masked_mode(page: Page) -> None:
    """Question 6: masked mode with its neighbours, threshold, clip and word bits."""
    text = page["secure-mode"]
    assert "Masked secure aggregation" in text
    for label in ("pairwise-mask neighbours k", "reconstruction threshold t (Shamir)",
                  "clip (per-value bound of an update) 1.0", "word bits 32", "minimum hospitals a round 3"):
        assert label in text, label


def _released(page: Page, work: Path) -> None:
    """Question 4: the released model's digest, and that its bytes are in the verified trail."""
    release = _payloads(work, "release")[-1]
    text = page["release"]
    assert release["model_sha256"] in text and "model in the trail yes" in text
    assert release["global_state_digest"] in text


def test_clean_masked_run(scenarios, browser, tmp_path):
    work = scenarios["clean"]
    page = Page(browser, work, tmp_path / "clean.html")
    _verified_and_signed(page)
    _took_part(page, [0, 1])
    assert "No round was aborted in this run." in page["faults"]
    assert "No hospital refused a message in this run." in page["refusals"]
    _privacy(page, epsilon="2.413")
    assert "within budget" in page["privacy-spent"]
    assert "ε at most 1e+06 at δ = 1e-05; noise multiplier σ at least 0.5" in page["manifest"] \
        or "No DP policy" in page["manifest"]
    _masked_mode(page)
    _released(page, work)
    assert "completed" in page["release"]
    assert "Round numbers restart in every run" not in page.text


def test_crash_and_resume(scenarios, browser, tmp_path):
    work = scenarios["crash"]
    page = Page(browser, work, tmp_path / "crash.html")
    _verified_and_signed(page)
    aborted = _payloads(work, "round_aborted")
    assert [a["round"] for a in aborted] == [0] and aborted[0]["reason"].startswith("server restart")
    # Question 2: the aborted round and why, in the run that resumed; the resumed run names the one it continues
    faults = page["faults"]
    assert "0 server restart" in faults and "nothing of it was aggregated or released" in faults
    assert "Resumes run 1 after a server restart" in page["continues"]
    assert "Resumes run 1" in page["runs"]
    _took_part(page, [1, 2])  # the aborted round's number is spent
    _privacy(page, epsilon="2.607")  # three steps: the hospitals trained in the aborted round too
    _masked_mode(page)
    _released(page, work)


def test_budget_refusal_ends_the_run_as_planned(scenarios, browser, tmp_path):
    work = scenarios["budget"]
    page = Page(browser, work, tmp_path / "budget.html")
    _verified_and_signed(page)
    _took_part(page, [0, 1])
    refusals = page["refusals"]
    for h in HOSPITALS:  # question 2: each hospital's signed refusal, with its reason
        assert f"2 plan {h} PrivacyBudgetExceeded: Hospital '{h}': round 2 would take ε" in refusals
    assert "signed by the hospital" in refusals
    assert "2 Only 0 client(s) completed stage" in page["faults"] and "hospitals refused it for good" in page["faults"]
    table = _privacy(page, epsilon="2.413")
    assert "within budget" not in table
    assert table.count("out of the run: refused at round 2 (PrivacyBudgetExceeded") == len(HOSPITALS)
    end = page["release"]
    assert "too_few_hospitals" in end and "2 of 4 planned" in end
    _released(page, work)  # round 1's model, released before the planned end
    _masked_mode(page)


def test_ckks_run_names_what_identifies_its_release(scenarios, browser, tmp_path):
    work = scenarios["ckks"]
    page = Page(browser, work, tmp_path / "ckks.html")
    _verified_and_signed(page)
    _took_part(page, [0, 1])
    _privacy(page, epsilon="2.413")
    mode = page["secure-mode"]
    preset = crash_harness.FederationSection(id="f", secure_mode="ckks", strategy="fedavg").ckks_preset
    assert f"CKKS preset {preset}" in mode and "the server holds only the public parameters: no secret" in mode
    holders = _payloads(work, "ckks_key_holders")[-1]
    assert "who holds the secret key " + ", ".join(holders["holders"]) + " (this run's key ceremony)" in mode
    assert holders["preset"] == preset and holders["context_digest"] in mode
    assert "hospitals that encrypted and decrypted under it h1, h2, h3, h4" in mode
    release = _payloads(work, "release")[-1]
    assert release["model_sha256"] is None and release["ciphertext_sha256"] in page["release"]
    assert "the server holds no plaintext model" in page["release"]
    assert "0" * 64 not in page["release"]  # not the all-zero "state digest" of a model it does not hold
    assert release["ciphertext_sha256"] == _payloads(work, "aggregate")[-1]["ciphertext_sha256"]


def test_extended_federation_links_the_runs(scenarios, browser, tmp_path):
    work = scenarios["extended"]
    page = Page(browser, work, tmp_path / "extended.html")
    _verified_and_signed(page)
    assert "Extends run 1: the ended federation goes on as its run 2 after 1 round(s), now 2 planned, " \
           "continuing at round 1" in page["continues"]
    _took_part(page, [1])
    _privacy(page, epsilon="2.413")
    _masked_mode(page)
    _released(page, work)


@pytest.fixture(scope="module")
def candidates(tmp_path_factory) -> Path:
    """``simulate()`` of the deployment example's federation: four candidates, one round each."""
    import tomllib

    from clinograph.sdk.config import SimulationConfig
    from clinograph.sdk.federation.simulate import load_tables, simulate

    sys.path.insert(0, str(APP))
    from clinograph_flower_app.prepare import prepare

    root = tmp_path_factory.mktemp("candidates")
    sites, hospitals = root / "sites", ["h1", "h2", "h3"]
    prepare(sites, hospitals=hospitals, patients=120, dp=False, seed=0, federation_id="fed-sim",
            audit_dir=root / "unused")
    hospital = tomllib.loads((sites / "h1" / "data" / "hospital.toml").read_text())
    server = tomllib.loads((sites / "server" / "server.toml").read_text())
    config = SimulationConfig.model_validate({
        **hospital, "dictionary": str(sites / "h1" / "data" / "dictionary.toml"),
        "federation": {**server["federation"], "rounds": 1}, "output": str(root / "sim"),
        "hospitals": [{"site": h, "table": str(sites / h / "data" / "table.csv"),
                       "schema": str(sites / h / "data" / "schema.toml")} for h in hospitals]})
    tables, dictionary = load_tables(config)
    simulate(tables, dictionary, config, audit_dir=root / "audit")
    return root


def test_model_selection_names_the_chosen_candidate_and_its_released_model(candidates, browser, tmp_path):
    out = tmp_path / "candidates.html"
    render_report(candidates / "audit", out=out)
    browser.get(out.as_uri())
    chosen = _payloads(candidates, "model_chosen")[-1]
    selected = _payloads(candidates, "model_selected")
    releases = _payloads(candidates, "release")
    assert len(selected) == len(releases) == len(chosen["candidates"]) == 4  # one run per candidate
    index = [c["name"] for c in chosen["candidates"]].index(chosen["chosen"])  # candidates run in this order
    text = browser.find_element("id", "selection").text
    assert f"Chosen candidate: {chosen['chosen']}." in text and f"{chosen['chosen']} (chosen)" in text
    assert (f"It was trained in run {index + 1}, which released model SHA-256 {releases[index]['model_sha256']}: "
            "the federation's released model.") in text
    kept = browser.find_element("id", f"run{index + 1}-selection").text
    assert (f"Kept round {selected[index]['round']}: the global model after {selected[index]['round']} training "
            "round(s), with the lowest federated validation loss") in kept
    assert "0-1 (round 1: scoring the last model, no training)" in browser.find_element("id", "runs").text
    assert "Round numbers restart in every run" not in browser.find_element("id", "runs").text
    found = violations(browser)
    assert not found, describe(found)


def test_the_accessibility_check_can_fail(browser, tmp_path):
    # axe-core must report what it exists to catch: an image without a text alternative, a form
    # field without a label and text below WCAG AA contrast.
    page = tmp_path / "broken.html"
    page.write_text('<!doctype html><html lang="en"><head><title>t</title></head><body><main>'
                    '<img src="x.png"><input type="text">'
                    '<p style="color:#bbb;background:#fff">faint</p></main></body></html>')
    browser.get(page.as_uri())
    ids = {v["id"] for v in violations(browser)}
    assert {"image-alt", "label", "color-contrast"} <= ids, ids
