"""render_report: a self-contained page whose sections all render (checked in headless Chromium)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from axe_check import describe, violations
from clinograph.secure.audit import AuditTrail, render_report

from clinograph.core.identity import Identity

SECTIONS = ["verification", "manifest", "insecure", "participation", "coverage", "privacy", "dag",
            "metrics", "feature-relevance", "artefacts"]
IMAGES = ["img-participation", "img-coverage", "img-privacy", "img-dag", "img-metrics-0",
          "img-feature-relevance"]
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def full_report(federation_dir, tmp_path_factory) -> Path:
    return render_report(federation_dir.directory, out=tmp_path_factory.mktemp("report") / "report.html")


def test_report_is_self_contained_and_has_every_section(full_report):
    html = full_report.read_text()
    for section in SECTIONS:
        assert f'<section id="{section}">' in html
    for img in IMAGES:
        assert re.search(rf'<img id="{img}" alt="[^"]*" src="data:image/png;base64,iVBORw0KGgo', html)
    assert not re.search(r'(src|href)="(https?:|//)', html)  # nothing external
    assert "<script" not in html
    assert 'id="verification-ok"' in html
    assert "ProtocolError: ledger entry is for round 0, not 1" in html  # rejection reason shown
    assert 'id="insecure-empty"' in html


def test_empty_sections_say_so_and_failures_are_shown(tmp_path):
    d = tmp_path / "a"
    with AuditTrail(d, identity=Identity.generate("server")) as trail:
        trail.record("insecure_option", {"option": "insecure_plaintext", "why": "demo <b>run</b>"})
    out = render_report(d, out=tmp_path / "r.html")
    html = out.read_text()
    for section in ["manifest", "participation", "coverage", "privacy", "dag", "metrics", "feature-relevance"]:
        assert f'id="{section}-empty"' in html
    assert "insecure_plaintext" in html and "<b>run</b>" not in html  # escaped
    (d / "audit.jsonl").write_bytes((d / "audit.jsonl").read_bytes().replace(b"demo", b"DEMO"))
    html = render_report(d, out=tmp_path / "r2.html").read_text()
    assert 'id="verification-failed"' in html and "content does not match its hash" in html


def test_a_resolved_default_is_shown_beside_the_manifest(tmp_path):
    d = tmp_path / "a"
    with AuditTrail(d, identity=Identity.generate("server")) as trail:
        trail.record("resolved_default", {"setting": "model.deep", "value": "false", "rule": "dp_default_model",
                                          "line": "model.deep = false under [privacy] <i>(shallow)</i>"})
    html = render_report(d, out=tmp_path / "r.html").read_text()
    assert "Settings the SDK resolved" in html and "dp_default_model" in html and "model.deep" in html
    assert "<i>(shallow)</i>" not in html and "&lt;i&gt;(shallow)&lt;/i&gt;" in html  # escaped
    with AuditTrail(tmp_path / "b", identity=Identity.generate("server")) as trail:
        trail.record("insecure_option", {"option": "insecure_plaintext", "why": "demo"})
    assert "Settings the SDK resolved" not in render_report(tmp_path / "b", out=tmp_path / "r2.html").read_text()


@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="chromium/chromedriver not installed (apt-get install -y chromium chromium-driver)")
def test_report_renders_in_headless_chromium(full_report, tmp_path):
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
            driver.get(full_report.as_uri())
            for section in SECTIONS:
                assert driver.find_element("id", section).is_displayed()
            for img in IMAGES:
                width = driver.execute_script(
                    "const i = document.getElementById(arguments[0]); return i.complete ? i.naturalWidth : 0;", img)
                assert width > 0, f"{img} did not load"
            assert "Verified:" in driver.find_element("id", "verification").text
            found = violations(driver)
            assert not found, describe(found)
            height = driver.execute_script("return document.body.scrollHeight")
            driver.set_window_size(1100, min(int(height) + 100, 8000))
            shot = tmp_path / "audit_report.png"
            assert driver.save_screenshot(str(shot))
            assert shot.stat().st_size > 10_000
            docs = REPO / "docs" / "audit_report.png"  # refreshed on request, not on every run
            if os.environ.get("CLINOGRAPH_UPDATE_SCREENSHOTS") == "1" or not docs.exists():
                docs.parent.mkdir(exist_ok=True)
                shutil.copyfile(shot, docs)
        finally:
            driver.quit()


@pytest.fixture(scope="module")
def two_runs_report(two_runs_dir, tmp_path_factory) -> Path:
    from clinograph.secure.audit.report import render_report as render

    fed, _ = two_runs_dir
    return render(fed.directory, out=tmp_path_factory.mktemp("report2") / "report.html",
                         trusted_server_key=fed.server.public.raw)


def test_runs_are_shown_separately_with_their_own_mode_participation_and_epsilon(two_runs_dir, two_runs_report):
    _, second = two_runs_dir
    html = two_runs_report.read_text()
    assert '<section id="runs">' in html and second in html
    assert '<article id="run-1">' in html and '<article id="run-2">' in html
    for section in SECTIONS[2:] + ["refusals", "release"]:
        assert f'<section id="{section}">' in html and f'<section id="run1-{section}">' in html
    run1, run2 = html.split('<article id="run-2">')
    assert "secure mode per round: masked" in run1 and "secure mode per round: ckks" in run2
    # run 2's latest ε is its own (1.0 at round 1), not run 1's larger figures
    assert ("<tr><th scope=\"row\">hosp-a</th><td>Gaussian</td><td>1.000</td><td>-</td><td>-</td><td>-</td><td>-</td><td>1e-05</td><td>1</td>"
            "<td>-</td><td>-</td><td>-</td><td>-</td><td>2</td><td>1</td><td>within budget</td>") in run2
    # a hospital whose budget is spent reads so, not "within budget"
    assert ("<tr><th scope=\"row\">hosp-c</th><td>no ledger entry in this run</td>" in run2
            and "out of the run: refused at round 1 (PrivacyBudgetExceeded: budget spent)" in run2)
    assert "hosp-b at stage 1: no reply to &#x27;stage&#x27; within 60 s (timeout 60 s)" in run2
    assert "PrivacyBudgetExceeded: budget spent" in run2 and "signed by the hospital" in run2
    assert "too_few_hospitals" in run2 and "none: the server holds no plaintext model" in run2
    assert 'id="signer-trusted"' in html


def test_every_chart_has_a_text_version_a_real_alt_and_no_empty_headers(full_report, two_runs_report):
    for page in (full_report, two_runs_report):
        html = page.read_text()
        images = re.findall(r'<img id="([^"]+)" alt="([^"]*)"', html)
        assert images
        for ident, alt in images:
            assert f'<table id="{ident}-data">' in html, ident
            assert len(alt) > 40 and any(ch.isdigit() for ch in alt), (ident, alt)
        assert '<th scope="col"></th>' not in html and "<th></th>" not in html
        assert "<caption>" in html


def _luminance(hex_colour: str) -> float:
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_text_colours_reach_wcag_aa_contrast():
    from clinograph.secure.audit.report import CSS

    for colour in re.findall(r"(?<![-\w])color:(#[0-9a-fA-F]{6})", CSS):
        ratio = (1.05) / (_luminance(colour) + 0.05)  # on white
        assert ratio >= 4.5, (colour, ratio)


def test_metric_names_are_defined():
    from clinograph.secure.audit.report import describe_metric

    assert describe_metric("auroc").startswith("area under the ROC curve")
    assert describe_metric("val_brier").endswith("on the validation split")
    assert "does not define it" in describe_metric("my_score")


@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="chromium/chromedriver not installed (apt-get install -y chromium chromium-driver)")
def test_new_sections_render_in_headless_chromium(two_runs_report):
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
            driver.get(two_runs_report.as_uri())
            for ident in ("runs", "run-1", "run-2", "refusals", "run1-refusals", "release", "run1-participation",
                          "img-participation-data", "img-privacy-data", "signer-trusted"):
                assert driver.find_element("id", ident).is_displayed(), ident
            for img in ("img-participation", "img-privacy", "run1-img-coverage", "run1-img-feature-relevance"):
                width = driver.execute_script(
                    "const i = document.getElementById(arguments[0]); return i.complete ? i.naturalWidth : 0;", img)
                assert width > 0, f"{img} did not load"
            assert "PrivacyBudgetExceeded" in driver.find_element("id", "refusals").text
            assert "Run 2 of 2 (latest)" in driver.find_element("id", "run-2").text
            # nothing was fetched from outside the page
            resources = driver.execute_script("return performance.getEntriesByType('resource').map(r => r.name)")
            assert all(r.startswith("data:") for r in resources), resources
            found = violations(driver)
            assert not found, describe(found)
        finally:
            driver.quit()
