"""Demo and research code, outside the hospital runtime's import path (an import contract checks it).

- :mod:`.alarm_demo` -- the demo's hospitals cut from the ALARM network and its dictionary.
- :mod:`.bnlearn` -- the F-CMs benchmark data (pgmpy's bundled bnlearn networks) and calibration constants.
- :mod:`.baselines` -- the NS-FL paper's baselines (standalone, FedAvg on aligned features).
- :mod:`.demo` / :mod:`.radar` -- the `clinograph demo` job and its feature-relevance chart.
"""
