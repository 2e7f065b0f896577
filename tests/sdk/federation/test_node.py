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


def test_a_hospital_whose_data_is_an_ehr_export_is_built_from_it_where_it_is(tmp_path):
    """Before: the SuperNode read only table.csv + schema.toml, so a hospital whose data is an OMOP CDM, a
    MEDS dataset or a FHIR export could take part in a simulation (`clinograph simulate` reads source files)
    but not in a deployment. Now schema.toml may be its EHR source file, and the source is data-dir/source,
    source.duckdb, or the database URL in source.url."""
    import sys
    from pathlib import Path

    import tomli_w
    from clinograph.secure.transport.flower.keyset import init_keyset

    from clinograph.core.identity import Identity

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingest"))
    from cohort_exports import (
        example_cohort,
        write_dictionary,
        write_meds,
        write_omop,
        write_source_file,
    )

    data = tmp_path / "data"
    data.mkdir()
    write_dictionary(data / "d.toml")
    (data / "hospital.toml").write_text(tomli_w.dumps({"dictionary": "d.toml", "model": {"features": "shared"}}))
    write_source_file(data / "schema.toml", "omop", "north")
    with pytest.raises(ConfigError, match=r"schema.toml is an EHR source file \(\[omop\]\) but .* holds no source: put "
                                          r"the export at .*source"):
        check_data_dir({"data-dir": str(data)})
    (data / "source.url").write_text("not a url\n")
    with pytest.raises(ConfigError, match="source.url must hold one database URL"):
        check_data_dir({"data-dir": str(data)})
    (data / "source.url").unlink()
    cohort = example_cohort()
    write_omop(data / "source", cohort)
    check_data_dir({"data-dir": str(data)})
    keys = init_keyset(tmp_path / "keys", federation_id="fed", hospitals=["north", "south"],
                       superlink_hosts=["127.0.0.1"], superlink_port=19099)
    node = {"data-dir": str(data), "state-dir": str(tmp_path / "s"),
            "federation-file": str(keys.hospital_dirs["north"] / "federation.toml")}
    me = Identity.load("north", keys.hospital_dirs["north"] / "north.ed25519.pem")
    member = make_hospital(node_config=node, run_config={}, run_id=1, identity=me)
    assert member.setup.table.n_patients == 4  # the OMOP folder's cohort, ingested as `clinograph check` does
    assert set(member.setup.table.report.features_present) == {"age", "creatinine", "glucose", "heart_rate", "sex"}
    shutil.rmtree(data / "source")  # the same hospital as a MEDS dataset
    write_meds(data / "source", cohort)
    write_source_file(data / "schema.toml", "meds", "north")
    (data / "source.url").write_text("postgresql+psycopg://reader@db/cdm\n")
    with pytest.raises(ConfigError, match=r"source.url names a database, but schema.toml is a \[meds\] source"):
        check_data_dir({"data-dir": str(data)})
    (data / "source.url").unlink()
    shutil.move(data / "source" / "labels.parquet", data / "labels.parquet")  # [meds] labels: beside its file
    member = make_hospital(node_config=node, run_config={}, run_id=2, identity=me)
    assert member.setup.table.n_patients == 4
