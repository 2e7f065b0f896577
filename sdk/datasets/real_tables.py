"""Real clinical tables cut into hospitals: the real-data benchmark's federations.

Two cohorts that ``lifelines`` ships offline (Davidson-Pilon, lifelines; the data are public):

- ``lung``: NCCTG advanced lung cancer (Loprinzi et al. 1994), 228 patients from 18
  institutions. The institution column ``inst`` decides the hospital (institutions dealt to 3
  hospitals by size, largest first, round robin). Label: death within 365 days.
- ``gbsg2``: German Breast Cancer Study Group 2 (Schumacher et al. 1994), 686 patients, no
  centre column: cut into 4 hospitals of different size with an age-dependent referral pattern
  (older patients go to the larger centres more often). Label: recurrence or death within 3
  years (1095 days).

- ``kidney`` (binary form only): kidney transplant recipients (Klein & Moeschberger 1997,
  section 1.7; lifelines ``load_kidney_transplant``), 863 patients, no centre column: cut into
  3 hospitals (25/35/40 %) with an age-dependent referral pattern like GBSG2's. Label: death
  within 3 years (1095 days). Three features only (age, sex, race); one hospital does not
  record race. Added in issue 15, session 6, so the per-federation model choice is not judged
  on the two cohorts it was developed on.

- ``diabetes`` (binary form only): the diabetes cohort of Efron et al. 2004 (Least Angle
  Regression), 442 patients, as scikit-learn ships it unscaled (``load_diabetes(scaled=False)``):
  age, sex, BMI, mean arterial pressure and six blood serum measurements; the outcome is a
  quantitative measure of disease progression one year after baseline. Label: progression above
  140, about the cohort median (the threshold was fixed before any model ran). No centre column:
  cut into 3 hospitals with a BMI-dependent referral pattern (heavier patients go to the
  university hospital more often). One hospital reports cholesterol, LDL, HDL and glucose in
  mmol/L (converted back by the unit machinery with the analytes' molar masses), one has no
  extended lipid panel (no LDL, no TC/HDL ratio). Added in issue 15, session 7, so the SDK's
  defaults are not judged on the cohorts they were developed on only.

- ``larynx`` (binary form only): laryngeal cancer (Kardaun 1983; Klein & Moeschberger 1997,
  section 1.8; lifelines ``load_larynx``), 90 patients: age and disease stage (I-IV). Label: death
  within 3 years of diagnosis. No centre column: cut into 3 hospitals (30/30/40 %) with a
  stage-dependent referral pattern (advanced stages go to the university hospital more often);
  one hospital codes the stage 1-4, one I-IV, one as "stage 1" ... "stage 4". About 30 patients
  a hospital, so about 6 validation and 6 test patients each: added in session 10 as the
  smallest federation the defaults must survive, not as a cohort to tune on.

- ``rossi`` (binary form only): recidivism of 432 men released from Maryland state prisons
  (Rossi, Berk & Lenihan 1980; lifelines ``load_rossi``), every man followed for 52 weeks: age,
  race, work experience, marital status, parole, prior convictions and the randomised financial
  aid. Label: re-arrest within the year (114 positives). Not clinical, but a real cohort with a
  binary outcome at a fixed horizon. No centre column: cut into 3 sites (30/30/40 %) with a
  prior-conviction-dependent pattern. Added in issue 30 as a table the DP default was NOT chosen
  on (research/private_selection/README.md, the held-out confirmation).

Two forms of each cohort (``cohort_tables(name, form=...)``):

- ``binary`` (horizon form): censoring is handled honestly: a patient censored *before* the
  horizon has an unknown label and is dropped (counted in
  :attr:`CohortTables.censored_before_horizon`); a patient followed past it is a negative even if
  censored later; an event before it is a positive.
- ``survival`` (time-to-event form): every patient is kept; each hospital's site schema declares
  ``[survival]`` with its own time and event column names and its own time unit (days, weeks,
  months or years, converted by the unit machinery), and some code the event their own way.
  :data:`SURVIVAL_TARGETS` gives the public hazard intervals and horizon of each cohort.

Each hospital has its own column names, codings (yes/no vs 1/0, I/II/III vs 1/2/3), units where
the dictionary converts them (Karnofsky score as a percentage or a fraction) and missing blocks
(a hospital without receptor assays, one without tumour grading, one without the patient
questionnaire). The feature dictionary and the site schemas are generated here, in code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..ontology.dictionary import Feature, FeatureDictionary
from ..ontology.schema import ColumnMap, SiteSchema, SurvivalColumns

COHORTS = ("lung", "gbsg2", "kidney", "diabetes", "larynx", "rossi")
#: cohorts that have a survival form (SURVIVAL_TARGETS)
SURVIVAL_COHORTS = ("lung", "gbsg2")


@dataclass(frozen=True)
class SiteSpec:
    """One hospital: its name, local column names, units, codings and the features it lacks."""

    site: str
    renames: tuple[tuple[str, str], ...] = ()
    units: tuple[tuple[str, str], ...] = ()
    codings: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = ()
    lacks: tuple[str, ...] = ()


@dataclass(frozen=True)
class CohortTables:
    """A cohort cut into hospitals: the dictionary, each (local table, site schema), and the
    label definition's bookkeeping."""

    name: str
    task: str
    dictionary: FeatureDictionary
    hospitals: tuple[tuple[pd.DataFrame, SiteSchema], ...]
    patients: int
    censored_before_horizon: int
    positives: int
    form: str = "binary"


def larynx_dictionary() -> FeatureDictionary:
    """Canonical features of the larynx cancer cohort (stage: AJCC I-IV)."""
    return FeatureDictionary(name="clinograph-lifelines-larynx", version=1, features=(
        _num("age", "Age at diagnosis", "years", 40, 80, 0, 120),
        Feature(id="stage", name="Disease stage", kind="categorical", levels=("I", "II", "III", "IV")),
    ))


def _num(fid: str, name: str, unit: str, lo: float, hi: float, pmin: float, pmax: float, **kw) -> Feature:
    return Feature(id=fid, name=name, kind="numeric", unit=unit, reference_low=lo, reference_high=hi,
                   physical_min=pmin, physical_max=pmax, **kw)


def lung_dictionary() -> FeatureDictionary:
    """Canonical features of the NCCTG lung cohort (reference ranges: clinical conventions)."""
    return FeatureDictionary(name="clinograph-lifelines-lung", version=1, features=(
        _num("age", "Age", "years", 40, 80, 0, 120),
        Feature(id="female", name="Female sex", kind="binary"),
        _num("ecog_physician", "ECOG performance score (physician)", "1", 0, 2, 0, 5),
        _num("karnofsky_physician", "Karnofsky score (physician)", "%", 50, 100, 0, 100),
        _num("karnofsky_patient", "Karnofsky score (patient)", "%", 50, 100, 0, 100),
        _num("meal_calories", "Calories consumed at meals", "kcal", 500, 2000, 0, 10000),
        _num("weight_loss", "Weight loss in the last six months", "lb", -10, 30, -100, 200),
    ))


def gbsg2_dictionary() -> FeatureDictionary:
    """Canonical features of the GBSG2 breast-cancer cohort."""
    return FeatureDictionary(name="clinograph-lifelines-gbsg2", version=1, features=(
        _num("age", "Age", "years", 30, 70, 0, 120),
        Feature(id="hormone_therapy", name="Hormonal therapy", kind="binary"),
        Feature(id="postmenopausal", name="Postmenopausal", kind="binary"),
        _num("tumour_size", "Tumour size", "mm", 10, 50, 0, 200),
        Feature(id="tumour_grade", name="Tumour grade", kind="categorical", levels=("I", "II", "III")),
        _num("positive_nodes", "Positive lymph nodes", "1", 0, 10, 0, 100),
        _num("progesterone_receptor", "Progesterone receptor", "fmol/mg", 0, 200, 0, 10000),
        _num("oestrogen_receptor", "Oestrogen receptor", "fmol/mg", 0, 200, 0, 10000),
    ))


def kidney_dictionary() -> FeatureDictionary:
    """Canonical features of the kidney transplant cohort."""
    return FeatureDictionary(name="clinograph-lifelines-kidney", version=1, features=(
        _num("age", "Age at transplant", "years", 20, 65, 0, 120),
        Feature(id="female", name="Female sex", kind="binary"),
        Feature(id="black", name="Black race", kind="binary"),
    ))


def rossi_dictionary() -> FeatureDictionary:
    """Canonical features of the Rossi recidivism cohort."""
    return FeatureDictionary(name="clinograph-lifelines-rossi", version=1, features=(
        _num("age", "Age at release", "years", 18, 45, 14, 100),
        Feature(id="financial_aid", name="Received financial aid after release", kind="binary"),
        Feature(id="black", name="Black race", kind="binary"),
        Feature(id="work_experience", name="Full-time work experience before prison", kind="binary"),
        Feature(id="married", name="Married at release", kind="binary"),
        Feature(id="parole", name="Released on parole", kind="binary"),
        _num("prior_convictions", "Prior convictions", "1", 0, 5, 0, 100),
    ))


def diabetes_dictionary() -> FeatureDictionary:
    """Canonical features of the Efron et al. diabetes cohort. Reference ranges are common adult
    clinical references (fasting glucose 70-100 mg/dL; total cholesterol < 200, LDL < 130,
    HDL 40-80 mg/dL; BMI 18.5-30; mean arterial pressure 70-105 mmHg), not the cohort's values."""
    return FeatureDictionary(name="clinograph-sklearn-diabetes", version=1, features=(
        _num("age", "Age", "years", 30, 70, 0, 120),
        Feature(id="sex_code_2", name="Sex (the data set's code 2; the source does not say which)", kind="binary"),
        _num("bmi", "Body mass index", "kg/m2", 18.5, 30, 10, 80),
        _num("map", "Mean arterial pressure", "mmHg", 70, 105, 30, 200),
        _num("total_cholesterol", "Total serum cholesterol", "mg/dL", 125, 200, 30, 700, analyte="cholesterol"),
        _num("ldl", "LDL cholesterol", "mg/dL", 50, 130, 5, 500, analyte="cholesterol"),
        _num("hdl", "HDL cholesterol", "mg/dL", 40, 80, 5, 200, analyte="cholesterol"),
        _num("tc_hdl_ratio", "Total cholesterol / HDL", "1", 2, 5, 0.5, 30),
        _num("log_triglycerides", "Serum triglycerides, natural log of mg/dL", "1", 3.9, 5.0, 2, 9),
        _num("glucose", "Serum glucose", "mg/dL", 70, 100, 20, 700, analyte="glucose"),
    ))


#: ``[target]`` of the survival form: interval ends and horizon (days), chosen before looking at
#: any model result (quarters of the first year, then half-years; yearly for GBSG2)
SURVIVAL_TARGETS: dict[str, dict] = {
    "lung": {"kind": "survival", "time_unit": "d", "breaks": (91.0, 182.0, 273.0, 365.0, 547.0, 730.0, 1100.0),
             "horizon": 365.0},
    "gbsg2": {"kind": "survival", "time_unit": "d", "breaks": (365.0, 730.0, 1095.0, 1460.0, 1825.0, 2190.0, 2700.0),
              "horizon": 1095.0},
}
#: per cohort and hospital: (time column, time unit, event column, event codes or None)
SURVIVAL_COLUMNS: dict[str, tuple[tuple[str, str, str, dict[str, int] | None], ...]] = {
    "lung": (("futime_days", "d", "dead", {"yes": 1, "no": 0}), ("followup_months", "mo", "status", None),
             ("fu_weeks", "wk", "death", None)),
    "gbsg2": (("rfs_days", "d", "event", None), ("rfs_months", "mo", "recurrence_or_death", {"Y": 1, "N": 0}),
              ("rfs_years", "a", "cens", None), ("time", "d", "status", None)),
}


def _label(time: np.ndarray, event: np.ndarray, horizon: float) -> tuple[np.ndarray, np.ndarray]:
    """(keep, label): drop patients censored before ``horizon``; label = event before it."""
    keep = (time >= horizon) | event
    return keep, (event & (time < horizon)).astype(int)


def _lung(form: str = "binary") -> tuple[pd.DataFrame, np.ndarray, str, int]:
    from lifelines.datasets import load_lung

    df = load_lung().dropna(subset=["inst"]).reset_index(drop=True)
    keep, y = _label(df["time"].to_numpy(float), (df["status"] == 1).to_numpy(), 365)
    canon = pd.DataFrame({
        "age": df["age"].astype(float), "female": (df["sex"] == 2).astype(float),
        "ecog_physician": df["ph.ecog"], "karnofsky_physician": df["ph.karno"],
        "karnofsky_patient": df["pat.karno"], "meal_calories": df["meal.cal"], "weight_loss": df["wt.loss"],
        "label": y, "time": df["time"].astype(float), "event": (df["status"] == 1).astype(int)})
    sizes = df.loc[keep, "inst"].value_counts()
    order = sorted(sizes.index, key=lambda i: (-sizes[i], i))
    order += sorted(set(df["inst"]) - set(order))  # institutions without a kept patient (survival form)
    which = {inst: k % 3 for k, inst in enumerate(order)}
    site = df["inst"].map(which).to_numpy()
    if form == "survival":
        return canon, site, "death (time to event)", 0
    return canon[keep].reset_index(drop=True), site[keep], "death within 365 days", int((~keep).sum())


def _gbsg2(form: str = "binary") -> tuple[pd.DataFrame, np.ndarray, str, int]:
    from lifelines.datasets import load_gbsg2

    df = load_gbsg2()
    keep, y = _label(df["time"].to_numpy(float), (df["cens"] == 1).to_numpy(), 1095)
    canon = pd.DataFrame({
        "age": df["age"].astype(float), "hormone_therapy": (df["horTh"] == "yes").astype(float),
        "postmenopausal": (df["menostat"] == "Post").astype(float), "tumour_size": df["tsize"].astype(float),
        "tumour_grade": df["tgrade"].astype(str), "positive_nodes": df["pnodes"].astype(float),
        "progesterone_receptor": df["progrec"].astype(float), "oestrogen_receptor": df["estrec"].astype(float),
        "label": y, "time": df["time"].astype(float), "event": (df["cens"] == 1).astype(int)})
    rng = np.random.default_rng(20_240_601)  # the cut is part of the data set: fixed
    score = (df["age"].to_numpy(float) - 53) / 10 + rng.standard_normal(len(df))
    site = np.digitize(score, np.quantile(score, [0.15, 0.35, 0.6]))  # sizes 15/20/25/40 %
    if form == "survival":
        return canon, site, "recurrence or death (time to event)", 0
    return canon[keep].reset_index(drop=True), site[keep], "recurrence or death within 3 years", int((~keep).sum())


def _kidney(form: str = "binary") -> tuple[pd.DataFrame, np.ndarray, str, int]:
    from lifelines.datasets import load_kidney_transplant

    df = load_kidney_transplant()
    keep, y = _label(df["time"].to_numpy(float), (df["death"] == 1).to_numpy(), 1095)
    female = 1.0 - df["black_male"] - df["white_male"]
    canon = pd.DataFrame({
        "age": df["age"].astype(float), "female": female.astype(float),
        "black": (df["black_male"] + df["black_female"]).astype(float),
        "label": y, "time": df["time"].astype(float), "event": df["death"].astype(int)})
    rng = np.random.default_rng(20_261_123)  # the cut is part of the data set: fixed
    score = (df["age"].to_numpy(float) - 43) / 11 + rng.standard_normal(len(df))
    site = np.digitize(score, np.quantile(score, [0.25, 0.6]))  # sizes 25/35/40 %
    return canon[keep].reset_index(drop=True), site[keep], "death within 3 years of transplant", int((~keep).sum())


def _diabetes(form: str = "binary") -> tuple[pd.DataFrame, np.ndarray, str, int]:
    from sklearn.datasets import load_diabetes

    df = load_diabetes(scaled=False, as_frame=True).frame
    canon = pd.DataFrame({
        "age": df["age"].astype(float), "sex_code_2": (df["sex"] == 2).astype(float), "bmi": df["bmi"].astype(float),
        "map": df["bp"].astype(float), "total_cholesterol": df["s1"].astype(float), "ldl": df["s2"].astype(float),
        "hdl": df["s3"].astype(float), "tc_hdl_ratio": df["s4"].astype(float),
        "log_triglycerides": df["s5"].astype(float), "glucose": df["s6"].astype(float),
        "label": (df["target"] > 140).astype(int), "event": (df["target"] > 140).astype(int)})
    rng = np.random.default_rng(20_261_124)  # the cut is part of the data set: fixed
    score = (df["bmi"].to_numpy(float) - 26.4) / 4.4 + rng.standard_normal(len(df))
    site = np.digitize(score, np.quantile(score, [0.3, 0.65]))  # sizes 30/35/35 %
    return canon, site, "disease progression above 140 one year after baseline", 0


def _larynx(form: str = "binary") -> tuple[pd.DataFrame, np.ndarray, str, int]:
    from lifelines.datasets import load_larynx

    df = load_larynx()
    keep, y = _label(df["time"].to_numpy(float), (df["death"] == 1).to_numpy(), 3.0)  # time in years
    stage = 1 + df["Stage_II"] + 2 * df["Stage_III"] + 3 * df["Stage_IV"]
    canon = pd.DataFrame({"age": df["age"].astype(float), "stage": stage.map({1: "I", 2: "II", 3: "III", 4: "IV"}),
                          "label": y, "time": df["time"].astype(float), "event": df["death"].astype(int)})
    rng = np.random.default_rng(20_261_126)  # the cut is part of the data set: fixed
    score = (stage.to_numpy(float) - 2.2) + rng.standard_normal(len(df))
    site = np.digitize(score, np.quantile(score, [0.3, 0.6]))  # sizes 30/30/40 %
    return canon[keep].reset_index(drop=True), site[keep], "death within 3 years of diagnosis", int((~keep).sum())


def _rossi(form: str = "binary") -> tuple[pd.DataFrame, np.ndarray, str, int]:
    from lifelines.datasets import load_rossi

    df = load_rossi()  # every man followed for 52 weeks: no censoring before the horizon
    canon = pd.DataFrame({
        "age": df["age"].astype(float), "financial_aid": df["fin"].astype(float), "black": df["race"].astype(float),
        "work_experience": df["wexp"].astype(float), "married": df["mar"].astype(float),
        "parole": df["paro"].astype(float), "prior_convictions": df["prio"].astype(float),
        "label": df["arrest"].astype(int), "event": df["arrest"].astype(int)})
    rng = np.random.default_rng(20_261_128)  # the cut is part of the data set: fixed
    score = (df["prio"].to_numpy(float) - 2.98) / 2.9 + rng.standard_normal(len(df))
    site = np.digitize(score, np.quantile(score, [0.3, 0.6]))  # sizes 30/30/40 %
    return canon, site, "re-arrest within 52 weeks of release", 0


LUNG_SITES = (
    SiteSpec("ncctg_mayo", renames=(("age", "Age"), ("female", "Sex"), ("ecog_physician", "ECOG")),
             codings=(("female", (("F", 1), ("M", 0))),), lacks=("meal_calories",)),
    SiteSpec("ncctg_north", renames=(("karnofsky_physician", "KPS_md"), ("karnofsky_patient", "KPS_pt")),
             units=(("karnofsky_physician", "1"), ("karnofsky_patient", "1"))),
    SiteSpec("ncctg_south", renames=(("weight_loss", "wtloss_lb"), ("meal_calories", "kcal")),
             lacks=("karnofsky_patient",)),
)
GBSG2_SITES = (
    SiteSpec("gbsg_small", renames=(("tumour_size", "tsize_mm"), ("positive_nodes", "nodes")),
             lacks=("progesterone_receptor", "oestrogen_receptor")),
    SiteSpec("gbsg_district", renames=(("hormone_therapy", "horTh"), ("postmenopausal", "menostat")),
             codings=(("hormone_therapy", (("yes", 1), ("no", 0))), ("postmenopausal", (("Post", 1), ("Pre", 0)))),
             lacks=("tumour_grade",)),
    SiteSpec("gbsg_regional", renames=(("tumour_grade", "grade"), ("progesterone_receptor", "PR")),
             codings=(("tumour_grade", (("1", "I"), ("2", "II"), ("3", "III"))),)),
    SiteSpec("gbsg_university", renames=(("oestrogen_receptor", "ER_fmol"), ("age", "age_years"))),
)
KIDNEY_SITES = (
    SiteSpec("tx_community", renames=(("age", "age_at_tx"), ("female", "sex")),
             codings=(("female", (("F", 1), ("M", 0))),), lacks=("black",)),
    SiteSpec("tx_regional", renames=(("black", "race_black"),),
             codings=(("black", (("yes", 1), ("no", 0))),)),
    SiteSpec("tx_university", renames=(("female", "gender_female"), ("age", "AGE"))),
)
DIABETES_SITES = (
    SiteSpec("dm_community", renames=(("total_cholesterol", "chol_mmol"), ("ldl", "ldl_mmol"), ("hdl", "hdl_mmol"),
                                      ("glucose", "glu_mmol"), ("sex_code_2", "sex")),
             units=(("total_cholesterol", "mmol/L"), ("ldl", "mmol/L"), ("hdl", "mmol/L"), ("glucose", "mmol/L")),
             codings=(("sex_code_2", (("2", 1), ("1", 0))),)),
    SiteSpec("dm_district", renames=(("map", "MAP"), ("bmi", "BMI")), lacks=("ldl", "tc_hdl_ratio")),
    SiteSpec("dm_university", renames=(("log_triglycerides", "ln_tg"), ("glucose", "glucose_mgdl"),
                                       ("age", "age_years"))),
)
LARYNX_SITES = (
    SiteSpec("lx_community", renames=(("stage", "stage_num"),),
             codings=(("stage", (("1", "I"), ("2", "II"), ("3", "III"), ("4", "IV"))),)),
    SiteSpec("lx_district", renames=(("age", "age_dx"),)),
    SiteSpec("lx_university", renames=(("stage", "ajcc_stage"), ("age", "AGE")),
             codings=(("stage", (("stage 1", "I"), ("stage 2", "II"), ("stage 3", "III"), ("stage 4", "IV"))),)),
)
ROSSI_SITES = (
    SiteSpec("ro_east", renames=(("financial_aid", "aid"), ("age", "AGE")),
             codings=(("financial_aid", (("yes", 1), ("no", 0))),), lacks=("work_experience",)),
    SiteSpec("ro_central", renames=(("married", "marital"), ("prior_convictions", "priors")),
             codings=(("married", (("married", 1), ("not married", 0))),)),
    SiteSpec("ro_west", renames=(("black", "race_black"), ("parole", "on_parole")), lacks=("married",)),
)
_COHORTS: dict[str, tuple[Callable[[], FeatureDictionary], Callable, tuple[SiteSpec, ...]]] = {
    "lung": (lung_dictionary, _lung, LUNG_SITES), "gbsg2": (gbsg2_dictionary, _gbsg2, GBSG2_SITES),
    "kidney": (kidney_dictionary, _kidney, KIDNEY_SITES),
    "diabetes": (diabetes_dictionary, _diabetes, DIABETES_SITES),
    "larynx": (larynx_dictionary, _larynx, LARYNX_SITES), "rossi": (rossi_dictionary, _rossi, ROSSI_SITES)}


def _local_values(values: pd.Series, feat: Feature, spec: SiteSpec) -> pd.Series:
    """Express a canonical column in the hospital's unit and codes."""
    from ..ontology.units import conversion

    units, codings = dict(spec.units), {k: dict(v) for k, v in spec.codings}
    if feat.id in units:
        scale, offset = conversion(feature=feat.id, analyte=feat.analyte, source=feat.unit, target=units[feat.id])
        return values * scale + offset
    if feat.id in codings:
        inverse = {v: k for k, v in codings[feat.id].items()}
        return values.map(lambda v: inverse.get(v if isinstance(v, str) else int(v), v) if pd.notna(v) else v)
    return values


def _survival_columns(part: pd.DataFrame, cohort: str, k: int) -> tuple[dict[str, np.ndarray], SurvivalColumns]:
    """The hospital's own time (in its unit) and event columns, and its ``[survival]`` declaration."""
    from ..ingest.survival import days_per

    time_col, unit, event_col, codes = SURVIVAL_COLUMNS[cohort][k]
    t = part["time"].to_numpy(float) / days_per(unit)
    ev = part["event"].to_numpy(int)
    if codes is not None:
        inverse = {v: c for c, v in codes.items()}
        ev = np.array([inverse[int(v)] for v in ev], dtype=object)
    return ({time_col: np.round(t, 4), event_col: ev},
            SurvivalColumns(time=time_col, event=event_col, time_unit=unit, event_codes=codes))


def cohort_tables(name: str, form: str = "binary") -> CohortTables:
    """The cohort ``name`` (one of :data:`COHORTS`) as hospital tables with their site schemas,
    in the ``binary`` (horizon label) or ``survival`` (time + event) form (module docstring).

    Raises:
        ConfigError: an unknown cohort name or form (the message lists them).
    """
    from clinograph.core.errors import ConfigError

    if name not in _COHORTS:
        raise ConfigError(f"Unknown cohort {name!r}. Registered: {', '.join(COHORTS)}.")
    if form not in ("binary", "survival"):
        raise ConfigError(f"Unknown form {form!r} of cohort {name!r}; use 'binary' or 'survival'.")
    if form == "survival" and name not in SURVIVAL_COHORTS:
        raise ConfigError(f"Cohort {name!r} has the binary form only; use form = 'binary'.")
    make_dictionary, load, sites = _COHORTS[name]
    dictionary = make_dictionary()
    canon, site_of, task, censored = load(form)
    out = []
    for k, spec in enumerate(sites):
        part = canon[site_of == k].reset_index(drop=True)
        table = pd.DataFrame({"patient_id": [f"{spec.site}-{i:04d}" for i in range(len(part))]})
        columns: dict[str, ColumnMap] = {}
        renames, units, codings = dict(spec.renames), dict(spec.units), {k: dict(v) for k, v in spec.codings}
        for feat in dictionary.features:
            if feat.id in spec.lacks:
                continue
            col = renames.get(feat.id, feat.id)
            table[col] = _local_values(part[feat.id], feat, spec).to_numpy()
            columns[col] = ColumnMap(feature=feat.id, unit=units.get(feat.id, feat.unit if feat.kind == "numeric"
                                                                      else None),
                                     coding=codings.get(feat.id))
        if form == "survival":
            cols, surv = _survival_columns(part, name, k)
            for c, v in cols.items():
                table[c] = v
            out.append((table, SiteSchema(site=spec.site, patient_id="patient_id", label=None, survival=surv,
                                          columns=columns)))
            continue
        table["outcome"] = part["label"].to_numpy()
        out.append((table, SiteSchema(site=spec.site, patient_id="patient_id", label="outcome", columns=columns)))
    positives = int(canon["event"].sum()) if form == "survival" else int(canon["label"].sum())
    return CohortTables(name=name, task=task, dictionary=dictionary, hospitals=tuple(out), patients=len(canon),
                        censored_before_horizon=censored, positives=positives, form=form)
