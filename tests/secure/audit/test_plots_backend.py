"""The report's figures leave a host process's matplotlib backend and figures alone
(secure/audit/plots.py: no pyplot, no matplotlib.use)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_importing_and_drawing_the_report_figures_keeps_the_hosts_backend_and_figures():
    # a fresh process: the module's import is what once switched the backend (matplotlib.use("Agg"))
    code = textwrap.dedent("""
        import matplotlib
        matplotlib.use("svg")
        import matplotlib.pyplot as plt
        plt.figure()
        from clinograph.secure.audit import plots
        png = plots.metrics("auroc", {"north": ([1, 2], [0.5, 0.6])})
        print(matplotlib.get_backend(), plt.get_fignums(), png[:8])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["svg", "[1]", "iVBORw0K"], out.stdout + out.stderr  # iVBORw0K: a PNG in base64
