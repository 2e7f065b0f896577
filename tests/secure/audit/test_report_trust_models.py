"""The privacy section shows, under distributed DP, ε per hospital under each trust model."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from axe_check import describe, violations
from clinograph.secure.audit import AuditTrail, render_report
from clinograph.secure.messages import DistributedShare, LedgerEntry

from clinograph.core.identity import Identity

from .conftest import manifest

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def distributed_report(tmp_path_factory):
    directory = tmp_path_factory.mktemp("audit-ddp") / "run"
    server = Identity.generate("server")
    hospitals = {n: Identity.generate(n) for n in ("hosp-a", "hosp-b")}
    trail = AuditTrail(directory, identity=server)
    trail.record("manifest", manifest(server, hospitals))
    for r in range(2):
        for i, name in enumerate(sorted(hospitals)):
            share = DistributedShare(mechanism="skellam", min_honest=2, scale=13421.0, share_variance=1e9, dim=100,
                                     epsilon_alone=2.5 * (r + 1) + i)
            entry = LedgerEntry(round=r, noise_multiplier=8.0, sample_rate=1.0, steps=1, clip_norm=1.0,
                                accountant="skellam-h2", epsilon=0.75 * (r + 1), delta=1e-5, budget_epsilon=3.0,
                                share=share)
            trail.record("ledger", {"client": name, **entry.model_dump(mode="json")})
    trail.close()
    return render_report(directory, out=tmp_path_factory.mktemp("report-ddp") / "report.html")


def test_both_guarantees_are_in_the_privacy_section(distributed_report):
    html = distributed_report.read_text()
    start = html.index('id="privacy-trust"')
    table = html[start:html.index("</table>", start)]
    assert "ε if the others&#x27; noise were absent" in table and "minimum honest set h" in table
    assert "<th scope=\"row\">hosp-a</th><td>skellam</td><td>2</td><td>1.500</td><td>5.000</td><td>1</td>" in table
    assert "<th scope=\"row\">hosp-b</th><td>skellam</td><td>2</td><td>1.500</td><td>6.000</td><td>1</td>" in table


def test_the_privacy_spent_table_names_the_distributed_mechanism_and_both_epsilons(distributed_report):
    html = distributed_report.read_text()
    start = html.index('id="privacy-spent"')
    table = html[start:html.index("</table>", start)]
    assert ('<th scope="row">hosp-b</th><td>distributed skellam noise (each hospital adds a share)</td>'
            "<td>1.500</td><td>-</td><td>-</td><td>-</td><td>6.000</td><td>1e-05</td><td>8</td><td>1</td><td>1</td><td>1</td><td>skellam-h2</td>"
            "<td>3</td><td>1</td><td>within budget</td>") in table


def test_local_dp_reports_have_no_trust_model_table(federation_dir, tmp_path):
    html = render_report(federation_dir.directory, out=tmp_path / "r.html").read_text()
    assert 'id="privacy"' in html and 'id="privacy-trust"' not in html


@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and DRIVER),
                    reason="chromium/chromedriver not installed (apt-get install -y chromium chromium-driver)")
def test_trust_model_table_renders_in_headless_chromium(distributed_report):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory() as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-dev-shm-usage", "--no-first-run", f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
        try:
            driver.get(distributed_report.as_uri())
            table = driver.find_element("id", "privacy-trust")
            found = violations(driver)
            assert not found, describe(found)
            assert table.is_displayed()
            assert "hosp-b" in table.text and "6.000" in table.text
        finally:
            driver.quit()
