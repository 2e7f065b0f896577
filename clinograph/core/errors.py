"""The one exception tree of Clinograph.

Every error a user can cause derives from :class:`ClinographError`, so embedding software can
catch one class and the CLI can turn any of them into a clear message instead of a traceback.

Messages name the input, what was found, what was expected and the fix. They never carry
cell values, patient identifiers, keys, seeds, masks or plaintext updates.
"""

from __future__ import annotations


class ClinographError(Exception):
    """Base of every error Clinograph raises on purpose."""


class ConfigError(ClinographError):
    """A configuration file or object is invalid (unknown key, bad value, insecure option in
    production). Raised when a config is loaded or a component is built from it."""


class ConfigValidationError(ConfigError, ValueError):
    """A configuration model built in code (``HospitalConfig(...)``, ``SiteSchema.model_validate(d)``,
    any :class:`~clinograph.core.configmodel.ConfigModel`) has invalid values.

    The message lists every problem with its key, as a TOML file's would. Also a ``ValueError``
    (as pydantic's ``ValidationError`` is), so ``except ValueError`` keeps working; ``errors()``
    and ``error_count()`` give pydantic's structured errors (whose ``input`` may hold the values
    given: do not log them).
    """

    def __init__(self, message: str, errors: list[dict[str, object]]):
        super().__init__(message)
        self._errors = list(errors)

    def errors(self) -> list[dict[str, object]]:
        """Pydantic's errors, one dict per problem (``loc``, ``msg``, ``type``, ``input``, ...)."""
        return list(self._errors)

    def error_count(self) -> int:
        """How many problems :meth:`errors` lists."""
        return len(self._errors)


class SchemaError(ClinographError):
    """A hospital table, site schema or feature dictionary does not fit the contract.

    ``problems`` lists every problem found (a whole table is validated before raising), each
    naming the column or row and the fix; ``str(error)`` joins them.
    """

    def __init__(self, problems: list[str] | str, *, title: str = "Input does not fit the schema"):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{title} ({len(self.problems)} problem(s)):\n{lines}")


class UnitError(SchemaError):
    """A unit string is unknown or cannot be converted to the dictionary's canonical unit."""


class SourceUnavailable(ConfigError):
    """A data source cannot be reached: the database server refuses or does not answer the
    connection (wrong host, port, database or credentials, server down). Raised before any table
    is looked at, so an unreachable database is never reported as missing tables."""


class PrivacyError(ClinographError):
    """A request would weaken the privacy guarantee (e.g. full-graph training under DP)."""


class PrivacyBudgetExceeded(PrivacyError):
    """A round would take a hospital past its (epsilon, delta) budget; raised before training."""


class ProtocolError(ClinographError):
    """A protocol message is malformed, out of round, wrong-stage, replayed or too large, or a
    protocol step cannot proceed (e.g. fewer survivors than the threshold)."""


class IntegrityError(ClinographError):
    """A signature, hash, audit chain or artefact does not verify."""


class SecurityPolicyError(ConfigError):
    """An option that weakens security was requested where policy forbids it (for example an
    ``insecure_*`` option with ``environment = "production"``)."""


class RegistryError(ConfigError):
    """A name looked up in a registry (aggregator, secure mode, concept module) is unknown.
    The message lists the registered names."""


__all__ = [
    "ClinographError",
    "ConfigError",
    "ConfigValidationError",
    "IntegrityError",
    "PrivacyBudgetExceeded",
    "PrivacyError",
    "ProtocolError",
    "RegistryError",
    "SchemaError",
    "SecurityPolicyError",
    "SourceUnavailable",
    "UnitError",
]
