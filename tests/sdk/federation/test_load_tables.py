"""simulate's load_tables: each hospital's table read as its site schema (or EHR source file) says."""


from clinograph.sdk.config import SimulationConfig
from clinograph.sdk.federation.simulate import load_tables


def test_a_hospitals_table_is_read_in_the_dialect_its_site_schema_declares(tmp_path):
    # before: `clinograph simulate` (and a SuperNode, predict) read every table with the detected dialect: a ';'
    # file mixing '72,5' and '80.5', which `check --decimal ,` accepted, was refused with a fix simulate had no
    # place for (read_table(..., decimal=","))
    for site in ("h1", "h2"):
        (tmp_path / f"{site}.csv").write_text("pid;hr;y\na;72,5;1\nb;80.5;0\n")
        (tmp_path / f"{site}.toml").write_text(f'site = "{site}"\npatient_id = "pid"\nlabel = "y"\ndecimal = ","\n')
    (tmp_path / "d.toml").write_text('name = "mini"\nversion = 1\n[[features]]\nid = "heart_rate"\nname = "HR"\n'
                                     'kind = "numeric"\nunit = "/min"\naliases = ["hr"]\nreference_low = 60\n'
                                     'reference_high = 100\n')
    config = SimulationConfig.model_validate({"dictionary": tmp_path / "d.toml", "hospitals": [
        {"site": s, "table": tmp_path / f"{s}.csv", "schema": tmp_path / f"{s}.toml"} for s in ("h1", "h2")]})
    tables, _ = load_tables(config)
    assert [sorted(t.value.tolist()) for t in tables] == [[72.5, 80.5]] * 2


def test_a_hospital_whose_patients_all_have_one_label_is_named(tmp_path):
    # before: `clinograph check` warned, `clinograph simulate` said nothing and trained on it
    from clinograph.sdk.federation.simulate import one_class_hospitals

    rows = {"h1": "a,72,1\nb,80,0\n", "h2": "c,75,0\nd,90,0\ne,61,0\n", "h3": "f,70,1\n"}
    for site, body in rows.items():
        (tmp_path / f"{site}.csv").write_text("pid,hr,y\n" + body)
        (tmp_path / f"{site}.toml").write_text(f'site = "{site}"\npatient_id = "pid"\nlabel = "y"\n')
    (tmp_path / "d.toml").write_text('name = "mini"\nversion = 1\n[[features]]\nid = "heart_rate"\nname = "HR"\n'
                                     'kind = "numeric"\nunit = "/min"\naliases = ["hr"]\nreference_low = 60\nreference_high = 100\n')
    config = SimulationConfig.model_validate({"dictionary": tmp_path / "d.toml", "hospitals": [
        {"site": s, "table": tmp_path / f"{s}.csv", "schema": tmp_path / f"{s}.toml"} for s in rows]})
    tables, _ = load_tables(config)
    assert one_class_hospitals(tables, config) == [("h2", 0, 3), ("h3", 1, 1)]


def test_hospitals_given_by_omop_fhir_and_meds_source_files_are_read_as_check_reads_them(tmp_path):
    # before: `clinograph simulate` read every [[hospitals]] schema as a site schema: an EHR source file was
    # refused as "omop: unknown key", so a federation of OMOP, FHIR and MEDS hospitals could not run
    import pytest
    from cohort_exports import (
        example_cohort,
        write_dictionary,
        write_fhir,
        write_meds,
        write_omop,
        write_source_file,
    )

    from clinograph.core.errors import SchemaError

    cohort = example_cohort()
    write_omop(tmp_path / "omop", cohort)
    write_fhir(tmp_path / "fhir", cohort, form="ndjson")
    write_meds(tmp_path / "meds", cohort)
    hospitals = [{"site": site, "table": tmp_path / kind, "schema": write_source_file(where / f"{kind}.toml", kind, site)}
                 for site, kind, where in (("north", "omop", tmp_path), ("south", "fhir", tmp_path),
                                           ("east", "meds", tmp_path / "meds"))]  # MEDS labels: beside its file
    config = SimulationConfig.model_validate({"dictionary": write_dictionary(tmp_path / "d.toml"),
                                              "hospitals": hospitals})
    tables, _ = load_tables(config)
    assert [(t.site, t.n_patients) for t in tables] == [("north", 4), ("south", 4), ("east", 4)]
    # every hospital has the features the others have (labs, age, sex; none reads the smoking status)
    assert {t.report.features_present for t in tables} == {("age", "creatinine", "glucose", "heart_rate", "sex")}
    hospitals[2]["site"] = "west"  # a source file naming another site is named, as a site schema is
    config = SimulationConfig.model_validate({"dictionary": tmp_path / "d.toml", "hospitals": hospitals})
    with pytest.raises(SchemaError, match=r"site 'west': its schema .*meds.toml says site 'east'"):
        load_tables(config)


def test_an_omop_hospital_given_by_a_database_url_is_read_from_that_database(tmp_path):
    # before: [[hospitals]] table was a Path: "duckdb:////abs/cdm.duckdb" (or postgresql+psycopg://...) folded to
    # "duckdb:/abs/cdm.duckdb", joined to the config's folder, and refused as an OMOP location that does not exist
    import duckdb
    from cohort_exports import (
        example_cohort,
        write_dictionary,
        write_meds,
        write_omop,
        write_source_file,
    )

    cohort = example_cohort()
    folder = write_omop(tmp_path / "omop", cohort)
    with duckdb.connect(str(tmp_path / "cdm.duckdb")) as con:
        for f in folder.iterdir():
            con.execute(f"CREATE TABLE {f.stem} AS SELECT * FROM read_csv_auto('{f}')")  # noqa: S608 - test files
    write_meds(tmp_path / "meds", cohort)
    write_dictionary(tmp_path / "d.toml")
    write_source_file(tmp_path / "omop.toml", "omop", "north")
    write_source_file(tmp_path / "meds" / "meds.toml", "meds", "east")
    (tmp_path / "sim.toml").write_text(
        'dictionary = "d.toml"\n'
        f'[[hospitals]]\nsite = "north"\ntable = "duckdb:///{tmp_path / "cdm.duckdb"}"\nschema = "omop.toml"\n'
        '[[hospitals]]\nsite = "east"\ntable = "meds"\nschema = "meds/meds.toml"\n')
    tables, _ = load_tables(SimulationConfig.from_toml(tmp_path / "sim.toml"))
    assert [(t.site, t.n_patients) for t in tables] == [("north", 4), ("east", 4)]
