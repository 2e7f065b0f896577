"""Clinograph's server library and protocol: the safe recipes.

Raw primitives live in :mod:`clinograph.secure.hazmat`. This package never imports torch,
torch_geometric or opacus: the server is a lean, auditable install. What the errors, keys, specs,
codec and TOML reading stand on is the neutral :mod:`clinograph.core`.

The face the hospital SDK (:mod:`clinograph.sdk`) may use -- and the only one it does, checked
by the ``sdk-secure-face`` import contract in pyproject.toml:

=============================  =================================================================
:mod:`.runtime`                the one run and round loop, transports' seam, run messages, build
:mod:`.aggregation`            a secure mode's hospital side (``create_mode(...).make_client``)
:mod:`.ckks.holder`            a hospital's CKKS key holder (the ceremony's hospital part)
:mod:`.strategies`             the aggregation strategies and their plan checks
:mod:`.dp`                     the DP accountant and policy checks; the noise samplers
:mod:`.audit`                  the audit trail, its verification, the report
:mod:`.messages`, :mod:`.wire`  the signed wire messages and envelopes
:mod:`.policy`, :mod:`.state`  the security policy; state files
:mod:`.server`                 :class:`~.server.FederationServer` (what a run's server is)
:mod:`.dag_voting`             the concept DAG vote
:mod:`.enrolment`              the federation file (``federation.toml``)
=============================  =================================================================

Never from the SDK: :mod:`.hazmat` (raw primitives), :mod:`.masking` (the server's and the
hospitals' masking protocol, reached through a secure mode) and :mod:`.transport` (Flower and
the in-process relay, reached through :mod:`.runtime`).
"""
