"""The held-out cohorts as an integrator writes them: every hospital's file ingests under its own
site schema, with every patient, label and feature block accounted for (no model is trained)."""

from __future__ import annotations

import pytest
from clinograph.sdk.federation.simulate import load_tables

import clinograph as cg
from research.heldout_tables.cohorts import BUILDERS, lymph_node, write_cohort

#: (patients kept, positives, features each hospital observes) -- fixed by the cuts' seeds
EXPECTED = {
    "breast_cancer": (
        569,
        212,
        {"bc_clinic": 20, "bc_district": 30, "bc_regional": 20, "bc_university": 30},
    ),
    "lymph_node": (531, 107, {"ln_community": 8, "ln_regional": 10, "ln_university": 10}),
    "stanford_heart": (95, 67, {"sh_early": 3, "sh_middle": 2, "sh_late": 3}),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))  # not child: pgmpy sampling costs ~4 s
def test_each_hospital_file_ingests_with_every_patient_and_label(tmp_path, name):
    cohort = BUILDERS[name]()
    tables, _ = load_tables(cg.SimulationConfig.from_toml(write_cohort(cohort, tmp_path)))
    patients, positives, features = EXPECTED[name]
    assert (cohort.patients, cohort.positives) == (patients, positives)
    assert sum(t.n_patients for t in tables) == patients
    assert sum(int(t.labels.sum()) for t in tables) == positives
    # observed nodes: a categorical feature counts one node a level (tumour grade: 3)
    assert {t.site: len(t.observed_nodes()) for t in tables} == features
    ignored = {t.site: t.report.ignored_columns for t in tables if t.report.ignored_columns}
    # only the registry's post-baseline columns (dates, recurrence follow-up) are left out, on purpose
    assert ignored == (
        {"ln_regional": ("diagdateb", "recdate", "deathdate", "rectime", "censrec")}
        if name == "lymph_node"
        else {}
    )


def test_the_survival_form_keeps_every_patient_and_event(tmp_path):
    cohort = lymph_node("survival")
    tables, _ = load_tables(cg.SimulationConfig.from_toml(write_cohort(cohort, tmp_path)))
    assert sum(t.n_patients for t in tables) == 686 and cohort.dropped_censored == 0
    assert sum(int(t.survival.event.sum()) for t in tables) == cohort.positives == 171
