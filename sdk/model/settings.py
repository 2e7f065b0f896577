"""The weight-free model settings that decide an NS-FL model's forward pass, as one digest.

Two models with the same weights compute different risks when a setting that holds no weight
differs: ``deep`` (the GNN's contribution switched off), ``negative_slope``, ``value_clip``,
``value_encoding``, ``linear_shape``, the survival grid's interval ends, .... The weights' names
and shapes do not show them, so a check of the weights alone (:mod:`.release`) cannot either.
:func:`settings_digest` is the SHA-256 of their canonical JSON:

- ``clinograph model init`` puts it in the initial model (:attr:`InitialModel.settings_sha256
  <clinograph.secure.runtime.build.InitialModel>`), the server carries it in every signed plan
  (option :data:`PLAN_OPTION`), and a hospital refuses a plan whose digest is not its own
  (:func:`check_plan_settings`): hospitals whose settings silently differ never train together;
- the release check of an export (:mod:`.release`) requires that the signed plan of the round
  whose global model the export holds carries the digest of the export's description, so a
  description with other settings is refused even when its weights are the released ones.

``[model] features`` is covered as "every feature" or "a chosen subset" only: ``"shared"`` is
resolved to a list during the run, so the initial settings cannot name the list; which subset
an export reads (its ``features_used``, which must be what its ``model.features`` selects)
rests on the hospital's signature. Not covered either: ``init_seed`` and ``mask_init_logit``
(they choose initial weights, which the weights check covers), the calibration and the horizons
(the hospital's own, signed by it). Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from clinograph.core.errors import ProtocolError

if TYPE_CHECKING:
    from ..config import HospitalConfig, NSFLConfig
    from .description import ModelDescription

#: the plan option that carries the digest (server -> hospitals, signed with the plan)
PLAN_OPTION = "model.settings"
#: the tasks whose model is the NS-FL model these settings describe
NSFL_TASKS = ("nsfl",)
#: versioned: a change of what is covered is a change of every digest
FORMAT = "clinograph-nsfl-forward-settings/1"
#: [model] keys outside the digest's fields (``features`` is covered as all / a chosen subset)
NOT_FORWARD = frozenset({"init_seed", "mask_init_logit", "features"})


def forward_settings(model: NSFLConfig, *, survival_breaks: Sequence[float] | None) -> dict[str, Any]:
    """The settings the digest covers: every ``[model]`` key but :data:`NOT_FORWARD`, whether the
    model reads every feature or a chosen subset, and the survival head's interval ends (None: a
    binary model)."""
    fields = model.model_dump(mode="json", exclude=set(NOT_FORWARD))
    breaks = [float(b) for b in survival_breaks] if survival_breaks else None
    # every feature, or a chosen subset (a list, or "shared" as the run resolves it to a list)
    features = "all" if model.features == "all" else "chosen"
    return {"format": FORMAT, "model": fields, "features": features, "survival_breaks": breaks}


def settings_digest(model: NSFLConfig, *, survival_breaks: Sequence[float] | None) -> str:
    """SHA-256 (hex) of :func:`forward_settings` as canonical JSON."""
    text = json.dumps(forward_settings(model, survival_breaks=survival_breaks), sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def config_settings_digest(config: HospitalConfig) -> str | None:
    """The digest of a hospital config's model (None: its task is not NS-FL)."""
    if config.task not in NSFL_TASKS:
        return None
    breaks = config.target.breaks if config.target.kind == "survival" else None
    return settings_digest(config.model, survival_breaks=breaks)


def task_settings_digest(task: object) -> str | None:
    """The digest of a hospital's built task's model (None: not an NS-FL task with a config)."""
    config = getattr(task, "config", None)
    if getattr(task, "name", None) not in NSFL_TASKS or config is None or not hasattr(config, "model"):
        return None
    return config_settings_digest(config)


def description_settings_digest(description: ModelDescription) -> str:
    """The digest of the settings an export's description rebuilds its model with."""
    breaks = description.survival.breaks if description.survival is not None else None
    return settings_digest(description.model, survival_breaks=breaks)


def check_plan_settings(options: dict[str, Any], *, task: object, hospital: str, round_: int) -> None:
    """ProtocolError unless the plan's :data:`PLAN_OPTION` is the digest of the model settings of
    the hospital's ``task`` (nothing to check when it is not an NS-FL task)."""
    ours = task_settings_digest(task)
    if ours is None:
        return
    theirs = options.get(PLAN_OPTION)
    if theirs == ours:
        return
    found = (f"names model settings {str(theirs)[:12]}…" if theirs is not None else
             "names no model settings (its initial model file was written by an older `clinograph model init`)")
    raise ProtocolError(f"Hospital {hospital!r}: the plan for round {round_} {found}, but this hospital's [model] "
                        f"settings (and survival [target] breaks) digest to {ours[:12]}…. The federation would train "
                        "models that compute differently from the same weights. Fix: give every hospital the same "
                        "[model] section, [target] breaks and [privacy] enabled (under [privacy] an unwritten [model] deep "
                        "becomes false: clinograph.sdk.config.dp_default_model), and write the server's initial model with "
                        "`clinograph model init --config` on that hospital config.")
