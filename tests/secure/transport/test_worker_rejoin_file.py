"""A restarted SuperNode's worker reads back the run it was greeted for (``flower_run.json`` in its
state directory) only as a small regular JSON object; anything else means "no run to rejoin"."""

from __future__ import annotations

import json

import pytest
from clinograph.secure.transport.flower.worker import RUN_FILE, HospitalWorker

from clinograph.core.identity import Identity


@pytest.mark.parametrize("hostile", ["[" * 100_000 + "]" * 100_000, "char device", "[]"])
def test_a_hostile_run_file_rejoins_nothing_and_raises_nothing(tmp_path, hostile):
    """Adversarial rerun of issue 31: deep nesting escaped as a RecursionError from the worker's
    message handling, and a link to /dev/zero was read until memory ran out."""
    key = tmp_path / "h1.pem"
    Identity.generate("h1").save(key)
    built = []
    worker = HospitalWorker(node_config={"hospital": "h1", "state-dir": str(tmp_path), "key-file": str(key)},
                            factory=lambda **kw: built.append(kw) or object())
    run_file = tmp_path / RUN_FILE
    run_file.write_text(json.dumps({"format": "x"}))  # a file the worker reads: a control below
    if hostile == "char device":  # /dev/null: a read that stops (/dev/zero would not, before the fix)
        run_file.unlink()
        run_file.symlink_to("/dev/null")
    else:
        run_file.write_text(hostile)
    assert worker._rebuild(7) is None and built == []
