"""axe-core (Deque's accessibility engine, the one browsers' audit tools run) inside the real
headless Chromium of the report tests.

``make axe`` installs the pinned npm package into ``.venv/axe`` (``make test`` does it first); nothing is
fetched at run time. :func:`violations` injects ``axe.min.js`` into the loaded page and returns
what ``axe.run`` reports as violations (every WCAG 2 A/AA and best-practice rule axe runs by
default).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AXE_JS = Path(os.environ.get("CLINOGRAPH_AXE_JS", ROOT / ".venv" / "axe" / "node_modules" / "axe-core" / "axe.min.js"))

RUN = """
const done = arguments[arguments.length - 1];
axe.run(document, {resultTypes: ['violations']})
   .then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                             targets: v.nodes.slice(0, 5).map(n => n.target.join(' '))}))))
   .catch(e => done('axe failed: ' + e));
"""


def violations(driver) -> list[dict]:  # noqa: ANN001 - a selenium WebDriver
    """axe-core's violations on the page ``driver`` shows (id, impact, help, up to 5 targets)."""
    if not AXE_JS.is_file():
        raise AssertionError(f"axe-core is not installed at {AXE_JS}: run `make axe` (npm install of the pinned "
                             "axe-core into .venv/axe), or set CLINOGRAPH_AXE_JS to an axe.min.js.")
    driver.set_script_timeout(60)
    driver.execute_script(AXE_JS.read_text())
    out = driver.execute_async_script(RUN)
    if isinstance(out, str):
        raise AssertionError(out)
    return out


def describe(found: list[dict]) -> str:
    return "; ".join(f"{v['id']} ({v['impact']}): {v['help']} at {', '.join(v['targets'])}" for v in found)
