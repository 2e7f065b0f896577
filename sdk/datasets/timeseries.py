"""A time-series federation to measure on: a hand-built physiological state-space model of
deterioration towards shock, rendered as hospitals' own long-format tables.

Offline and seeded (numpy's generator: synthetic data, nothing secret). Each patient has a
latent circulatory-failure severity s_t (hours t = 0 .. OBS_HOURS + HORIZON - 1):

    s_t = max(0, b + r · max(0, t − onset) + l · exp(−t / 8) + u_t),   u_t = 0.8 u_{t−1} + 0.12 ε_t,

around a patient's own baseline b ≥ 0 (higher with heart failure and age), with three courses:
stable (r = l = 0), deteriorating (r > 0 from an onset hour) and recovering after initial
resuscitation (l > 0 wearing off). The level at the prediction time
alone cannot tell a recovering patient from a deteriorating one; the trend can.

Observations are deterministic functions of s_t plus measurement noise, with signs and
magnitudes taken from published physiology:

- compensatory tachycardia and hypotension: heart rate rises and MAP falls with s, so the shock
  index HR/SBP passes 1 in shock (Allgöwer & Burri 1967; normal 0.5-0.7);
- systolic pressure from MAP and pulse pressure (MAP ≈ DBP + PP/3, so SBP = MAP + 2/3 PP);
- tachypnoea (qSOFA: RR ≥ 22/min, Seymour et al., JAMA 2016) and falling SpO2;
- lactate rising exponentially with hypoperfusion (> 2 mmol/L in septic shock);
- creatinine rising with cumulative hypoperfusion (KDIGO AKI: +26.5 µmol/L);
- fever and leucocytosis in the infected subgroup (SIRS criteria: T > 38 °C, WBC > 12).

The outcome (``shock_4h``) is Sepsis-3 septic-shock physiology (Singer et al., JAMA 2016):
noise-free MAP < 65 mmHg together with lactate > 2 mmol/L at some hour of the HORIZON hours
after the prediction time (end of hour OBS_HOURS - 1). Patients already in shock during the
observed hours are excluded, as a prediction cohort would.

Hospitals differ in case mix (fraction deteriorating), size, sampling (vitals hourly in an ICU,
2- or 4-hourly on a ward: NEWS2 observation frequencies, RCP 2017), lab panels (every 4-12
hours, some panels absent), column names, units (°F, mg/dL, kPa) and long-table layout. In
:data:`MODALITY_GAP_HOSPITALS` some hospitals also record a pulse-oximeter waveform segment
(photoplethysmogram, PPG: beats at the heart rate, amplitude falling with vasoconstriction),
some only vitals, and some have static variables plus one spot check only.

All parameters are hand-chosen to match those published directions and thresholds; they are
not fitted to any dataset (docs/timeseries.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..ontology.dictionary import FeatureDictionary
from ..ontology.schema import ColumnMap, LongColumns, SiteSchema

DICTIONARY_PATH = Path(__file__).with_name("timeseries_dictionary.toml")
OBS_HOURS = 12  #: hours observed before the prediction time
HORIZON = 4  #: the outcome window after it (hours)
WAVEFORM_SAMPLES = 64  #: one PPG segment: 8 s at 8 Hz
STATIC = ("age", "sex_female", "history_chf", "history_ckd")
VITALS = ("heart_rate", "map", "systolic_bp", "resp_rate", "spo2", "temperature")
LABS = ("lactate", "creatinine", "wbc")
MODALITIES = ("static", "vitals", "waveform")


@dataclass(frozen=True)
class TSHospital:
    """One hospital of the time-series federation.

    ``modalities``: ``("static",)`` (demographics and one spot check at the prediction time),
    ``("static", "vitals")`` (hourly-to-4-hourly series) or all three (plus a PPG segment).
    """

    site: str
    n_patients: int
    vitals_every: int = 1
    labs_every: int = 4
    deteriorating: float = 0.3
    lacks: tuple[str, ...] = ()
    modalities: tuple[str, ...] = ("static", "vitals")
    renames: tuple[tuple[str, str], ...] = ()
    units: tuple[tuple[str, str], ...] = ()
    long: tuple[str, str, str, str] = ("patient_id", "time", "feature", "value")
    label: str = "shock_4h"
    missing_rate: float = 0.08


_ICU_NAMES = (("heart_rate", "HR"), ("map", "ABPm"), ("systolic_bp", "ABPs"), ("resp_rate", "RR"),
              ("spo2", "SpO2"), ("temperature", "Temp"), ("lactate", "Lac"), ("creatinine", "Creat"),
              ("wbc", "WBC"))
_WARD_NAMES = (("heart_rate", "pulse"), ("map", "nibp_mean"), ("systolic_bp", "nibp_sys"), ("resp_rate", "resp"),
               ("spo2", "sats"), ("temperature", "temp_f"), ("lactate", "lactate_mgdl"),
               ("creatinine", "creatinine_mgdl"), ("wbc", "leucocytes"))
_US_UNITS = (("temperature", "degF"), ("lactate", "mg/dL"), ("creatinine", "mg/dL"))

#: the default federation: 12 hospitals, every one with vital-sign series
DEFAULT_TS_HOSPITALS = (
    TSHospital("icu_a", 420, 1, 4, 0.35, renames=_ICU_NAMES, long=("stay_id", "hour", "item", "valuenum")),
    TSHospital("icu_b", 360, 1, 6, 0.40, renames=_ICU_NAMES, units=(("temperature", "degF"),)),
    TSHospital("icu_c", 300, 1, 4, 0.30, lacks=("wbc",), units=(("creatinine", "mg/dL"),)),
    TSHospital("icu_d", 240, 1, 12, 0.45, renames=_ICU_NAMES, long=("mrn", "t", "code", "result")),
    TSHospital("hdu_e", 300, 2, 6, 0.30, renames=_WARD_NAMES, units=_US_UNITS),
    TSHospital("hdu_f", 260, 2, 4, 0.25, lacks=("lactate",)),
    TSHospital("hdu_g", 220, 2, 12, 0.35, renames=_WARD_NAMES, units=_US_UNITS, long=("pid", "hr", "name", "val")),
    TSHospital("ward_h", 320, 4, 12, 0.20, renames=_WARD_NAMES, units=_US_UNITS, lacks=("lactate",)),
    TSHospital("ward_i", 260, 4, 12, 0.25, lacks=("wbc", "spo2")),
    TSHospital("ward_j", 200, 4, 12, 0.30, renames=_WARD_NAMES, units=(("temperature", "degF"),)),
    TSHospital("ed_k", 240, 2, 12, 0.30, lacks=("systolic_bp",), long=("visit", "time", "feature", "value")),
    TSHospital("ed_l", 180, 1, 6, 0.35, renames=_ICU_NAMES, lacks=("creatinine",)),
)

#: the hospital set with modality gaps (NS-FL's MC-MED experiment: all / no waveform / static only)
MODALITY_GAP_HOSPITALS = (
    TSHospital("mm_full_a", 360, 1, 4, 0.35, modalities=MODALITIES, renames=_ICU_NAMES),
    TSHospital("mm_full_b", 300, 1, 6, 0.30, modalities=MODALITIES, units=(("temperature", "degF"),)),
    TSHospital("mm_vitals_c", 300, 2, 6, 0.30, modalities=("static", "vitals"), renames=_WARD_NAMES, units=_US_UNITS),
    TSHospital("mm_vitals_d", 260, 4, 12, 0.25, modalities=("static", "vitals"), lacks=("lactate",)),
    TSHospital("mm_static_e", 300, 1, 12, 0.30, modalities=("static",), renames=_WARD_NAMES, units=_US_UNITS),
    TSHospital("mm_static_f", 240, 1, 12, 0.30, modalities=("static",)),
)


@dataclass(frozen=True, repr=False)
class TSSite:
    """One hospital's long table, its schema, and (waveform hospitals) its PPG segments,
    ``waveform[patient_id] -> [WAVEFORM_SAMPLES]`` (the last observed hour)."""

    table: pd.DataFrame
    schema: SiteSchema
    waveform: dict[str, np.ndarray] | None
    hospital: TSHospital

    def __repr__(self) -> str:
        return f"TSSite(site={self.schema.site!r}, rows={len(self.table)}, waveform={self.waveform is not None})"


def load_dictionary() -> FeatureDictionary:
    """The federation's feature dictionary (shipped with the package)."""
    return FeatureDictionary.from_toml(DICTIONARY_PATH)


@dataclass(frozen=True)
class Cohort:
    """Noise-free latent courses of ``n`` patients. Shapes: severity [n, OBS_HOURS + HORIZON]."""

    age: np.ndarray
    female: np.ndarray
    chf: np.ndarray
    ckd: np.ndarray
    infected: np.ndarray
    severity: np.ndarray
    shock_4h: np.ndarray


def _true_map(s: np.ndarray, chf: np.ndarray) -> np.ndarray:
    return 90.0 - 8.5 * s - 4.0 * chf[:, None]


def _true_lactate(s: np.ndarray) -> np.ndarray:
    return np.exp(0.32 * s)


def simulate_cohort(n: int, *, deteriorating: float, rng: np.random.Generator) -> Cohort:
    """``n`` patients of a hospital whose case mix has a ``deteriorating`` fraction; patients in
    shock during the observed hours are replaced (drawn again), so exactly ``n`` are returned."""
    keep: list[dict[str, np.ndarray]] = []
    have = 0
    while have < n:
        m = 2 * (n - have) + 16
        age = np.clip(rng.normal(64, 15, m), 18, 95)
        female = (rng.random(m) < 0.45).astype(float)
        chf = (rng.random(m) < np.clip(0.10 + 0.004 * (age - 60), 0.02, 0.4)).astype(float)
        ckd = (rng.random(m) < 0.12).astype(float)
        infected = (rng.random(m) < 0.6).astype(float)
        course = rng.choice(3, size=m, p=[1 - deteriorating - 0.25, deteriorating, 0.25])  # stable, worse, better
        base = np.abs(rng.normal(0, 1.2, m)) + 0.4 * chf + 0.3 * (age > 75)
        onset = rng.uniform(0, OBS_HOURS + HORIZON - 2, m)
        rate = np.where(course == 1, rng.lognormal(np.log(0.6), 0.5, m), 0.0)
        lift = np.where(course == 2, rng.uniform(1.0, 2.5, m), 0.0)  # resuscitated, wearing off
        tt = np.arange(OBS_HOURS + HORIZON)[None, :]
        noise = np.zeros((m, tt.shape[1]))
        for t in range(1, tt.shape[1]):
            noise[:, t] = 0.8 * noise[:, t - 1] + 0.12 * rng.standard_normal(m)
        s = np.maximum(base[:, None] + rate[:, None] * np.maximum(tt - onset[:, None], 0)
                       + lift[:, None] * np.exp(-tt / 8.0) + noise, 0.0)
        shock = (_true_map(s, chf) < 65) & (_true_lactate(s) > 2)
        ok = ~shock[:, :OBS_HOURS].any(1)
        keep.append({"age": age[ok], "female": female[ok], "chf": chf[ok], "ckd": ckd[ok], "inf": infected[ok],
                     "s": s[ok], "y": shock[ok, OBS_HOURS:].any(1).astype(np.int64)})
        have += int(ok.sum())
    cat = {k: np.concatenate([d[k] for d in keep])[:n] for k in keep[0]}
    return Cohort(cat["age"], cat["female"], cat["chf"], cat["ckd"], cat["inf"], cat["s"], cat["y"])


def observe(c: Cohort, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Measured vitals and labs in canonical units at every observed hour. Shapes: [n, OBS_HOURS]."""
    s = c.severity[:, :OBS_HOURS]
    n, t = s.shape
    e = lambda: rng.standard_normal((n, t))  # noqa: E731
    age, chf, inf = c.age[:, None], c.chf, c.infected[:, None]
    mean_ap = _true_map(s, chf) + 5.0 * e()
    pulse_pressure = np.clip(45 - 4.0 * s + 0.2 * (age - 60) + 6 * e(), 15, 100)
    cum = np.cumsum(s, axis=1)
    return {
        "heart_rate": np.clip(74 + 12 * s + 6 * inf * s ** 0.5 + 6 * e(), 30, 220),
        "map": np.clip(mean_ap, 25, 160),
        "systolic_bp": np.clip(mean_ap + 2 / 3 * pulse_pressure, 40, 240),
        "resp_rate": np.clip(15 + 2.2 * s + 2 * e(), 6, 50),
        "spo2": np.clip(97.5 - 1.0 * s + 1.0 * e(), 70, 100),
        "temperature": np.clip(36.9 + 0.45 * inf * np.minimum(s, 3) + 0.3 * e(), 34, 42),
        "lactate": np.clip(_true_lactate(s) * np.exp(0.15 * e()), 0.2, 20),
        "creatinine": np.clip((75 + 70 * c.ckd[:, None]) * np.exp(0.012 * cum + 0.05 * e()), 30, 1500),
        "wbc": np.clip(8 + 1.6 * inf * s + 2.0 * e(), 0.5, 60),
    }


def ppg_segment(heart_rate: np.ndarray, severity: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """PPG-like segments: beats at the heart rate, amplitude (perfusion index) falling with
    vasoconstriction, a dicrotic notch, baseline wander and noise. Shapes: [n] x2 -> [n, 64]."""
    n = len(heart_rate)
    tt = np.arange(WAVEFORM_SAMPLES) / 8.0
    phase = (tt[None, :] * heart_rate[:, None] / 60.0 + rng.random((n, 1))) % 1.0
    beat = np.exp(-((phase - 0.2) / 0.09) ** 2) + 0.35 * np.exp(-((phase - 0.55) / 0.08) ** 2)
    amp = np.clip(4.0 * np.exp(-0.35 * severity) * np.exp(0.2 * rng.standard_normal(n)), 0.1, 20)
    wander = 0.3 * np.sin(2 * np.pi * 0.1 * tt[None, :] + rng.random((n, 1)) * 6.28)
    return (amp[:, None] * beat + wander + 0.1 * rng.standard_normal((n, WAVEFORM_SAMPLES))).astype(np.float32)


def _sample_hours(every: int) -> np.ndarray:
    """Observation hours ending at the prediction time (e.g. every 4 h: 3, 7, 11)."""
    return np.arange(OBS_HOURS - 1, -1, -every)[::-1]


def make_timeseries_sites(*, seed: int, hospitals: tuple[TSHospital, ...] = DEFAULT_TS_HOSPITALS) -> list[TSSite]:
    """One long table (with the hospital's own names, units and layout), its schema and any
    waveforms per hospital; reproducible for ``seed``."""
    from ..ontology.units import conversion

    dictionary = load_dictionary()
    out = []
    for k, h in enumerate(hospitals):
        rng = np.random.default_rng([seed, k, 7919])
        c = simulate_cohort(h.n_patients, deteriorating=h.deteriorating, rng=rng)
        obs = observe(c, rng)
        pids = np.array([f"{h.site}-{i:05d}" for i in range(h.n_patients)])
        renames, units = dict(h.renames), dict(h.units)
        pcol, tcol, fcol, vcol = h.long
        frames = []
        series = "vitals" in h.modalities
        v_hours = _sample_hours(h.vitals_every) if series else np.array([OBS_HOURS - 1])
        l_hours = _sample_hours(h.labs_every) if series else np.array([OBS_HOURS - 1])
        l_hours = np.array([v_hours[np.argmin(np.abs(v_hours - x))] for x in l_hours])  # on the vitals grid
        first = int(v_hours[0])
        static = {"age": np.round(c.age), "sex_female": c.female, "history_chf": c.chf, "history_ckd": c.ckd}
        for fid, vals in static.items():
            frames.append(pd.DataFrame({pcol: pids, tcol: first, fcol: renames.get(fid, fid), vcol: vals}))
        for fid in VITALS + LABS:
            if fid in h.lacks:
                continue
            hours = v_hours if fid in VITALS else np.unique(l_hours)
            vals = obs[fid][:, hours]
            feat = dictionary.get(fid)
            if fid in units:
                scale, offset = conversion(feature=fid, analyte=feat.analyte, source=feat.unit, target=units[fid],
                                           molar_mass=feat.molar_mass, valence=feat.valence)
                vals = vals * scale + offset
            rate = h.missing_rate if fid in VITALS else 2.5 * h.missing_rate  # a lab panel is skipped more often
            present = rng.random(vals.shape) >= rate
            pi, ti = np.nonzero(present)
            frames.append(pd.DataFrame({pcol: pids[pi], tcol: hours[ti], fcol: renames.get(fid, fid),
                                        vcol: np.round(vals[pi, ti], 2)}))
        table = pd.concat(frames, ignore_index=True)
        label = dict(zip(pids, c.shock_4h, strict=True))
        table[h.label] = table[pcol].map(label).astype(np.int64)
        table = table.sort_values([pcol, tcol], kind="stable").reset_index(drop=True)
        columns = {renames.get(fid, fid): ColumnMap(feature=fid, unit=units.get(fid, dictionary.get(fid).unit)
                                                    if dictionary.get(fid).kind.value == "numeric" else None)
                   for fid in STATIC + VITALS + LABS if fid not in h.lacks}
        schema = SiteSchema(site=h.site, format="long", patient_id=pcol, label=h.label, columns=columns,
                            long=LongColumns(patient=pcol, time=tcol, feature=fcol, value=vcol))
        wave = None
        if "waveform" in h.modalities:
            seg = ppg_segment(obs["heart_rate"][:, -1], c.severity[:, OBS_HOURS - 1], rng)
            wave = dict(zip(pids.tolist(), seg, strict=True))
        out.append(TSSite(table=table, schema=schema, waveform=wave, hospital=h))
    return out


def waveform_matrix(site: TSSite, patient_ids: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(waveforms [n, WAVEFORM_SAMPLES] in ``patient_ids`` order, has [n] bool); zeros where absent."""
    w = np.zeros((len(patient_ids), WAVEFORM_SAMPLES), np.float32)
    has = np.zeros(len(patient_ids), bool)
    for i, p in enumerate(patient_ids):
        if site.waveform is not None and p in site.waveform:
            w[i], has[i] = site.waveform[p], True
    return w, has


def ingested_sites(hospitals: tuple[TSHospital, ...], *, seed: int):
    """(dictionary, [(ingested table, {"waveform": (signal, has)} or {})]) of ``hospitals``: each
    site's long table ingested onto the time-series dictionary and its PPG segments aligned to the
    table's patients (the temporal and modality federations of the tests and benchmarks)."""
    import warnings

    from ..ingest import ingest

    d = load_dictionary()
    out = []
    for s in make_timeseries_sites(seed=seed, hospitals=hospitals):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the generated tables' unit notes, not problems
            t = ingest(s.table, schema=s.schema, dictionary=d)
        w, has = waveform_matrix(s, t.patient_ids)
        out.append((t, {"waveform": (w, has)} if has.any() else {}))
    return d, out
