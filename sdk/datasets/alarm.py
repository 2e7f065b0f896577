"""The demo federation: hospitals cut from samples of the ALARM patient-monitoring network.

ALARM (Beinlich et al. 1989, shipped offline by pgmpy) is itself a patient-monitoring
Bayesian network, so forward samples are EHR-like records with a known ground-truth DAG.
Discrete states are rendered as clinical measurements (state-dependent normal draws in
clinical units), hospitals get their own column names and units, and two hospitals lack the
blood-gas block, as two of the NS-FL paper's trusts do.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..ontology.dictionary import FeatureDictionary
from ..ontology.schema import ColumnMap, SiteSchema
from ..seeding import numpy_seeded

DICTIONARY_PATH = Path(__file__).with_name("alarm_dictionary.toml")
BLOOD_GAS = ("sao2", "svo2", "paco2")

# ALARM node -> (feature id, {state: (mean, sd)}) in the dictionary's canonical unit.
RENDER: dict[str, tuple[str, dict[str, tuple[float, float]]]] = {
    "HREKG": ("heart_rate", {"LOW": (52, 6), "NORMAL": (78, 9), "HIGH": (118, 12)}),
    "HRBP": ("heart_rate_art", {"LOW": (52, 6), "NORMAL": (78, 9), "HIGH": (118, 12)}),
    "HRSAT": ("heart_rate_oximeter", {"LOW": (52, 6), "NORMAL": (78, 9), "HIGH": (118, 12)}),
    "BP": ("systolic_bp", {"LOW": (82, 8), "NORMAL": (118, 10), "HIGH": (158, 12)}),
    "CO": ("cardiac_output", {"LOW": (3.0, 0.5), "NORMAL": (5.5, 0.8), "HIGH": (8.5, 1.0)}),
    "CVP": ("cvp", {"LOW": (1.5, 1.0), "NORMAL": (6.0, 1.5), "HIGH": (14.0, 2.5)}),
    "PCWP": ("pcwp", {"LOW": (4.0, 1.2), "NORMAL": (9.0, 1.5), "HIGH": (22.0, 3.0)}),
    "PAP": ("pap", {"LOW": (9.0, 1.5), "NORMAL": (15.0, 2.0), "HIGH": (32.0, 4.0)}),
    "TPR": ("svr", {"LOW": (650, 80), "NORMAL": (1000, 100), "HIGH": (1600, 150)}),
    "SAO2": ("sao2", {"LOW": (85, 3), "NORMAL": (96.5, 1.2), "HIGH": (99.3, 0.4)}),
    "PVSAT": ("svo2", {"LOW": (52, 4), "NORMAL": (70, 4), "HIGH": (85, 3)}),
    "ARTCO2": ("paco2", {"LOW": (28, 3), "NORMAL": (40, 2.5), "HIGH": (58, 5)}),
    "EXPCO2": ("etco2", {"ZERO": (2, 1.5), "LOW": (26, 3), "NORMAL": (38, 2.5), "HIGH": (52, 4)}),
    "MINVOL": ("minute_volume", {"ZERO": (0.3, 0.2), "LOW": (3.5, 0.7), "NORMAL": (7.5, 1.0), "HIGH": (13, 1.5)}),
    "MINVOLSET": ("minute_volume_set", {"LOW": (4.0, 0.3), "NORMAL": (7.0, 0.4), "HIGH": (11.0, 0.5)}),
    "PRESS": ("airway_pressure", {"ZERO": (2, 1.0), "LOW": (12, 2), "NORMAL": (22, 3), "HIGH": (38, 4)}),
    "FIO2": ("fio2", {"LOW": (21.5, 0.5), "NORMAL": (45, 6)}),
}
TASK = "SHUNT"  # intrapulmonary shunt (HIGH); seen mostly through blood gases and ventilation


@dataclass(frozen=True)
class HospitalSpec:
    """How one demo hospital looks: size, missing blocks, local names and units."""

    site: str
    n_patients: int
    lacks: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    units: tuple[tuple[str, str], ...] = ()


DEFAULT_HOSPITALS = (
    HospitalSpec("north", 2400, renames=(("heart_rate", "HR"), ("glucose", "GLU")), units=(("glucose", "mg/dL"),)),
    HospitalSpec("south", 1600, renames=(("paco2", "PaCO2 (kPa)"), ("temperature", "Temp F")),
                 units=(("paco2", "kPa"), ("temperature", "degF"))),
    HospitalSpec("east", 1000, lacks=BLOOD_GAS, renames=(("haemoglobin", "Hb"), ("creatinine", "Creat")),
                 units=(("haemoglobin", "g/dL"), ("creatinine", "mg/dL"))),
    HospitalSpec("west", 600, lacks=BLOOD_GAS + ("svr",), renames=(("urea", "Urea (mg/dL)"),), units=(("urea", "mg/dL"),)),
)


def load_dictionary() -> FeatureDictionary:
    """The demo's feature dictionary (shipped with the package)."""
    return FeatureDictionary.from_toml(DICTIONARY_PATH)


def sample_alarm(n: int, *, seed: int) -> pd.DataFrame:
    """``n`` forward samples of ALARM (state strings), reproducible for a seed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pgmpy's FutureWarnings at import (estimators.StructureScore) and use
        from pgmpy.sampling import BayesianModelSampling
        from pgmpy.utils import get_example_model

        model = get_example_model("alarm")
        with numpy_seeded():  # forward_sample(seed=) calls np.random.seed: the host's state is put back
            return BayesianModelSampling(model).forward_sample(size=n, seed=seed, show_progress=False)


def render_patients(states: pd.DataFrame, *, seed: int) -> pd.DataFrame:
    """Clinical measurements in canonical units plus labs and the label ``shunt``."""
    rng = np.random.default_rng(seed)
    n = len(states)
    out: dict[str, np.ndarray] = {}
    for node, (fid, table) in RENDER.items():
        mean = states[node].map(lambda s, t=table: t[s][0]).to_numpy(dtype=float)
        sd = states[node].map(lambda s, t=table: t[s][1]).to_numpy(dtype=float)
        out[fid] = mean + sd * rng.standard_normal(n)
    hypo = (states["HYPOVOLEMIA"] == "TRUE").to_numpy()
    lowco = (states["CO"] == "LOW").to_numpy()
    catechol = (states["CATECHOL"] == "HIGH").to_numpy()
    out["history_lvf"] = (states["HISTORY"] == "TRUE").to_numpy(dtype=float)
    out["creatinine"] = np.exp(np.log(85) + 0.25 * rng.standard_normal(n) + 0.35 * lowco + 0.15 * hypo)
    out["urea"] = np.exp(np.log(5.0) + 0.3 * rng.standard_normal(n) + 0.35 * hypo)
    out["glucose"] = np.exp(np.log(6.0) + 0.2 * rng.standard_normal(n) + 0.25 * catechol)
    out["haemoglobin"] = 140 - 12 * hypo + 14 * rng.standard_normal(n)
    out["temperature"] = 37.0 + 0.5 * rng.standard_normal(n)
    dictionary = load_dictionary()
    for k, v in out.items():  # a monitor never reports a physically impossible value
        f = dictionary.get(k)
        lo = -np.inf if f.physical_min is None else f.physical_min
        hi = np.inf if f.physical_max is None else f.physical_max
        out[k] = np.clip(v, lo, hi)
    df = pd.DataFrame(out)
    df["shunt"] = (states[TASK] == "HIGH").to_numpy(dtype=int)
    return df


def make_hospital_tables(*, seed: int, hospitals: tuple[HospitalSpec, ...] = DEFAULT_HOSPITALS,
                         missing_rate: float = 0.05) -> list[tuple[pd.DataFrame, SiteSchema]]:
    """One (local table, site schema) per hospital, each in its own names and units."""
    from ..ontology.units import conversion

    dictionary = load_dictionary()
    total = sum(h.n_patients for h in hospitals)
    canon = render_patients(sample_alarm(total, seed=seed), seed=seed + 1)
    rng = np.random.default_rng(seed + 2)
    out, start = [], 0
    for h in hospitals:
        part = canon.iloc[start:start + h.n_patients].reset_index(drop=True)
        start += h.n_patients
        renames, units = dict(h.renames), dict(h.units)
        table = pd.DataFrame({"patient_id": [f"{h.site}-{i:05d}" for i in range(len(part))]})
        columns: dict[str, ColumnMap] = {}
        for fid in part.columns:
            if fid == "shunt" or fid in h.lacks:
                continue
            feat = dictionary.get(fid)
            values = part[fid].to_numpy(dtype=float)
            if fid in units:  # express in the hospital's local unit
                scale, offset = conversion(feature=fid, analyte=feat.analyte, source=feat.unit, target=units[fid])
                values = values * scale + offset
            values = np.where(rng.random(len(values)) < missing_rate, np.nan, np.round(values, 3))
            col = renames.get(fid, fid)
            table[col] = values
            columns[col] = ColumnMap(feature=fid, unit=units.get(fid, feat.unit))
        table["outcome"] = part["shunt"].to_numpy()
        out.append((table, SiteSchema(site=h.site, patient_id="patient_id", label="outcome", columns=columns)))
    return out
