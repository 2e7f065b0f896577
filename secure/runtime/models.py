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

A run may begin with **set-up sums** (:attr:`RunModels.setup`, driven by :mod:`.setup`): each a
:class:`SetupSum` (public name, module, vector length, cap), announced by a signed
:class:`SetupAnnounce` (step ``setup/sum``), summed in one FedSGD round over the transport, and
closed by a signed :class:`SetupClose` (step ``setup/result``) that every hospital answers with
its signed :class:`SetupResult`: what it derived from the sum, which must agree everywhere.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from clinograph.core.errors import ConfigError
from clinograph.core.fields import RoundNumber
from clinograph.core.spec import MODULE_NAME_PATTERN

from ..messages import ID_PATTERN, WireMessage
from .build import MAX_INITIAL_MODEL_BYTES, InitialModel, initial_model_from_bytes
from .elimination import EliminationRule
from .selection import SelectionRule

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,39}$"
#: a set-up sum's public name, which is also an audit entry kind
SETUP_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
#: most models one choice trains (candidates x restarts)
MAX_CANDIDATES = 16
#: most set-up sums before a run's candidates
MAX_SETUP_SUMS = 8
HEX64 = r"^[0-9a-f]{64}$"


def overrides_digest(overrides: str) -> str:
    """SHA-256 of a candidate's canonical overrides JSON (what :class:`RunStart` carries)."""
    return hashlib.sha256(overrides.encode()).hexdigest()


class CandidateModel(WireMessage):
    """One candidate: its name, its public overrides (canonical JSON) and its initial model."""

    kind: Literal["candidate_model"] = "candidate_model"
    name: str = Field(pattern=NAME_PATTERN)
    overrides: str = Field(max_length=4000)
    initial: InitialModel


class SetupSum(WireMessage):
    """One set-up secure sum the hospitals run before the candidates (``clinograph model init``
    writes it from the hospital config; :mod:`.setup` drives it): every hospital contributes a
    vector of ``length`` non-negative counts (each capped at ``cap``) in the shared module
    ``module``; the server learns the sum only.

    ``announce``: canonical JSON of the sum's public parameters, audited under kind ``name``
    before the round with the run's ``secure_mode`` added (None: nothing to announce). ``result_kind``: the audit kind of what the
    hospitals derive from the sum (their agreed :class:`SetupResult`)."""

    kind: Literal["setup_sum"] = "setup_sum"
    name: str = Field(pattern=SETUP_NAME_PATTERN)
    module: str = Field(pattern=MODULE_NAME_PATTERN, max_length=200)
    length: int = Field(ge=1, le=10_000_000)
    cap: float = Field(gt=0, allow_inf_nan=False)
    announce: str | None = Field(default=None, max_length=1_000_000)
    result_kind: str = Field(pattern=SETUP_NAME_PATTERN)


class VotePhase(WireMessage):
    """A run whose model is built from a DAG the hospitals vote first (F-CMs, section 4.2.1;
    driven by :mod:`.voted`): ``rounds`` voting rounds of strategy ``dag_voting`` over the public
    ``concepts`` (task node ``task``, tie-break ``seed``), then every hospital derives the concept
    model from the voted DAG and the training run starts from the model they all derived."""

    kind: Literal["vote_phase"] = "vote_phase"
    concepts: tuple[str, ...] = Field(min_length=2, max_length=1000)
    task: str = Field(max_length=200)
    seed: int = Field(ge=0, le=2**31)
    rounds: int = Field(default=1, ge=1, le=100)

    def strategy_options(self) -> dict[str, float | int | str | bool]:
        """The ``dag_voting`` strategy's options."""
        return {"concepts": ",".join(self.concepts), "task": self.task, "seed": self.seed}


class RunModels(WireMessage):
    """The candidates of a run, simplest first (ties go to the earlier), and the selection rule
    (None: no selection -- the last round's model is kept, one candidate only); ``setup``: the
    set-up sums that run first, in order; ``elimination``: how several candidates are eliminated
    early on the federated validation loss (:mod:`.elimination`; None: every candidate trains the
    whole run)."""

    kind: Literal["run_models"] = "run_models"
    task: str = Field(max_length=64)
    selection: SelectionRule | None
    candidates: tuple[CandidateModel, ...] = Field(min_length=1, max_length=MAX_CANDIDATES)
    setup: tuple[SetupSum, ...] = Field(default=(), max_length=MAX_SETUP_SUMS)
    elimination: EliminationRule | None = None
    #: a voted run (concepts): the one candidate is the vote model; the trained model is derived
    vote: VotePhase | None = None

    @model_validator(mode="after")
    def _consistent(self) -> RunModels:
        names = [c.name for c in self.candidates]
        if len(set(names)) != len(names):
            raise ValueError(f"candidate names repeat: {sorted({n for n in names if names.count(n) > 1})}")
        if len(names) > 1 and self.selection is None:
            raise ValueError("several candidates need a selection rule (they are compared on validation loss)")
        if self.elimination is not None and self.selection is None:
            raise ValueError("early elimination needs a selection rule (it compares validation losses)")
        if len({c.initial.dictionary_hash for c in self.candidates}) != 1:
            raise ValueError("candidates are built on different feature dictionaries")
        if self.vote is not None and (names != ["vote"] or self.selection is not None or self.setup):
            raise ValueError("a voted run has one candidate, named 'vote' (the vote model), no selection and no "
                             "set-up sums")
        for field in ("name", "module"):
            values = [getattr(s, field) for s in self.setup]
            if len(set(values)) != len(values):
                raise ValueError(f"set-up sums repeat a {field}: {sorted({v for v in values if values.count(v) > 1})}")
        return self

    @property
    def dictionary_hash(self) -> str:
        """The feature dictionary every candidate is built on."""
        return self.candidates[0].initial.dictionary_hash

    def default_lines(self) -> list[str]:
        """The lines of every setting a rule resolved in any candidate (:attr:`.build.InitialModel.defaults`),
        once each: what ``clinograph model init`` and the ServerApp say."""
        return list(dict.fromkeys(d.line for c in self.candidates for d in c.initial.defaults))

    def on_dictionary(self, dictionary_hash: str) -> RunModels:
        """The same run on the dictionary ``dictionary_hash`` (the one a set-up sum derived and
        every hospital agreed on): the initial models' shapes and values do not depend on the
        dictionary's scales, only the digest every plan carries changes."""
        return self.model_copy(update={"candidates": tuple(
            c.model_copy(update={"initial": c.initial.model_copy(update={"dictionary_hash": dictionary_hash})})
            for c in self.candidates)})

    @classmethod
    def single(cls, initial: InitialModel, *, selection: SelectionRule | None = None) -> RunModels:
        """One model (named ``model``, no overrides)."""
        return cls(task=initial.task, selection=selection,
                   candidates=(CandidateModel(name="model", overrides="{}", initial=initial),))

    def to_bytes(self) -> bytes:
        """JSON bytes (what ``clinograph model init`` writes)."""
        return self.model_dump_json().encode()


def run_models_from_file(path: str | Path) -> RunModels:
    """:func:`run_models_from_bytes` of the file at ``path``, read as a regular file of at most
    :data:`MAX_INITIAL_MODEL_BYTES` (a FIFO or device is refused before any read).

    Raises:
        ConfigError: unreadable, not a regular file, too large, or not such a file.
    """
    from clinograph.core.fileio import NotRegularFile, TooLarge, read_regular

    try:
        data = read_regular(path, limit=MAX_INITIAL_MODEL_BYTES)
    except NotRegularFile as exc:
        raise ConfigError(f"Cannot read the initial model {path}: it is {exc.kind}, not a regular file. Give the "
                          "file `clinograph model init` wrote.") from None
    except TooLarge:
        raise ConfigError(f"Cannot read the initial model {path}: it is over the limit of {MAX_INITIAL_MODEL_BYTES} "
                          "bytes for an initial model file. Give the file `clinograph model init` wrote.") from None
    except OSError as exc:
        raise ConfigError(f"Cannot read the initial model {path}: {exc.strerror or type(exc).__name__}.") from None
    return run_models_from_bytes(data)


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
    round: RoundNumber


def run_id(federation_id: str, candidate: str, *, count: int) -> str:
    """The federation id a candidate's run uses: the federation's own with one candidate, else
    ``<id>-<candidate>`` (each run has its own plans, anchors and CKKS keys)."""
    return federation_id if count == 1 else f"{federation_id}-{candidate}"[:64]


class SetupAnnounce(WireMessage):
    """Server -> hospitals, signed, before a set-up sum's round ``round`` (step ``setup/sum``):
    sum ``sum`` (index ``index`` of ``count``) runs now, over dictionary ``dictionary_hash``,
    under ``secure_mode``. A hospital builds its share only for a sum its own config asks for."""

    kind: Literal["setup_announce"] = "setup_announce"
    federation_id: str = Field(pattern=ID_PATTERN)
    sum: SetupSum
    index: int = Field(ge=0, lt=MAX_SETUP_SUMS)
    count: int = Field(ge=1, le=MAX_SETUP_SUMS)
    round: RoundNumber
    dictionary_hash: str = Field(pattern=HEX64)
    secure_mode: str = Field(max_length=40)


class SetupClose(WireMessage):
    """Server -> hospitals, signed, after a set-up sum's round (step ``setup/result``): the round
    closed with ``contributors`` hospitals in the sum (public: ``round_participation`` lists
    them); decode the sum from the delivered model and answer with a :class:`SetupResult`."""

    kind: Literal["setup_close"] = "setup_close"
    federation_id: str = Field(pattern=ID_PATTERN)
    name: str = Field(pattern=SETUP_NAME_PATTERN)
    round: RoundNumber
    contributors: int = Field(ge=1)


class SetupResult(WireMessage):
    """Hospital -> server, signed: what hospital ``client`` derived from set-up sum ``name``.

    ``outcome``: canonical JSON of the public result (audited as the sum's ``result_kind``);
    ``dictionary_hash``: the dictionary it trains with from now on, when the sum derived one;
    ``error``: why the run cannot go on (e.g. no feature is shared). Every hospital must send the
    same three; a disagreement is a ProtocolError."""

    kind: Literal["setup_result"] = "setup_result"
    federation_id: str = Field(pattern=ID_PATTERN)
    name: str = Field(pattern=SETUP_NAME_PATTERN)
    round: RoundNumber
    client: str = Field(max_length=200)
    outcome: str = Field(max_length=1_000_000)
    dictionary_hash: str | None = Field(default=None, pattern=HEX64)
    error: str | None = Field(default=None, max_length=4000)


class DeriveRequest(WireMessage):
    """Server -> hospitals, signed, after a voted run's last vote round ``round`` (step
    ``vote/derive``): decide the DAG from the tally in the global model you loaded and build the
    model on it; answer with a :class:`DerivedModel` and the model (part ``model``)."""

    kind: Literal["derive_request"] = "derive_request"
    federation_id: str = Field(pattern=ID_PATTERN)
    round: RoundNumber


class DerivedModel(WireMessage):
    """Hospital -> server, signed: the DAG hospital ``client`` decided from the vote of round
    ``round`` (canonical JSON of the ``dag_outcome``) and the SHA-256 of the initial model it built
    on it (sent beside, as the part ``model``). Every hospital must send the same."""

    kind: Literal["derived_model"] = "derived_model"
    federation_id: str = Field(pattern=ID_PATTERN)
    client: str = Field(max_length=200)
    round: RoundNumber
    dag: str = Field(max_length=1_000_000)
    initial_sha256: str = Field(pattern=HEX64)
