"""The demo's data: synthetic hospitals and their feature dictionaries, shipped with the package.

Nothing here is downloaded: the ALARM and bnlearn networks come with pgmpy, the real tables
with lifelines and scikit-learn, and the dictionaries are the TOML files beside these modules.
The hospital runtime never imports this package (an import contract checks it); the CLI's
``clinograph demo``, the examples and the tests do.

- :mod:`.alarm` -- the demo's four hospitals cut from the ALARM network (``make_hospital_tables``,
  ``load_dictionary``, ``DICTIONARY_PATH``, ``HospitalSpec``, ``DEFAULT_HOSPITALS``).
- :mod:`.bnlearn` -- pgmpy's bundled bnlearn networks: sampling, states, edges (the concepts demo).
- :mod:`.ehr` / :mod:`.omop` -- the demo hospitals written as MEDS, FHIR NDJSON or an OMOP CDM.
- :mod:`.timeseries` -- a synthetic ICU/ward federation in long format with a PPG waveform.
- :mod:`.real_tables` -- public clinical tables (lifelines, scikit-learn) cut into hospitals with
  site-local names and units (``cohort_tables``); needs ``lifelines`` (the ``[all]`` extra).
"""
