"""sdk/federation/node.py: the SuperNode's default hospital, built from its data-dir files."""

from __future__ import annotations

import shutil

import pytest
from clinograph.sdk.datasets.alarm import DICTIONARY_PATH
from clinograph.sdk.federation.node import check_data_dir, make_hospital

from clinograph.core.errors import ConfigError


def _north(tmp_path, data):
    """(node config, identity) of hospital north of a two-hospital keyset, its data-dir ``data``."""
    from clinograph.secure.transport.flower.keyset import init_keyset

    from clinograph.core.identity import Identity

    keys = init_keyset(tmp_path / "keys", federation_id="fed", hospitals=["north", "south"],
                       superlink_hosts=["127.0.0.1"], superlink_port=19099)
    node = {"data-dir": str(data), "state-dir": str(tmp_path / "s"),
            "federation-file": str(keys.hospital_dirs["north"] / "federation.toml")}
    return node, Identity.load("north", keys.hospital_dirs["north"] / "north.ed25519.pem")


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
    check_data_dir({"data-dir": str(tmp_path), "hospital": "h1"})
    with pytest.raises(ConfigError, match=r"schema.toml names site 'h1', but this SuperNode serves hospital 'h2' "
                                          r"\(--node-config hospital, its key's name\).*write site = 'h2' there"):
        check_data_dir({"data-dir": str(tmp_path), "hospital": "h2"})  # was found only at a run's hello


def test_a_hospital_whose_data_is_an_ehr_export_is_built_from_it_where_it_is(tmp_path, caplog):
    """Before: the SuperNode read only table.csv + schema.toml, so a hospital whose data is an OMOP CDM, a
    MEDS dataset or a FHIR export could take part in a simulation (`clinograph simulate` reads source files)
    but not in a deployment. Now schema.toml may be its EHR source file, and the source is data-dir/source,
    source.duckdb, or the database URL in source.url."""

    import tomli_w
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
                                          r"the OMOP CDM at .*source \(a folder of its table files\)"):
        check_data_dir({"data-dir": str(data)})
    (data / "source.url").write_text("not a url\n")
    with pytest.raises(ConfigError, match="source.url must hold one database URL"):
        check_data_dir({"data-dir": str(data)})
    (data / "source.url").unlink()
    cohort = example_cohort()
    write_omop(data / "source", cohort)
    check_data_dir({"data-dir": str(data)})
    node, me = _north(tmp_path, data)
    caplog.set_level("INFO", logger="clinograph.sdk.federation.node")
    member = make_hospital(node_config=node, run_config={}, run_id=1, identity=me)
    assert member.setup.table.n_patients == 4  # the OMOP folder's cohort, ingested as `clinograph check` does
    # the hospital's log says what it read (session 53: nothing, until a round's answer)
    assert f"read 4 patient(s) from the OMOP export at {data / 'source'} (5 feature(s) observed)" in caplog.messages
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


def test_an_ehr_source_that_cannot_be_opened_is_refused_at_start_not_at_the_runs_hello(tmp_path):
    """Before: the SuperNode's start checked only that data-dir/source (or source.url) existed. A database that
    refused the connection, or an export of another format than schema.toml's section, was found at the next
    run's hello: the hospital refused it, and `clinograph run` failed 'Only 0 hospital(s) proved they serve an
    enrolled hospital ... Check the SuperNodes' logs and key files'. Now the source is opened at start, as the
    reader will open it, reading no row; a source.url's password is never shown."""

    import tomli_w
    from cohort_exports import example_cohort, write_dictionary, write_omop, write_source_file

    data = tmp_path / "data"
    data.mkdir()
    write_dictionary(data / "d.toml")
    (data / "hospital.toml").write_text(tomli_w.dumps({"dictionary": "d.toml"}))
    write_omop(data / "source", example_cohort())
    write_source_file(data / "schema.toml", "meds", "north")  # a MEDS source file over an OMOP folder
    with pytest.raises(ConfigError, match=r"(?s)1 problem.*MEDS dataset .*source has no Parquet shards under data/.*"
                                          r"source looks like an OMOP CDM .*but the source file is \[meds\]: write the "
                                          r"source file's \[omop\] section"):
        check_data_dir({"data-dir": str(data)})
    write_source_file(data / "schema.toml", "omop", "north")
    (data / "source.url").write_text("postgresql+psycopg://reader:TopS3cret@127.0.0.1:1/cdm\n")
    with pytest.raises(ConfigError, match=r"holds 2 EHR sources \(source.url, source\); the SuperNode reads one"):
        check_data_dir({"data-dir": str(data)})  # one of them was ignored, silently
    shutil.rmtree(data / "source")
    (data / "source.url").chmod(0o644)
    with pytest.raises(ConfigError, match=r"source.url holds a database password and group or others may read it "
                                          r"\(mode 0644\): chmod 600 .*source.url, or remove the password") as caught:
        check_data_dir({"data-dir": str(data)})  # as libpq reads ~/.pgpass
    assert "TopS3cret" not in str(caught.value)
    (data / "source.url").chmod(0o600)
    with pytest.raises(ConfigError, match=r"Cannot connect to the OMOP database postgresql\+psycopg://reader:\*\*\*@"
                                          r"127.0.0.1:1/cdm") as caught:
        check_data_dir({"data-dir": str(data)})  # nothing listens on port 1: refused at once
    assert "TopS3cret" not in str(caught.value)
    (data / "source.url").unlink()
    write_omop(data / "source", example_cohort())
    (data / "source" / "measurement.csv").unlink()
    with pytest.raises(ConfigError, match=r"OMOP table 'measurement' is missing"):
        check_data_dir({"data-dir": str(data)})
    (data / "schema.toml").write_text((data / "schema.toml").read_text() + "typo = 1\n")
    with pytest.raises(ConfigError) as caught:
        check_data_dir({"data-dir": str(data)})
    assert "typo: unknown key" in str(caught.value) and "table.csv" not in str(caught.value)  # not 'no table.csv'
    write_source_file(data / "schema.toml", "omop", "north")  # names a feature the dictionary lacks: at start too
    (data / "schema.toml").write_text((data / "schema.toml").read_text().replace('age = "age"', 'age = "agee"'))
    with pytest.raises(ConfigError, match=r"(?s)2 problem\(s\).*schema.toml: The \[omop\] section does not fit the "
                                          r"dictionary.*'agee' is not a feature of the dictionary cohort.*"
                                          r"OMOP table 'measurement' is missing"):
        check_data_dir({"data-dir": str(data)})  # every problem at once


def test_a_fhir_export_in_one_file_is_read_by_its_suffix(tmp_path):
    """Before: one bulk NDJSON file at data-dir/source (the docs: 'a FHIR export folder or file') passed the start
    check and was parsed as one JSON document at the run's hello: 'FHIR input source is not valid JSON ... Export
    it again'. Now the file is named by its format (source.json, source.ndjson, source.ndjson.gz)."""

    import tomli_w
    from cohort_exports import example_cohort, write_dictionary, write_fhir, write_source_file


    data = tmp_path / "data"
    data.mkdir()
    write_dictionary(data / "d.toml")
    (data / "hospital.toml").write_text(tomli_w.dumps({"dictionary": "d.toml", "model": {"features": "shared"}}))
    write_source_file(data / "schema.toml", "fhir", "north")
    export = write_fhir(tmp_path / "bulk", example_cohort(), form="ndjson")
    (data / "source").write_text("".join(f.read_text() for f in sorted(export.glob("*.ndjson"))))
    with pytest.raises(ConfigError, match=r"source is one file; a FHIR file is read by its format's suffix: rename it "
                                          r".*source.json \(a Bundle or one resource\) or source.ndjson"):
        check_data_dir({"data-dir": str(data)})
    (data / "source").rename(data / "source.ndjson")
    check_data_dir({"data-dir": str(data)})
    node, me = _north(tmp_path, data)
    member = make_hospital(node_config=node, run_config={}, run_id=1, identity=me)
    assert member.setup.table.n_patients == 4
