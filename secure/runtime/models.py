"""What a federation run trains: its candidate models and the rule that keeps one (torch-free).

``clinograph model init --config hospital.toml`` writes a :class:`RunModels` file from a hospital
config (the hospital install computes the initial weights; the server, a lean install, only
reads them): each candidate's name, its public config overrides and its initial model, and the
selection rule (patience, min_delta) every round's plan carries. ``simulate()`` builds the same
object in process from the same function. A plain :class:`~.build.InitialModel` file (one model,
no selection) is still read, as a run of one candidate named ``model``.

The messages of the run's own set-up steps (relayed as ``setup`` exchanges, like the CKKS key
ceremony) sit here too: :class:`RunStart` tells the hospitals which candidate the next run
trains, :class:`RunChosen` which candidate the federation kept. Both are signed by the server;
a hospital trains only a candidate its own config lists (same name, same overrides).
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from ..errors import ConfigError
from ..messages import ID_PATTERN, WireMessage
from .build import MAX_INITIAL_MODEL_BYTES, InitialModel, initial_model_from_bytes
from .selection import SelectionRule

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,39}$"
#: most models one choice trains (candidates x restarts)
MAX_CANDIDATES = 16


def overrides_digest(overrides: str) -> str:
    """SHA-256 of a candidate's canonical overrides JSON (what :class:`RunStart` carries)."""
    return hashlib.sha256(overrides.encode()).hexdigest()


class CandidateModel(WireMessage):
    """One candidate: its name, its public overrides (canonical JSON) and its initial model."""

    kind: Literal["candidate_model"] = "candidate_model"
    name: str = Field(pattern=NAME_PATTERN)
    overrides: str = Field(max_length=4000)
    initial: InitialModel


class RunModels(WireMessage):
    """The candidates of a run, simplest first (ties go to the earlier), and the selection rule
    (None: no selection -- the last round's model is kept, one candidate only)."""

    kind: Literal["run_models"] = "run_models"
    task: str = Field(max_length=64)
    selection: SelectionRule | None
    candidates: tuple[CandidateModel, ...] = Field(min_length=1, max_length=MAX_CANDIDATES)

    @model_validator(mode="after")
    def _consistent(self) -> RunModels:
        names = [c.name for c in self.candidates]
        if len(set(names)) != len(names):
            raise ValueError(f"candidate names repeat: {sorted({n for n in names if names.count(n) > 1})}")
        if len(names) > 1 and self.selection is None:
            raise ValueError("several candidates need a selection rule (they are compared on validation loss)")
        if len({c.initial.dictionary_hash for c in self.candidates}) != 1:
            raise ValueError("candidates are built on different feature dictionaries")
        return self

    @classmethod
    def single(cls, initial: InitialModel, *, selection: SelectionRule | None = None) -> RunModels:
        """One model (named ``model``, no overrides)."""
        return cls(task=initial.task, selection=selection,
                   candidates=(CandidateModel(name="model", overrides="{}", initial=initial),))

    def to_bytes(self) -> bytes:
        """JSON bytes (what ``clinograph model init`` writes)."""
        return self.model_dump_json().encode()


def run_models_from_bytes(data: bytes) -> RunModels:
    """Parse a ``clinograph model init`` file: a run's models, or one initial model.

    Raises:
        ConfigError: not such a file (the message names the first problem and the fix).
    """
    if len(data) > MAX_INITIAL_MODEL_BYTES:
        raise ConfigError(f"Initial model file of {len(data)} bytes exceeds {MAX_INITIAL_MODEL_BYTES} bytes.")
    if b'"kind":"initial_model"' in data[:64] or b'"kind": "initial_model"' in data[:64]:
        return RunModels.single(initial_model_from_bytes(data))
    try:
        return RunModels.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ConfigError(f"Not a Clinograph initial model file ({exc.error_count()} problem(s); first: "
                          f"{where + ': ' if where else ''}{first['msg']}). Write one with `clinograph model init`."
                          ) from None


class RunStart(WireMessage):
    """Server -> hospitals, signed, before a candidate's run: train candidate ``candidate`` (whose
    overrides hash to ``overrides_sha256``) as federation ``run_id``, run ``index`` of ``count``,
    for at most ``rounds`` training rounds in all -- the one place the run's length is set; a
    hospital under DP calibrates its noise for it, or refuses when it would break its budget."""

    kind: Literal["run_start"] = "run_start"
    federation_id: str = Field(pattern=ID_PATTERN)
    run_id: str = Field(pattern=ID_PATTERN)
    candidate: str = Field(pattern=NAME_PATTERN)
    overrides_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    index: int = Field(ge=0, lt=MAX_CANDIDATES)
    count: int = Field(ge=1, le=MAX_CANDIDATES)
    rounds: int = Field(ge=1, le=100_000)


class RunChosen(WireMessage):
    """Server -> hospitals, signed, after every candidate ran: keep candidate ``candidate``
    (trained as federation ``run_id``) -- the ``model_chosen`` entry of the audit trail."""

    kind: Literal["run_chosen"] = "run_chosen"
    federation_id: str = Field(pattern=ID_PATTERN)
    run_id: str = Field(pattern=ID_PATTERN)
    candidate: str = Field(pattern=NAME_PATTERN)


class RunFinish(WireMessage):
    """Server -> hospitals, signed, after a run's last round ``round``: keep the model the
    selection rule kept (global + personal) and fit your calibration; answer with your signed
    :class:`~.selection.SelectionStatus` naming the round you kept."""

    kind: Literal["run_finish"] = "run_finish"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: int = Field(ge=0)


def run_id(federation_id: str, candidate: str, *, count: int) -> str:
    """The federation id a candidate's run uses: the federation's own with one candidate, else
    ``<id>-<candidate>`` (each run has its own plans, anchors and CKKS keys)."""
    return federation_id if count == 1 else f"{federation_id}-{candidate}"[:64]
