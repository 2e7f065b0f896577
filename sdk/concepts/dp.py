"""Patient-level DP-SGD for concept models (F-CMs appendix E.4, eqs. 3-4), on the per-patient engine.

F-CMs trains every client with DP-SGD (Abadi et al. 2016): per-sample gradients, each clipped to
L2 norm C (eq. 4, C = 1.0), Gaussian noise σ·C added to the (mini-batch) sum before the
optimiser step, σ chosen by the accountant for (ε, δ) and the training plan. The per-patient
gradients, their clipped sum and the step are those of every local-DP task
(:class:`clinograph.sdk.privacy.per_patient.PerPatientClipper`,
:func:`~clinograph.sdk.privacy.per_patient.dp_sgd_step`): a concept model's parameters sit in
``nn.Linear`` leaves (its :class:`~.layers.BlockLinear` included, whose input-less form outputs
its bias alone) or in the encoder's leaves, all covered by the engine's part rules.

The per-patient loss is F-CMs eq. (2) for one row, ``γ Σ_j CE(c_j) + (1−γ) CE(y)`` over the
nodes the client supervises (a missing label, ``-1``, contributes 0): :func:`row_losses`, whose
sum is the engine's objective. On a batch whose rows carry every supervised label its mean is
:func:`~.model.fcm_loss`.

Two uses (the research loop :mod:`research.fcm_bnlearn.fcm_federation`):

- **local DP** (the paper's): :func:`dp_sgd_step` -- Poisson batch, clip, noise, mean over the
  expected batch, optimiser step -- at every local step of every client.
- **distributed DP** (issue 14): :func:`clipped_sum` gives a client's clipped per-patient
  gradient sum over the modules it trains, which the client quantises and noises with its
  Skellam share (:mod:`clinograph.sdk.privacy.distributed`).

Guarantees: one patient changes a client's clipped sum by at most C in L2 (tested). Does not
account ε (the caller calibrates σ) nor hide anything outside the gradients.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..privacy.per_patient import PerPatientClipper
from ..privacy.per_patient import dp_sgd_step as engine_step
from .model import ConceptModel


@dataclass(frozen=True)
class ConceptLabels:
    """A batch's labels for :func:`concept_objective`: node -> (B,) int64 (``-1`` = missing), and
    which nodes the client supervises (F-CMs eq. 2's I(k) and the task indicator)."""

    labels: Mapping[str, torch.Tensor]
    supervised: frozenset[str]
    has_task: bool
    task: str
    gamma: float


def row_losses(model: ConceptModel, x: torch.Tensor, labels: Mapping[str, torch.Tensor],
               interventions: Mapping[str, torch.Tensor], *, supervised: Collection[str], has_task: bool, task: str,
               gamma: float) -> torch.Tensor:
    """F-CMs eq. (2) for every row at once (one batched forward). Shapes: (B,)."""
    out = model(x, interventions=dict(interventions))
    total = x.new_zeros((int(x.shape[0]),))
    for v in sorted(supervised):
        if v != task and v in out.logits and v in labels:
            total = total + gamma * F.cross_entropy(out.logits[v], labels[v], ignore_index=-1, reduction="none")
    if has_task and task in out.logits and task in labels:
        total = total + (1.0 - gamma) * F.cross_entropy(out.logits[task], labels[task], ignore_index=-1,
                                                        reduction="none")
    return total


def concept_objective(model: nn.Module, inputs: Sequence[object], labels: ConceptLabels) -> torch.Tensor:
    """The engine's objective: Σ_i of :func:`row_losses` (``inputs``: x, interventions)."""
    x, interventions = inputs
    return row_losses(model, x, labels.labels, interventions, supervised=labels.supervised,
                      has_task=labels.has_task, task=labels.task, gamma=labels.gamma).sum()


#: one engine a (model, trained parameters): built when the trained modules change (a round)
_ENGINES: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[str, ...], PerPatientClipper]] = weakref.WeakKeyDictionary()


def concept_probe(model: ConceptModel, like: torch.Tensor,
                  patients: int = 4) -> tuple[tuple[torch.Tensor, dict], ConceptLabels]:
    """A synthetic batch shaped like ``like`` (values on a fixed ramp, every node labelled,
    states cycling; no patient data) for the engine's construction check."""
    shape = (patients, *like.shape[1:])
    x = torch.linspace(-1.5, 1.5, int(np.prod(shape)), dtype=like.dtype).reshape(shape)
    graph = model.graph
    labels = {v: torch.arange(patients) % graph.cards[v] for v in graph.nodes}
    return (x, {}), ConceptLabels(labels, frozenset(graph.nodes), True, graph.task, 0.8)


def concept_clipper(model: ConceptModel, names: Sequence[str], *, like: torch.Tensor | None = None) -> PerPatientClipper:
    """The per-patient engine of ``model`` over the parameters ``names`` (those that require a
    gradient, in the model's order), built once while they stay the trained ones (a model whose
    modules are replaced under the same names is a new model object here). With ``like``
    (a batch of encoder inputs, a tensor), checked at construction on a synthetic probe of its
    shape (:func:`concept_probe`; no patient data).

    Raises:
        ValueError: ``names`` is not the model's trainable parameters in order.
        PrivacyError: a trained parameter outside the engine's leaves (see the engine).
    """
    key = tuple(names)
    cached = _ENGINES.get(model)
    if cached is not None and cached[0] == key:  # names change with the trained modules (each round)
        return cached[1]
    if list(names) != trainable_names(model):
        raise ValueError("Concept DP: names must be the model's trainable parameters (trainable_names(model)); "
                         "freeze the others first.")
    probe = concept_probe(model, like) if isinstance(like, torch.Tensor) and names else None
    clipper = PerPatientClipper(model, objective=concept_objective, probe=probe[0] if probe else None,
                                probe_labels=probe[1] if probe else None)
    _ENGINES[model] = (key, clipper)
    return clipper


def _batch_labels(labels: Mapping[str, torch.Tensor], *, supervised: Collection[str], has_task: bool, task: str,
                  gamma: float) -> ConceptLabels:
    return ConceptLabels(dict(labels), frozenset(supervised), bool(has_task), task, float(gamma))


def _param_groups(model: ConceptModel, groups: Sequence[Collection[str]] | None) -> list[list[nn.Parameter]] | None:
    if groups is None:
        return None
    named = dict(model.named_parameters())
    return [[named[n] for n in g] for g in groups]


def clipped_sum(model: ConceptModel, names: Sequence[str], x: torch.Tensor, labels: Mapping[str, torch.Tensor],
                interventions: Mapping[str, torch.Tensor], *, clip: float, supervised: Collection[str],
                has_task: bool, task: str, gamma: float,
                groups: Sequence[Collection[str]] | None = None) -> torch.Tensor:
    """Σ_i clip(g_i) over the rows, the parameters ``names`` in order: one patient moves it by
    at most ``clip`` in L2. Shapes: (Σ numel,) float64.

    ``groups`` (a partition of ``names``, e.g. one group a module): per-group clipping
    (McMahan et al. 2018's per-layer clipping, Opacus ``clipping="per_layer"``): each row's
    gradient restricted to group j is clipped to ``clip/√G`` (G groups), so the whole row still
    moves the sum by at most ``clip``. The engine's :meth:`PerPatientClipper.clipped_sum`.
    """
    engine = concept_clipper(model, names, like=x)
    y = _batch_labels(labels, supervised=supervised, has_task=has_task, task=task, gamma=gamma)
    out = engine.clipped_sum(x, dict(interventions), labels=y, clip_norm=clip, groups=_param_groups(model, groups))
    return out.summed.double()


def set_gradients(model: ConceptModel, names: Sequence[str], flat: torch.Tensor) -> None:
    """``p.grad`` of every parameter in ``names`` from one flat vector (the order of ``names``)."""
    named = dict(model.named_parameters())
    at = 0
    for n in names:
        p = named[n]
        p.grad = flat[at:at + p.numel()].view_as(p).to(p.dtype).clone()
        at += p.numel()


def dp_sgd_step(model: ConceptModel, optimizer: torch.optim.Optimizer, names: Sequence[str], x: torch.Tensor,
                labels: Mapping[str, torch.Tensor], interventions: Mapping[str, torch.Tensor], *,
                noise_multiplier: float, clip: float, expected_batch: float, supervised: Collection[str],
                has_task: bool, task: str, gamma: float, noise: Callable | None = None,
                groups: Sequence[Collection[str]] | None = None) -> None:
    """One DP-SGD step (F-CMs E.4 as Opacus does it): the engine's
    :func:`~clinograph.sdk.privacy.per_patient.dp_sgd_step` -- the clipped sum plus N(0, σ²C²)
    from the CSPRNG (``noise`` replaces it in tests only), divided by the EXPECTED Poisson batch
    size (so an empty batch still steps on noise alone), then ``optimizer.step()``."""
    engine = concept_clipper(model, names, like=x)
    y = _batch_labels(labels, supervised=supervised, has_task=has_task, task=task, gamma=gamma)
    optimizer.zero_grad(set_to_none=True)
    engine_step(engine, optimizer, (x, dict(interventions)), labels=y, noise_multiplier=noise_multiplier,
                clip_norm=clip, expected_batch=expected_batch, groups=_param_groups(model, groups), noise=noise)


def module_groups(model: ConceptModel, names: Sequence[str]) -> list[list[str]]:
    """``names`` grouped by concept-model module (``encoder/...``, ``concept/<c>``, ``head/task``;
    :func:`.params.module_parameters`), for per-module clipping; empty groups dropped."""
    from .params import module_parameters

    by_id = {id(p): n for n, p in model.named_parameters()}
    wanted = set(names)
    groups = [[by_id[id(p)] for p in ps if by_id[id(p)] in wanted] for ps in module_parameters(model).values()]
    return [g for g in groups if g]


def trainable_names(model: ConceptModel) -> list[str]:
    """Names of the parameters that currently require a gradient (the client's modules)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def poisson_rows(n: int, rate: float) -> np.ndarray:
    """Row indices each kept with probability ``rate`` (CSPRNG coins, never numpy.random)."""
    from ..privacy.distributed import poisson_sample

    return poisson_sample(n, rate)
