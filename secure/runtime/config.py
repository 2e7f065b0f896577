"""The server's configuration, from TOML (strict: an unknown key is an error naming it). Torch-free.

``server.toml``::

    initial_model = "initial_model.json"   # written by `clinograph model init` (hospital install)
    audit_dir = "audit"

    [federation]
    id = "my-federation"
    rounds = 20
    secure_mode = "masked"                  # masked (default) | ckks | ckks_threshold | insecure_plaintext
    strategy = "fedsgd"

    [dp_policy]                              # optional: every hospital must run DP within these bounds
    max_epsilon = 10.0
    delta = 1e-5

Every default below is documented where it is declared; :func:`clinograph.secure.runtime.build_server`
is the one place that turns them into the plan's parameters.
"""

from __future__ import annotations

from pathlib import Path
from types import UnionType
from typing import Literal, Union, get_args, get_origin

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from clinograph.core.arguments import checked_arguments
from clinograph.core.configmodel import ConfigModel

from ..messages import ID_PATTERN, DPPolicy

#: Default bound on a hospital's aggregation weight (its training-patient count). A hospital
#: with more patients still takes part, with weight ``max_weight`` (its influence is capped,
#: never refused). The masked mode encodes weights and weighted deltas in fixed point inside
#: +-``max_weight * masked_clip``; at 10 000 and n = 4 the resolution of a weighted value is
#: 7.5e-5, i.e. 2.5e-7 on a delta of a 300-patient hospital (docs/deployment.md).
DEFAULT_MAX_WEIGHT = 10_000.0


def _scalar_kind(annotation: object) -> type | None:
    """``int``, ``float`` or ``bool`` when a field is that scalar (or optional), else None."""
    if annotation in (int, float, bool):
        return annotation  # type: ignore[return-value]
    if get_origin(annotation) in (Union, UnionType):
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        if len(kinds) == 1 and kinds[0] in (int, float, bool):
            return kinds[0]
    return None


class StrictSection(ConfigModel):
    """A config section: frozen, unknown keys refused, and numbers and switches typed as such.

    Pydantic's lax mode would run ``rounds = "5"`` as 5 rounds and ``enabled = 1`` as true: a
    quoted number or a 0/1 switch in a hand-written TOML is more often a mistake (a value pasted
    from a spreadsheet, a key meant for another tool) than an intent, so it is refused with the fix.
    TOML also has ``inf`` and ``nan``: no setting means either (``max_clip_norm = inf`` would let any
    clip through the DP policy), so every float, in lists and tables too, must be finite.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _typed_scalars(cls, value: object, info: ValidationInfo) -> object:
        kind = _scalar_kind(cls.model_fields[info.field_name].annotation) if info.field_name else None
        if kind is None or value is None:
            return value
        want = "true or false" if kind is bool else "an integer" if kind is int else "a number"
        if isinstance(value, str):
            raise ValueError(f"expected {want}, got the text {value!r}; write the value without quotes")
        if kind is bool and isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}; write true or false")
        if kind is not bool and isinstance(value, bool):
            raise ValueError(f"expected {want}, got {str(value).lower()}; write a number")
        return value


_Strict = StrictSection


class FederationSection(_Strict):
    """[federation]: what the server runs. Shared by ``server.toml`` and ``clinograph simulate``."""

    id: str = Field(default="clinograph-sim", pattern=ID_PATTERN)
    rounds: int = Field(default=10, ge=1, le=10_000)
    secure_mode: str = "masked"
    strategy: str = "fedsgd"
    strategy_options: dict[str, float | int | str | bool] = Field(default_factory=dict, max_length=32)
    server_lr: float = Field(default=1.0, gt=0, description="FedSGD's server learning rate (NS-FL eq. 6)")
    min_clients: int = Field(default=2, ge=1, description="rounds with fewer participants are not started "
                             "(capped at the number of participants)")
    local_epochs: int = Field(default=2, ge=1, le=1000)
    environment: Literal["development", "production"] = "development"
    seed: int = Field(default=0, ge=0, lt=2**63)
    max_weight: float = Field(default=DEFAULT_MAX_WEIGHT, gt=0, le=1e9, description="cap on a hospital's weight "
                              "(its training-patient count)")
    masked_threshold: int | None = Field(default=None, ge=1, description="t; default: masked_defaults(n)")
    masked_clip: float = Field(default=4.0, gt=0, le=1e6, description="bound on |Δ| per parameter; × max_weight "
                               "is the fixed-point range of the masked mode")
    masked_word_bits: Literal[32, 16] = Field(default=32, description="ring of the masked parameter values: 32 "
                                              "(4 bytes a parameter) or 16, the quantised mode (2 bytes a parameter; "
                                              "each summed coordinate off by at most n^2 x clip / (2 (2^15 - 1 - n)), "
                                              "clip = max_weight x masked_clip; a configuration whose sum could "
                                              "overflow is refused when the plan is built; not with distributed DP). "
                                              "SECURITY.md, masked aggregation")
    ckks_preset: str = Field(default="add_only_128", description="a CkksPreset value")
    tckks_threshold: int | None = Field(default=None, ge=2, le=32, description="ckks_threshold: any t key holders "
                                        "decrypt (t-of-N, the key shares Shamir-shared at set-up; t >= 2, as at "
                                        "t = 1 every holder would hold the key); default None: "
                                        "every holder (N-of-N). The server with t - 1 hospitals learns no update "
                                        "(SECURITY.md, threshold CKKS)")
    suspend_after_missed: int = Field(default=3, ge=0, le=1000, description="suspend a hospital after this many "
                                      "consecutive rounds without its contribution (0: never); audited")
    retry_every: int = Field(default=5, ge=1, le=1000, description="rounds between invitations of a suspended "
                             "hospital; it is back as soon as it contributes")

    @field_validator("secure_mode")
    @classmethod
    def _known_mode(cls, v: str) -> str:
        from ..aggregation import unknown_mode

        why = unknown_mode(v)
        if why is not None:
            raise ValueError(why)
        return v

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, v: str) -> str:
        from ..strategies import registered_strategies

        if v not in registered_strategies():
            raise ValueError(f"Unknown aggregator {v!r}. Registered: {', '.join(registered_strategies())}.")
        return v

    @field_validator("ckks_preset")
    @classmethod
    def _known_preset(cls, v: str) -> str:
        from ..ckks.presets import CkksPreset

        if v not in {p.value for p in CkksPreset}:
            raise ValueError(f"Unknown CKKS preset {v!r}. Known: {', '.join(p.value for p in CkksPreset)}.")
        return v

    @model_validator(mode="after")
    def _threshold_needs_its_mode(self) -> FederationSection:
        """``tckks_threshold`` only means something under ``secure_mode = "ckks_threshold"``."""
        if self.tckks_threshold is not None and self.secure_mode != "ckks_threshold":
            raise ValueError(f"[federation] tckks_threshold = {self.tckks_threshold} needs secure_mode = "
                             f"\"ckks_threshold\" (this config has {self.secure_mode!r}): set that mode, or "
                             "remove tckks_threshold.")
        return self


class DPPolicySection(_Strict):
    """[dp_policy]: bounds every hospital's DP ledger must meet (absent: DP not required)."""

    max_epsilon: float = Field(default=10.0, gt=0, le=100)
    delta: float = Field(default=1e-5, gt=0, lt=1)
    min_noise_multiplier: float = Field(default=0.3, ge=0, description="σ below this is refused: a smaller σ "
                                        "spends the budget within a few steps and usually means a mistake")
    max_clip_norm: float = Field(default=1.0, gt=0)
    # -- distributed DP (additive; docs/privacy.md "Distributed DP"): the mechanism the hospitals'
    # noise shares add up to inside the masked sum, and the trust assumption it rests on.
    mode: Literal["local", "distributed"] = Field(default="local", description="local: each hospital adds the "
                                                  "whole noise; distributed: each adds a share of one noise")
    mechanism: Literal["skellam"] = Field(default="skellam", description="distributed only: the noise shares")
    noise_multiplier: float | None = Field(default=None, gt=0, le=1000, description="distributed only: σ of the "
                                           "aggregate over the honest set, relative to the clip norm")
    sample_rate: float | None = Field(default=None, gt=0, le=1, description="distributed only: every hospital's "
                                      "Poisson rate q")
    min_honest: int | None = Field(default=None, ge=1, description="distributed only: h, the hospitals that must "
                                   "add their share honestly and survive; each adds μ/h")
    rounds: int | None = Field(default=None, ge=1, le=100_000, description="distributed only: rounds the ε "
                               "promise covers")
    insecure_unchecked_prv: bool = Field(default=False, description="accept hospitals' local-DP ledgers kept with the "
                                         "PRV accountant, whose ε the server cannot check against the RDP bound "
                                         "(warns; carried in every plan, so audited)")

    def distributed(self):  # noqa: ANN201 - clinograph.secure.dp.DistributedPolicy (imported lazily)
        """The distributed-DP policy this section declares (ConfigError naming the missing keys)."""
        from clinograph.core.errors import ConfigError

        from ..dp import DistributedPolicy

        if self.mode != "distributed":
            raise ConfigError("[dp_policy] mode is 'local'; there is no distributed-DP policy to build.")
        missing = [k for k in ("noise_multiplier", "sample_rate", "min_honest", "rounds") if getattr(self, k) is None]
        if missing:
            raise ConfigError(f"[dp_policy] mode = 'distributed' needs {', '.join(missing)}: the mechanism's "
                              "parameters are public and the same at every hospital. Set them in [dp_policy].")
        return DistributedPolicy(mechanism=self.mechanism, noise_multiplier=float(self.noise_multiplier),  # type: ignore[arg-type]
                                 clip_norm=self.max_clip_norm, sample_rate=float(self.sample_rate),  # type: ignore[arg-type]
                                 min_honest=int(self.min_honest), rounds=int(self.rounds),  # type: ignore[arg-type]
                                 max_epsilon=self.max_epsilon, delta=self.delta)

    def policy(self) -> DPPolicy:
        """The wire form carried in every plan."""
        distributed = None
        if self.mode == "distributed":
            from ..messages import DistributedDP

            d = self.distributed()
            distributed = DistributedDP(mechanism=d.mechanism, noise_multiplier=d.noise_multiplier,
                                        sample_rate=d.sample_rate, min_honest=d.min_honest, rounds=d.rounds)
        return DPPolicy(required=True, max_epsilon=self.max_epsilon, delta=self.delta,
                        min_noise_multiplier=self.min_noise_multiplier, max_clip_norm=self.max_clip_norm,
                        distributed=distributed, insecure_unchecked_prv=self.insecure_unchecked_prv)


class ServerConfig(_Strict):
    """``server.toml``: everything the server decides (hospitals decide their own training)."""

    federation: FederationSection = Field(default_factory=FederationSection)
    dp_policy: DPPolicySection | None = None
    initial_model: Path | None = Field(default=None, description="initial model file (`clinograph model init`)")
    audit_dir: Path = Path("audit")

    @classmethod
    @checked_arguments
    def from_toml(cls, path: str | Path) -> ServerConfig:
        """Load a config; relative paths are taken from the config's folder."""
        from clinograph.core.tomlio import load_toml_model

        def relative(data: dict, p: Path) -> None:
            for key in ("initial_model", "audit_dir"):
                if isinstance(data.get(key), str) and not Path(data[key]).is_absolute():
                    data[key] = str(p.parent / data[key])

        return load_toml_model(cls, path, what="server config", prepare=relative)
