"""sdk/federation/node.py: the SuperNode's default hospital, built from its data-dir files."""

from __future__ import annotations

import shutil

import pytest
from clinograph.sdk.datasets.alarm import DICTIONARY_PATH
from clinograph.sdk.federation.node import check_data_dir, make_hospital

from clinograph.core.errors import ConfigError


def test_the_data_dir_is_checked_at_start_every_problem_at_once(tmp_path):
    """A SuperNode started on a data-dir without its files came up, connected, and refused the
    server's hello of the next run with a traceback in its log; the run went on without it."""
    assert make_hospital.preflight is check_data_dir  # the launcher calls it before Flower starts
    with pytest.raises(ConfigError, match=r"data-dir .*nowhere is not a directory"):
        check_data_dir({"data-dir": str(tmp_path / "nowhere")})
    (tmp_path / "hospital.toml").write_text('dictionary = "dictionary.toml"\n[model]\nhiden = 3\n')
    with pytest.raises(ConfigError) as caught:
        check_data_dir({"data-dir": str(tmp_path)})
    said = str(caught.value)
    assert "cannot build the hospital (3 problem(s))" in said
    assert "\n      - model.hiden: unknown key" in said  # the hospital.toml's own list, indented under it
    assert "schema.toml: the file does not exist" in said and "holds no table.csv (or table.parquet)" in said
    (tmp_path / "hospital.toml").write_text('dictionary = "dictionary.toml"\n')
    shutil.copyfile(DICTIONARY_PATH, tmp_path / "dictionary.toml")
    (tmp_path / "schema.toml").write_text('site = "h1"\nformat = "wide"\npatient_id = "id"\nlabel = "y"\n')
    (tmp_path / "table.csv").write_text("id,y\n1,0\n")
    check_data_dir({"data-dir": str(tmp_path)})  # all there: the rows are read when a run starts
