"""Held-out real tables written as an integrator would hand them over (session 51).

Three public clinical tables that no earlier session measured and no default was tuned on, from
installed packages only (nothing downloaded): scikit-learn's Wisconsin diagnostic breast cancer
(WDBC, Street, Wolberg & Mangasarian 1993), lifelines' ``load_lymph_node`` (the full German Breast
Cancer Study Group 2 export with dates and overall survival; Schumacher et al. 1994) and lifelines'
``load_stanford_heart_transplants`` (Crowley & Hu 1977). Each is cut into 3-4 hospitals the way
real consortia differ (sizes, referral patterns so the label prevalence differs, one hospital
without a block of columns, own column names, codings, label codes, units and CSV dialects), and
written to disk as the quickstart shows: ``dictionary.toml``, each hospital's CSV and
``<site>_schema.toml``, and a ``simulation.toml`` that leaves ``[model]``, ``[training]``,
``[selection]`` at the SDK's defaults. The cuts are fixed (their own seeds), decided before any
model ran.

Reference ranges: clinical conventions for age, tumour size, nodes, receptors (as
``sdk/datasets/real_tables.py``'s gbsg2); for WDBC's 30 image features, for which no clinical
reference interval exists, the rounded min-max of the data set's public description
(``load_breast_cancer().DESCR``) -- what an integrator without a published interval can write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import tomli_w

COHORTS = ("breast_cancer", "lymph_node", "stanford_heart", "child")


@dataclass
class Hospital:
    site: str
    table: pd.DataFrame
    schema: dict
    csv: dict = field(default_factory=dict)  # to_csv options: sep, decimal, encoding


@dataclass
class Cohort:
    name: str
    task: str
    dictionary: dict
    hospitals: list[Hospital]
    patients: int
    positives: int
    dropped_censored: int
    survival_target: dict | None = None  # [target] of the survival form, or None


def _num(
    fid: str,
    name: str,
    unit: str,
    lo: float,
    hi: float,
    pmin: float | None = None,
    pmax: float | None = None,
) -> dict:
    f = {
        "id": fid,
        "name": name,
        "kind": "numeric",
        "unit": unit,
        "reference_low": lo,
        "reference_high": hi,
    }
    if pmin is not None:
        f["physical_min"] = pmin
    if pmax is not None:
        f["physical_max"] = pmax
    return f


def _cut(score: np.ndarray, fractions: tuple[float, ...], seed: int) -> np.ndarray:
    """Hospital index of each patient: a referral score plus noise, cut at cumulative fractions."""
    rng = np.random.default_rng(seed)
    s = (score - score.mean()) / score.std() + rng.standard_normal(len(score))
    return np.digitize(s, np.quantile(s, np.cumsum(fractions)[:-1]))


# --------------------------------------------------------------------------------------------
# WDBC: malignant vs benign from 30 fine-needle-aspirate image features, 4 hospitals
_WDBC_STATS = ("mean", "error", "worst")
_WDBC_BASE = (
    "radius",
    "texture",
    "perimeter",
    "area",
    "smoothness",
    "compactness",
    "concavity",
    "concave points",
    "symmetry",
    "fractal dimension",
)


def _wdbc_id(base: str, stat: str) -> str:
    return f"{base.replace(' ', '_')}_{'se' if stat == 'error' else stat}"


def breast_cancer() -> Cohort:
    from sklearn.datasets import load_breast_cancer

    bc = load_breast_cancer(as_frame=True)
    df = bc.frame
    y = (df["target"] == 0).astype(int).to_numpy()  # target 0 = malignant
    feats = []
    for stat in _WDBC_STATS:
        for base in _WDBC_BASE:
            col = f"{stat} {base}" if stat != "error" else f"{base} error"
            lo, hi = float(df[col].min()), float(df[col].max())  # the DESCR's public min-max
            lo, hi = float(f"{lo:.3g}"), float(f"{hi:.3g}")
            if lo == hi:
                hi = lo + 1.0
            feats.append(_num(_wdbc_id(base, stat), f"{base} ({stat})", "1", lo, hi, 0.0))
    dictionary = {"name": "heldout-wdbc", "version": 1, "features": feats}
    site = _cut(
        df["mean radius"].to_numpy(float), (0.1, 0.2, 0.3, 0.4), seed=51_001
    )  # big tumours: university
    names = ("bc_clinic", "bc_district", "bc_regional", "bc_university")
    hospitals = []
    for k, name in enumerate(names):
        part = df[site == k].reset_index(drop=True)
        yk = y[site == k]
        out = pd.DataFrame({"id": [f"{name}-{i:04d}" for i in range(len(part))]})
        columns: dict[str, dict] = {}
        schema: dict = {"site": name, "patient_id": "id"}
        csv: dict = {}
        for stat in _WDBC_STATS:
            if name == "bc_clinic" and stat == "worst":
                continue  # the clinic's report has no "worst" block
            if name == "bc_regional" and stat == "error":
                continue  # the regional lab does not report the standard errors
            for base in _WDBC_BASE:
                col = f"{stat} {base}" if stat != "error" else f"{base} error"
                fid = _wdbc_id(base, stat)
                if name == "bc_clinic":  # the Kaggle/UCI CSV names: the dictionary ids, no mapping
                    out[fid] = part[col].to_numpy()
                elif name == "bc_district":  # scikit-learn's names, with spaces
                    out[col] = part[col].to_numpy()
                    columns[col] = {"feature": fid}
                elif name == "bc_regional":
                    local = f"{base.title()} ({stat})"
                    out[local] = part[col].to_numpy()
                    columns[local] = {"feature": fid}
                else:
                    local = fid.upper()
                    out[local] = part[col].to_numpy()
                    columns[local] = {"feature": fid}
        if name == "bc_clinic":
            out["diagnosis"] = np.where(yk == 1, "M", "B")
            schema.update(label="diagnosis", label_codes={"M": 1, "B": 0})
        elif name == "bc_district":
            out["malignant"] = yk
            schema.update(label="malignant")
            csv = {"sep": ";", "decimal": ","}
        elif name == "bc_regional":
            out["outcome"] = np.where(yk == 1, "malignant", "benign")
            schema.update(label="outcome", label_codes={"malignant": 1, "benign": 0})
        else:
            out["label"] = np.where(yk == 1, "yes", "no")
            schema.update(label="label")
        schema["columns"] = columns
        hospitals.append(Hospital(name, out, schema, csv))
    return Cohort(
        "breast_cancer",
        "malignant (vs benign) diagnosis",
        dictionary,
        hospitals,
        len(df),
        int(y.sum()),
        0,
    )


# --------------------------------------------------------------------------------------------
# GBSG2 full export (lifelines load_lymph_node): death within 3 years, 3 hospitals
def _gbsg_dictionary() -> dict:
    return {
        "name": "heldout-lymph-node",
        "version": 1,
        "features": [
            _num("age", "Age at diagnosis", "a", 30, 70, 0, 120),
            {"id": "postmenopausal", "name": "Postmenopausal", "kind": "binary"},
            {"id": "hormone_therapy", "name": "Hormonal therapy", "kind": "binary"},
            _num("tumour_size", "Tumour size", "mm", 10, 50, 0, 300),
            {
                "id": "tumour_grade",
                "name": "Tumour grade",
                "kind": "categorical",
                "levels": ["I", "II", "III"],
            },
            _num("positive_nodes", "Positive lymph nodes", "1", 0, 10, 0, 100),
            _num("progesterone_receptor", "Progesterone receptor", "fmol/mg", 0, 200, 0, 10000),
            _num("oestrogen_receptor", "Oestrogen receptor", "fmol/mg", 0, 200, 0, 10000),
        ],
    }


LYMPH_HORIZON = 1095.0  # days: death within 3 years (fixed before any model ran)
LYMPH_TARGET = {
    "kind": "survival",
    "time_unit": "d",
    "horizon": LYMPH_HORIZON,
    "breaks": [365.0, 730.0, 1095.0, 1460.0, 1825.0, 2190.0, 2700.0],
}


def lymph_node(form: str = "binary") -> Cohort:
    from lifelines.datasets import load_lymph_node

    df = load_lymph_node().reset_index()
    t, ev = df["survtime"].to_numpy(float), (df["censdead"] == 1).to_numpy()
    keep = (t >= LYMPH_HORIZON) | ev if form == "binary" else np.ones(len(df), bool)
    y = (ev & (t < LYMPH_HORIZON)).astype(int)
    site = _cut(
        df["nodes"].to_numpy(float), (0.25, 0.35, 0.4), seed=51_002
    )  # more nodes: university
    names = ("ln_community", "ln_regional", "ln_university")
    hospitals = []
    for k, name in enumerate(names):
        m = (site == k) & keep
        part, yk = df[m].reset_index(drop=True), y[m]
        post = (part["menopause"] == 2).to_numpy()  # lifelines: 1 premenopausal, 2 postmenopausal
        horm = (part["hormone"] == 2).to_numpy()  # 1 no, 2 yes
        grade = part["grade"].to_numpy(int)
        out = pd.DataFrame({"pid": [f"{name}-{i:04d}" for i in range(len(part))]})
        schema: dict = {"site": name, "patient_id": "pid"}
        if name == "ln_community":  # no receptor assays; yes/no and pre/post text codes
            out["Age"] = part["age"].to_numpy(float)
            out["Menopause"] = np.where(post, "post", "pre")
            out["Hormone therapy"] = np.where(horm, "yes", "no")
            out["Tumour size (mm)"] = part["size"].to_numpy(float)
            out["Grade"] = np.array(["I", "II", "III"])[grade - 1]
            out["Positive nodes"] = part["nodes"].to_numpy(float)
            columns = {
                "Age": {"feature": "age", "unit": "a"},
                "Menopause": {"feature": "postmenopausal", "coding": {"post": 1, "pre": 0}},
                "Hormone therapy": {"feature": "hormone_therapy"},
                "Tumour size (mm)": {"feature": "tumour_size", "unit": "mm"},
                "Grade": {"feature": "tumour_grade"},
                "Positive nodes": {"feature": "positive_nodes"},
            }
        elif name == "ln_regional":  # the registry's own export: codes 1/2, grade 1-3, dates kept
            for c in (
                "diagdateb",
                "recdate",
                "deathdate",
                "age",
                "menopause",
                "hormone",
                "size",
                "grade",
                "nodes",
                "prog_recp",
                "estrg_recp",
                "rectime",
                "censrec",
            ):
                out[c] = part[c].to_numpy()
            columns = {
                "age": {"feature": "age", "unit": "a"},
                "menopause": {"feature": "postmenopausal", "coding": {"2": 1, "1": 0}},
                "hormone": {"feature": "hormone_therapy", "coding": {"2": 1, "1": 0}},
                "size": {"feature": "tumour_size", "unit": "mm"},
                "grade": {"feature": "tumour_grade", "coding": {"1": "I", "2": "II", "3": "III"}},
                "nodes": {"feature": "positive_nodes"},
                "prog_recp": {"feature": "progesterone_receptor", "unit": "fmol/mg"},
                "estrg_recp": {"feature": "oestrogen_receptor", "unit": "fmol/mg"},
            }
            # dates and the recurrence follow-up come after baseline (they would leak the outcome)
            schema["ignore"] = ["diagdateb", "recdate", "deathdate", "rectime", "censrec"]
        else:  # size in cm, German-style CSV, Y/N label
            out["age_years"] = part["age"].to_numpy(float)
            out["postmenopausal"] = post.astype(int)
            out["hormone_therapy"] = horm.astype(int)
            out["tumour_size_cm"] = part["size"].to_numpy(float) / 10.0
            out["tumour_grade"] = grade.astype(str)
            out["nodes_pos"] = part["nodes"].to_numpy(float)
            out["PgR"] = part["prog_recp"].to_numpy(float)
            out["ER"] = part["estrg_recp"].to_numpy(float)
            columns = {
                "age_years": {"feature": "age", "unit": "a"},
                "tumour_size_cm": {"feature": "tumour_size", "unit": "cm"},
                "tumour_grade": {
                    "feature": "tumour_grade",
                    "coding": {"1": "I", "2": "II", "3": "III"},
                },
                "nodes_pos": {"feature": "positive_nodes"},
                "PgR": {"feature": "progesterone_receptor", "unit": "fmol/mg"},
                "ER": {"feature": "oestrogen_receptor", "unit": "fmol/mg"},
            }
        if form == "binary":
            label = {
                "ln_community": "death_3y",
                "ln_regional": "dead_within_3y",
                "ln_university": "died_3y",
            }[name]
            out[label] = {
                "ln_community": np.where(yk == 1, "yes", "no"),
                "ln_regional": yk,
                "ln_university": np.where(yk == 1, "Y", "N"),
            }[name]
            schema["label"] = label
        else:  # own time unit and event coding at each hospital
            tk, ek = part["survtime"].to_numpy(float), part["censdead"].to_numpy(int)
            unit, div = {
                "ln_community": ("d", 1.0),
                "ln_regional": ("d", 1.0),
                "ln_university": ("mo", 30.4375),
            }[name]
            out["os_time"] = np.round(tk / div, 3)
            if name == "ln_community":
                out["os_event"] = np.where(ek == 1, "dead", "alive")
                surv = {
                    "time": "os_time",
                    "event": "os_event",
                    "time_unit": unit,
                    "event_codes": {"dead": 1, "alive": 0},
                }
            else:
                out["os_event"] = ek
                surv = {"time": "os_time", "event": "os_event", "time_unit": unit}
            schema["label"] = "os_event"
            schema["survival"] = surv
        schema["columns"] = columns
        hospitals.append(
            Hospital(
                name, out, schema, {"sep": ";", "decimal": ","} if name == "ln_university" else {}
            )
        )
    kept = int(keep.sum())
    return Cohort(
        "lymph_node",
        "death within 3 years of diagnosis" if form == "binary" else "death (time to event)",
        _gbsg_dictionary(),
        hospitals,
        kept,
        int(y[keep].sum()) if form == "binary" else int(ev.sum()),
        int((~keep).sum()),
        LYMPH_TARGET if form == "survival" else None,
    )


# --------------------------------------------------------------------------------------------
# Stanford heart transplant programme: death within 1 year of acceptance, 3 hospitals (eras)
STANFORD_HORIZON = 365.0


def stanford_heart(form: str = "binary") -> Cohort:
    from lifelines.datasets import load_stanford_heart_transplants

    s = load_stanford_heart_transplants()
    g = (
        s.sort_values(["id", "start"])
        .groupby("id")
        .agg(
            stop=("stop", "max"),
            event=("event", "last"),
            age=("age", "first"),
            year=("year", "first"),
            surgery=("surgery", "first"),
        )
        .reset_index()
    )
    t, ev = g["stop"].to_numpy(float), (g["event"] == 1).to_numpy()
    keep = (t >= STANFORD_HORIZON) | ev
    y = (ev & (t < STANFORD_HORIZON)).astype(int)
    # transplant status is time-dependent (it happens after acceptance): not a baseline feature
    site = _cut(g["year"].to_numpy(float), (0.3, 0.3, 0.4), seed=51_003)  # eras of the programme
    names = ("sh_early", "sh_middle", "sh_late")
    dictionary = {
        "name": "heldout-stanford-heart",
        "version": 1,
        "features": [
            _num("age", "Age at acceptance", "a", 20, 65, 0, 120),
            _num(
                "acceptance_year", "Years since the programme began (1 Oct 1967)", "a", 0, 6, -1, 10
            ),
            {"id": "prior_bypass", "name": "Prior bypass surgery", "kind": "binary"},
        ],
    }
    hospitals = []
    for k, name in enumerate(names):
        m = (site == k) & keep
        part, yk = g[m].reset_index(drop=True), y[m]
        out = pd.DataFrame({"patient": [f"{name}-{i:03d}" for i in range(len(part))]})
        age = part["age"].to_numpy(float) + 48.0  # lifelines stores age - 48
        if name == "sh_early":
            out["age"] = np.round(age, 2)
            out["year"] = np.round(part["year"].to_numpy(float), 3)
            out["surgery"] = part["surgery"].to_numpy(int)
            out["dead_1y"] = yk
            columns = {
                "year": {"feature": "acceptance_year", "unit": "a"},
                "surgery": {"feature": "prior_bypass"},
            }
            schema = {"site": name, "patient_id": "patient", "label": "dead_1y"}
        elif name == "sh_middle":  # no surgery history recorded; time since start in days
            out["Age (years)"] = np.round(age, 2)
            out["days_since_start"] = np.round(part["year"].to_numpy(float) * 365.25, 1)
            out["outcome"] = np.where(yk == 1, "dead", "alive")
            columns = {
                "Age (years)": {"feature": "age", "unit": "a"},
                "days_since_start": {"feature": "acceptance_year", "unit": "d"},
            }
            schema = {
                "site": name,
                "patient_id": "patient",
                "label": "outcome",
                "label_codes": {"dead": 1, "alive": 0},
            }
        else:
            out["AGE"] = np.round(age, 2)
            out["accept_yr"] = np.round(part["year"].to_numpy(float), 3)
            out["bypass"] = np.where(part["surgery"].to_numpy(int) == 1, "Y", "N")
            out["death_1y"] = np.where(yk == 1, "Y", "N")
            columns = {
                "AGE": {"feature": "age", "unit": "a"},
                "accept_yr": {"feature": "acceptance_year", "unit": "a"},
                "bypass": {"feature": "prior_bypass", "coding": {"Y": 1, "N": 0}},
            }
            schema = {"site": name, "patient_id": "patient", "label": "death_1y"}
        schema["columns"] = columns
        hospitals.append(Hospital(name, out, schema))
    return Cohort(
        "stanford_heart",
        "death within 1 year of acceptance",
        dictionary,
        hospitals,
        int(keep.sum()),
        int(y[keep].sum()),
        int((~keep).sum()),
    )


# --------------------------------------------------------------------------------------------
# CHILD (Spiegelhalter & Cowell 1992): newborns referred for suspected congenital heart disease.
# NOT a real table: 520 patients sampled (fixed seed) from the expert-elicited clinical Bayesian
# network pgmpy ships (utils/example_models/child.bif.gz) -- the one categorical-rich clinical
# source installed. Label: transposition of the great arteries (Disease = TGA) from what the
# referring hospital reports; 4 hospitals by the infant's age band.
_CHILD_LEVELS = {
    "age_band": ("0-3_days", "4-10_days", "11-30_days"),
    "lower_body_o2": (
        "lt5",
        "5-12",
        "12+",
    ),  # the network's "<5": a level names model rows, so "lt5"
    "ruq_o2": ("lt5", "5-12", "12+"),
    "xray": ("Normal", "Oligaemic", "Plethoric", "Grd_Glass", "Asy_Patchy"),  # "Asy/Patchy"
}
#: what the hospitals' exports hold (the network's states) -> the dictionary's levels
_O2_CODING = {"<5": "lt5", "5-12": "5-12", "12+": "12+"}
_XRAY_CODING = {
    "Normal": "Normal",
    "Oligaemic": "Oligaemic",
    "Plethoric": "Plethoric",
    "Grd_Glass": "Grd_Glass",
    "Asy/Patchy": "Asy_Patchy",
}
_CHILD_BINARY = {
    "birth_asphyxia": "BirthAsphyxia",
    "sick": "Sick",
    "lvh_report": "LVHreport",
    "grunting_report": "GruntingReport",
}


def child() -> Cohort:
    import gzip
    import warnings
    from importlib import resources

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgmpy.readwrite import BIFReader
        from pgmpy.sampling import BayesianModelSampling

        path = resources.files("pgmpy.utils") / "example_models" / "child.bif.gz"
        model = BIFReader(string=gzip.decompress(path.read_bytes()).decode("utf-8")).get_model()
        df = BayesianModelSampling(model).forward_sample(size=520, seed=51_004, show_progress=False)
    y = (df["Disease"] == "TGA").to_numpy(int)
    age = df["Age"].map({"0-3_days": 0.0, "4-10_days": 1.0, "11-30_days": 2.0}).to_numpy(float)
    site = _cut(
        age, (0.1, 0.2, 0.3, 0.4), seed=51_005
    )  # older infants: referred on to larger centres
    features = [
        {"id": f, "name": f"{c} (reported)", "kind": "binary"} for f, c in _CHILD_BINARY.items()
    ]
    features.append({"id": "co2_high", "name": "CO2 report 7.5 kPa or more", "kind": "binary"})
    features += [
        {"id": f, "name": f.replace("_", " "), "kind": "categorical", "levels": list(lv)}
        for f, lv in _CHILD_LEVELS.items()
    ]
    dictionary = {"name": "heldout-child", "version": 1, "features": features}
    names = ("ch_clinic", "ch_district", "ch_regional", "ch_cardiac")
    hospitals = []
    for k, name in enumerate(names):
        part, yk = df[site == k].reset_index(drop=True), y[site == k]
        out = pd.DataFrame({"baby": [f"{name}-{i:03d}" for i in range(len(part))]})
        columns: dict[str, dict] = {}
        for fid, col in _CHILD_BINARY.items():  # yes/no, but Y/N (declared) at the clinic
            if name == "ch_clinic":
                out[col] = part[col].map({"yes": "Y", "no": "N"})
                columns[col] = {"feature": fid, "coding": {"Y": 1, "N": 0}}
            else:
                out[fid] = part[col].to_numpy()
        out["CO2Report"] = part["CO2Report"].to_numpy()
        columns["CO2Report"] = {"feature": "co2_high", "coding": {">=7.5": 1, "<7.5": 0}}
        out["Age"] = part["Age"].to_numpy()
        columns["Age"] = {"feature": "age_band"}
        for fid, col in (("lower_body_o2", "LowerBodyO2"), ("ruq_o2", "RUQO2")):
            if name == "ch_district":  # O2 bands coded 1/2/3
                out[col] = part[col].map({"<5": 1, "5-12": 2, "12+": 3})
                columns[col] = {"feature": fid, "coding": {"1": "lt5", "2": "5-12", "3": "12+"}}
            else:
                out[col] = part[col].to_numpy()
                columns[col] = {"feature": fid, "coding": _O2_CODING}
        if name == "ch_cardiac":  # its own X-ray codes
            codes = {
                "Normal": "NORM",
                "Oligaemic": "OLIG",
                "Plethoric": "PLETH",
                "Grd_Glass": "GGO",
                "Asy/Patchy": "PATCHY",
            }
            out["cxr"] = part["XrayReport"].map(codes)
            columns["cxr"] = {
                "feature": "xray",
                "coding": {v: _XRAY_CODING[k] for k, v in codes.items()},
            }
        elif name != "ch_regional":  # the regional referral letters carry no X-ray report
            out["XrayReport"] = part["XrayReport"].to_numpy()
            columns["XrayReport"] = {"feature": "xray", "coding": _XRAY_CODING}
        out["diagnosis"] = np.where(yk == 1, "TGA", "other")
        schema = {
            "site": name,
            "patient_id": "baby",
            "label": "diagnosis",
            "label_codes": {"TGA": 1, "other": 0},
            "columns": columns,
        }
        hospitals.append(Hospital(name, out, schema))
    task = "transposition of the great arteries (sampled from the CHILD network, not real patients)"
    return Cohort("child", task, dictionary, hospitals, len(df), int(y.sum()), 0)


BUILDERS = {
    "breast_cancer": breast_cancer,
    "lymph_node": lymph_node,
    "stanford_heart": stanford_heart,
    "child": child,
}


def write_cohort(cohort: Cohort, folder: Path, *, seed: int = 0, extra: dict | None = None) -> Path:
    """The integrator's files: dictionary.toml, <site>.csv, <site>_schema.toml, simulation.toml
    (SDK defaults: only [federation] id and seed, and [target] for the survival form)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dictionary.toml").write_bytes(tomli_w.dumps(cohort.dictionary).encode())
    hospitals = []
    for h in cohort.hospitals:
        h.table.to_csv(folder / f"{h.site}.csv", index=False, **h.csv)
        (folder / f"{h.site}_schema.toml").write_bytes(tomli_w.dumps(h.schema).encode())
        hospitals.append(
            {"site": h.site, "table": f"{h.site}.csv", "schema": f"{h.site}_schema.toml"}
        )
    sim: dict = {
        "output": f"runs/seed{seed}",
        "dictionary": "dictionary.toml",
        "federation": {"id": f"{cohort.name}-{seed}", "seed": seed},
    }
    if cohort.survival_target:
        sim["target"] = cohort.survival_target
    for k, v in (extra or {}).items():
        sim[k] = v
    sim["hospitals"] = hospitals
    path = folder / f"simulation_seed{seed}.toml"
    path.write_bytes(tomli_w.dumps(sim).encode())
    return path
