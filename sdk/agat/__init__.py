"""AGAT (Molaei et al., AISTATS 2024) as a Clinograph task: augmented temporal graph attention.

One module a layer, names from the paper:

- :mod:`.augmentation` -- the alignment augmentation layer (eqs. 3-4): per-feature Gaussians
  fill the features a hospital lacks;
- :mod:`.graph` -- the kNN patient graph over the augmented features (Euclidean, section 3.3.1);
- :mod:`.gat` -- graph attention layers (eqs. 5-6, PyG ``GATConv``) and the task head;
- :mod:`.temporal` -- the temporal embedding of the previous step (eqs. 7-8);
- :mod:`.model` -- the network and its named modules; :mod:`.task` -- :class:`AGATTask`.

The server side (attention-weighted aggregation, eq. 1) is in
:mod:`clinograph.secure.strategies.attention`; docs/agat.md has the measurements.
"""

from .task import AGATTask

__all__ = ["AGATTask"]
