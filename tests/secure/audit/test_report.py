"""render_report: a self-contained page whose sections all render (checked in headless Chromium)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from clinograph.secure.audit import AuditTrail, render_report
from clinograph.secure.identity import Identity

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
