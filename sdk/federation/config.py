"""Federation configs, loaded from TOML (``extra="forbid"``: an unknown key is an error that names it)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..model.nsfl import NSFLConfig
from ..training.local import TrainConfig


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FederationSection(_Strict):
    """[federation]: what the server runs."""

    id: str = Field(default="clinograph-sim", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
    rounds: int = Field(default=10, ge=1, le=10_000)
    secure_mode: str = "masked"
    strategy: str = "fedsgd"
    server_lr: float = Field(default=1.0, gt=0)
    min_clients: int = Field(default=2, ge=1)
    local_epochs: int = Field(default=2, ge=1)
    environment: Literal["development", "production"] = "development"
    seed: int = 0
    masked_threshold: int | None = Field(default=None, ge=1, description="t; default: ceil(2n/3)")
    masked_clip: float = Field(default=4.0, gt=0, description="bound on |Δ| per parameter (× max weight = the "
                               "fixed-point range of the masked mode)")

    @field_validator("secure_mode")
    @classmethod
    def _known_mode(cls, v: str) -> str:
        from clinograph.secure.aggregation import registered_modes

        if v not in registered_modes():
            raise ValueError(f"Unknown secure mode {v!r}. Registered: {', '.join(registered_modes())}.")
        return v

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, v: str) -> str:
        from clinograph.secure.strategies import registered_strategies

        if v not in registered_strategies():
            raise ValueError(f"Unknown aggregator {v!r}. Registered: {', '.join(registered_strategies())}.")
        return v


class GraphSection(_Strict):
    """[graph]: how each hospital builds its knowledge graph."""

    k_similar: int = Field(default=5, ge=0, le=100)


class PrivacySection(_Strict):
    """[privacy]: patient-level DP-SGD (issue 4); off here means the run has no DP guarantee."""

    enabled: bool = False
    epsilon_budget: float = Field(default=10.0, gt=0)
    delta: float = Field(default=1e-5, gt=0, lt=1)
    clip_norm: float = Field(default=1.0, gt=0)
    noise_multiplier: float | None = Field(default=None, ge=0, description="σ; None: calibrate from target_epsilon")
    batch_size: int = Field(default=64, ge=1, description="expected Poisson batch size B (q = 1/ceil(n/B))")
    release_metrics: bool = False
    target_epsilon: float | None = Field(default=None, gt=0, description="calibration target; default epsilon_budget")
    planned_rounds: int | None = Field(default=None, ge=1, description="rounds σ is calibrated over; default federation.rounds")
    accountant: Literal["rdp", "prv"] = "rdp"
    state_dir: Path | None = Field(default=None, description="ledger folder; default <output>/privacy/<site>")
    clipping: Literal["flat", "adaptive"] = "flat"
    target_unclipped_quantile: float = Field(default=0.5, gt=0, lt=1, description="adaptive clipping only")
    clipbound_learning_rate: float = Field(default=0.2, gt=0, description="adaptive clipping only")
    max_clipbound: float = Field(default=1.0, gt=0, description="adaptive clipping only; reported as the clip norm")
    min_clipbound: float = Field(default=0.01, gt=0, description="adaptive clipping only")
    unclipped_num_std: float = Field(default=10.0, gt=0, description="adaptive clipping only (σ_b)")
    grad_sample_mode: Literal["hooks", "ew"] = Field(default="hooks", description="Opacus per-sample gradients")


class HospitalEntry(_Strict):
    """[[hospitals]]: one site's table and schema."""

    site: str
    table: Path
    schema_file: Path = Field(alias="schema")


class SimulationConfig(_Strict):
    """A whole simulated federation."""

    federation: FederationSection = Field(default_factory=FederationSection)
    model: NSFLConfig = Field(default_factory=NSFLConfig)
    training: TrainConfig = Field(default_factory=TrainConfig)
    graph: GraphSection = Field(default_factory=GraphSection)
    privacy: PrivacySection = Field(default_factory=PrivacySection)
    dictionary: Path | None = None
    hospitals: tuple[HospitalEntry, ...] = ()
    output: Path = Path("runs/simulation")
    test_fraction: float = Field(default=0.3, gt=0, lt=1)
    publish_feature_relevance: bool = True

    @classmethod
    def from_toml(cls, path: str | Path) -> SimulationConfig:
        """Load a config; relative paths are taken from the config's folder."""
        from ..tomlio import load_toml_model

        def relative_to_config(data: dict, p: Path) -> None:
            base = p.parent
            for h in data.get("hospitals", []):
                for key in ("table", "schema"):
                    if key in h and not Path(h[key]).is_absolute():
                        h[key] = str(base / h[key])
            if "dictionary" in data and not Path(data["dictionary"]).is_absolute():
                data["dictionary"] = str(base / data["dictionary"])

        return load_toml_model(cls, path, what="config", prepare=relative_to_config)
