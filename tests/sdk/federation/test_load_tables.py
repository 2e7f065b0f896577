"""simulate's load_tables: each hospital's table read as its site schema says."""

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
