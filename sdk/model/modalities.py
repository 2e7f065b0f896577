"""Missing modalities: each extra modality is a typed node of the patient's graph, after an encoder
federated only among the hospitals that have it (NS-FL's MC-MED experiment).

NS-FL: "time series and waveform inputs are first embedded ... before constructing symbolic
graphs"; clients hold static variables only, static + vital-sign series, or those plus a PPG
waveform. Here a modality ``m`` (e.g. ``waveform``) gives each patient that has it one node of
type ``modality/m`` with state h_m = Enc_m(signal) (:class:`WaveformEncoder`, a small 1-D CNN
trained end to end -- no pre-trained weights exist offline), joined to the patient by the typed
relation ``of_patient/m``. With one such neighbour the attention of eq. (3) is 1, so the
relation's message is W^(l)_m h_m, added to the patient's layer-l aggregate (eq. 1) when the
patient has the modality (δ_m = 1) and absent otherwise:

    h_p^(l) = ReLU(W_self h_p^(l-1) + Σ_r Σ_v α m_uv + δ_m · W^(l)_m h_m).

The modality node has no incoming relation, so its state is h_m at both layers.

Module-wise aggregation (F-CMs §4.2.3; clinograph/core/spec.py: a module is the unit of sharing):
``modality/<m>/encoder``, ``gnn/layer1/of_patient_<m>`` and ``gnn/layer2/of_patient_<m>`` are
shared modules of the same ModelSpec at every hospital. A hospital without modality m has
δ_m = 0 for every patient, so those modules' gradient is exactly zero (tested), and its task
does not list them among the modules it trained: its upload carries no values for them (tested
on the wire message), and the server aggregates each of them over the hospitals that sent it --
weight 0 for the others, exactly as for a feature a hospital lacks (Theorem 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from clinograph.core.spec import ModuleKind

from ..config import NSFLConfig
from ..graph.star import StarBatch
from .modules import ModuleMap, Piece
from .nsfl import NSFLModel


class WaveformEncoder(nn.Module):
    """Enc_m: two strided 1-D convolutions, mean- and max-pooled, then a linear map to d_h.
    Only Conv1d/Linear leaves (Opacus-compatible). Shapes: [B, L] -> [B, d]."""

    def __init__(self, hidden: int, *, channels: int = 8):
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 7, stride=2, padding=3)
        self.conv2 = nn.Conv1d(channels, 2 * channels, 5, stride=2, padding=2)
        self.out = nn.Linear(4 * channels, hidden)

    def forward(self, signal: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(signal.unsqueeze(1)))
        h = torch.relu(self.conv2(h))
        return self.out(torch.cat([h.mean(-1), h.amax(-1)], dim=-1))


@dataclass(frozen=True, repr=False)
class ModalStarBatch(StarBatch):
    """Stars plus, per modality, the signal [n, L] and whether each patient has it [n]."""

    signals: tuple[torch.Tensor, ...] = ()
    has: tuple[torch.Tensor, ...] = ()

    def select(self, idx: torch.Tensor) -> ModalStarBatch:
        return ModalStarBatch(self.feature_index[idx], self.values[idx], self.mask[idx], self.labels[idx],
                              signals=tuple(s[idx] for s in self.signals), has=tuple(h[idx] for h in self.has))

    def __repr__(self) -> str:
        return f"ModalStarBatch(patients={len(self)}, modalities={len(self.signals)})"


#: the signal an absent modality is given (its δ is 0, so its value never matters)
_ABSENT_LENGTH = 8


def modal_stars(stars: StarBatch, modalities: Sequence[str],
                signals: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> ModalStarBatch:
    """``stars`` with each modality's signal and flags (an absent modality: zeros, flags false)."""
    n = int(stars.feature_index.shape[0])
    sigs, flags = [], []
    for m in modalities:
        if m in signals:
            sigs.append(torch.as_tensor(np.asarray(signals[m][0], np.float32)))
            flags.append(torch.as_tensor(np.asarray(signals[m][1], bool)))
        else:
            sigs.append(torch.zeros(n, _ABSENT_LENGTH))
            flags.append(torch.zeros(n, dtype=torch.bool))
    return ModalStarBatch(stars.feature_index, stars.values, stars.mask, stars.labels, signals=tuple(sigs),
                          has=tuple(flags))


class ModalityNSFL(NSFLModel):
    """NS-FL on stars with modality nodes (module docstring). ``modalities``: the federation's
    modality names, in a fixed order (the same at every hospital)."""

    def __init__(self, n_features: int, config: NSFLConfig | None = None, *, modalities: Sequence[str]):
        cfg = config or NSFLConfig()
        super().__init__(n_features, cfg)
        d = cfg.hidden
        self.modalities = tuple(modalities)
        gen = torch.Generator().manual_seed(cfg.init_seed + 2)
        self.encoders = nn.ModuleDict({m: WaveformEncoder(d) for m in self.modalities})
        self.l1_of_modality = nn.ModuleDict({m: nn.Linear(d, d, bias=False) for m in self.modalities})
        self.l2_of_modality = nn.ModuleDict({m: nn.Linear(d, d, bias=False) for m in self.modalities})
        with torch.no_grad():
            for name, p in sorted(self.named_parameters()):
                if name.startswith(("encoders.", "l1_of_modality.", "l2_of_modality.")):
                    (nn.init.xavier_uniform_(p, generator=gen) if p.dim() >= 2 else nn.init.zeros_(p))

    def forward_modal(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                      signals: Sequence[torch.Tensor], has: Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits. Shapes: [B, K] x3, signals [B, L_m], has [B] per modality -> [B]."""
        b = feature_index.shape[0]
        xc = self._clip(values)
        h_p0 = self.epsilon.expand(b, -1)
        h_f0 = self.feature_init(feature_index)
        extra1 = h_p0.new_zeros(b, h_p0.shape[-1])
        extra2 = h_p0.new_zeros(b, h_p0.shape[-1])
        for name, sig, hm in zip(self.modalities, signals, has, strict=True):
            delta = hm.to(h_p0.dtype).unsqueeze(-1)
            h_m = self.encoders[name](sig.to(h_p0.dtype))
            extra1 = extra1 + delta * self.l1_of_modality[name](h_m)
            extra2 = extra2 + delta * self.l2_of_modality[name](h_m)
        h_p1 = torch.relu(self.l1_self_patient(h_p0) + self.l1_of_patient.dense(h_f0, h_p0, xc, mask) + extra1)
        h_f1 = torch.relu(self.l1_self_feature(h_f0) + self.l1_has_feature.W(h_p0).unsqueeze(1))
        h_p2 = torch.relu(self.l2_self_patient(h_p1) + self.l2_of_patient.dense(h_f1, h_p1, xc, mask) + extra2)
        return self.head(h_p2).squeeze(-1) + self.linear_star(feature_index, xc, mask)

    def forward_star(self, feature_index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Stars without any modality node (new patients scored from their table alone)."""
        b = feature_index.shape[0]
        none = [torch.zeros(b, 1) for _ in self.modalities]
        return self.forward_modal(feature_index, values, mask, none, [torch.zeros(b, dtype=torch.bool)] * len(none))

    def forward_batch(self, stars: StarBatch, batch: torch.Tensor | None = None, *, chunk: int = 512) -> torch.Tensor:
        if not isinstance(stars, ModalStarBatch):
            return super().forward_batch(stars, batch, chunk=chunk)
        idx = torch.arange(len(stars)) if batch is None else batch
        outs = []
        for j in range(0, len(idx), chunk):
            i = idx[j:j + chunk]
            outs.append(self.forward_modal(stars.feature_index[i], stars.values[i], stars.mask[i],
                                           [s[i] for s in stars.signals], [h[i] for h in stars.has]))
        return torch.cat(outs)


def modality_module_names(modality: str) -> tuple[str, str, str]:
    """The shared modules of modality ``modality``."""
    return (f"modality/{modality}/encoder", f"gnn/layer1/of_patient_{modality}", f"gnn/layer2/of_patient_{modality}")


def add_modality_modules(mm: ModuleMap, model: NSFLModel) -> ModuleMap:
    """Declare every modality's encoder and relations (shared) on ``mm`` (no-op for other models)."""
    if not isinstance(model, ModalityNSFL):
        return mm
    for m in model.modalities:
        enc, r1, r2 = modality_module_names(m)
        mm.add_submodule(enc, ModuleKind.SHARED, model.encoders[m])
        mm.add(r1, ModuleKind.SHARED, [Piece(model.l1_of_modality[m].weight)])
        mm.add(r2, ModuleKind.SHARED, [Piece(model.l2_of_modality[m].weight)])
    return mm
