"""``clinograph demo``: the product's end-to-end demonstration on the ALARM hospitals.

- :mod:`.run` -- the NS-FL demo (``run_demo``, ``demo_config``, ``DEMO_ROUNDS``) with its simple
  baselines beside it and the auditor's report.
- :mod:`.concepts` -- ``clinograph demo --concepts`` (``run_concepts_demo``).
- :mod:`.baselines` -- the simple baselines the demo reports (standalone, FedAvg on aligned
  features, logistic regression, pooled gradient boosting).
- :mod:`.radar` -- the feature-relevance chart.

The demo's data is in :mod:`clinograph.sdk.datasets`.
"""
