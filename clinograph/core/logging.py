"""Structured logs that cannot carry patient data or secrets.

:func:`configure_logging` sets up structlog with :class:`PHIGuard` as the last processor
before rendering, so everything in an event -- arguments, bound context, context variables
-- passes through it. The guard redacts (or, with ``on_violation="raise"``, refuses):

* arrays and tensors, duck-typed as objects with ``.shape`` and ``.dtype``/``.dtypes``
  (numpy, torch, pandas DataFrames/Series/Index); numpy *scalars* become plain numbers;
* ``bytes``, ``bytearray`` and ``memoryview`` (keys, seeds, masks, ciphertexts, encoded rows);
* lists, tuples and sets holding more than :data:`MAX_NUMBERS` numbers in total;
* the value of any key named like ``patient_id``, ``mrn``, ``value(s)``, ``cell(s)``,
  ``secret``, ``key(s)``, ``seed(s)``, ``mask(s)``, ``password`` or ``token`` (matched on
  the words of the key, so ``private_key``, ``maskSeed`` and ``cell_value`` match too)
  unless the key is whitelisted;
* the keys of the EHR formats (OMOP, MIMIC, FHIR): record identifiers (``person_id``,
  ``subject_id``, ``encounter_id``, ``visit_occurrence_id``, ``hadm_id``, ``stay_id``, ... and
  FHIR's ``identifier``), personal names (``name``, ``given``, ``family``, ``first_name``,
  ``last_name``, ...) and anything about birth (``birth_date``, ``birthDate``, ``dob``,
  ``birth_datetime``, ``year_of_birth``, ...);
* inside a dict or list under a patient-like key (``patient``, ``person``, ``subject``,
  ``encounter``, ``visit``, ...), the nested ``id``/``ids``/``reference`` too: event values
  are cleaned recursively, so ``{"subject": {"id": ...}}`` and ``[{"person_id": ...}]``
  are caught at any depth.

What events may carry: column and feature names, shapes, counts, hashes, round and client
ids, scalar metrics. Does not guarantee: that a free-text string (the event message, an
exception text) holds no patient data -- callers must not format values into messages; the
canary test (tests/canary.py) checks the whole federation's output for that.
"""

from __future__ import annotations

import logging as _stdlib_logging
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any, Literal

import structlog

from .errors import PrivacyError

MAX_NUMBERS = 16
STANDARD_KEYS = frozenset({"event", "level", "timestamp", "logger", "exception", "stack"})
SENSITIVE_WORDS = frozenset({"value", "values", "cell", "cells", "secret", "secrets", "key", "keys",
                             "seed", "seeds", "mask", "masks", "password", "passwd", "token", "mrn", "ssn"})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_PATIENT_ID = re.compile(r"patient_?ids?$|patient_?ids?_")
# Record identifiers of the EHR formats: OMOP (person_id, visit_occurrence_id, visit_detail_id),
# MIMIC (subject_id, hadm_id, stay_id, icustay_id), FHIR/HL7 (encounter_id, identifier).
_RECORD_ID = re.compile(
    r"(?:^|_)(?:patient|person|subject|encounter|visit|visit_occurrence|visit_detail|admission|hadm|"
    r"icustay|stay|episode|member|medical_record|mrn|nhs|case)_?(?:id|ids|number|no|nr)(?:_|$)")
IDENTIFIER_WORDS = frozenset({"identifier", "identifiers", "dob", "birth", "birthdate", "birthdates",
                              "birthday", "birthtime", "surname", "surnames", "forename", "forenames"})
NAME_KEYS = frozenset({"name", "names", "given", "family", "first_name", "last_name", "given_name",
                       "family_name", "full_name", "middle_name", "maiden_name", "patient_name",
                       "person_name", "firstname", "lastname", "givenname", "familyname", "fullname"})
# Under these keys a nested ``id`` (or a FHIR ``reference``) identifies a patient or a stay.
PATIENT_CONTEXT_WORDS = frozenset({"patient", "patients", "person", "persons", "subject", "subjects",
                                   "encounter", "encounters", "visit", "visits", "visit_occurrence",
                                   "admission", "admissions", "stay", "stays", "member", "beneficiary"})
_NESTED_ID_KEYS = frozenset({"id", "ids", "reference", "references", "uuid"})


class PHILogError(PrivacyError):
    """A log event carried something that may be patient data or a secret (raise mode)."""


def printable(text: str) -> str:
    """``text`` as one printable line: every character ``str.isprintable`` refuses (newlines,
    ANSI escape sequences' ESC and CSI, NUL, bidi overrides such as U+202E, other control and
    format characters) written as its Python escape (``\\n``, ``\\x1b``, ``\\u202e``). For text
    another party wrote (a hospital's refusal reason) on its way to an operator's terminal or log,
    where it could otherwise clear the screen, retitle the window or forge a log line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _normalise(key: str) -> tuple[str, list[str]]:
    words = [w for w in re.split(r"[^a-z0-9]+", _CAMEL.sub("_", key).lower()) if w]
    return "_".join(words), words


def sensitive_key(key: str) -> bool:
    """True if ``key`` is named like a value, identifier, personal name, birth date or secret
    (see module doc)."""
    norm, words = _normalise(key)
    return (bool(SENSITIVE_WORDS.intersection(words)) or bool(IDENTIFIER_WORDS.intersection(words))
            or bool(_PATIENT_ID.search(norm)) or bool(_RECORD_ID.search(norm)) or norm in NAME_KEYS)


def patient_context_key(key: str) -> bool:
    """True if values under ``key`` describe a patient or a stay (a nested ``id`` there is an identifier)."""
    norm, words = _normalise(key)
    return norm in PATIENT_CONTEXT_WORDS or bool(PATIENT_CONTEXT_WORDS.intersection(words[-1:]))


def _count_numbers(items: Iterable[Any]) -> int:
    total = 0
    for item in items:
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            total += 1
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += _count_numbers(item)
    return total


class PHIGuard:
    """structlog processor: redact or refuse what may be patient data or a secret."""

    def __init__(self, *, on_violation: Literal["redact", "raise"], whitelist: Iterable[str] = ()):
        if on_violation not in ("redact", "raise"):
            raise ValueError(f"on_violation must be 'redact' or 'raise', got {on_violation!r}")
        self.on_violation = on_violation
        self.whitelist = frozenset(whitelist)

    def _violation(self, path: str, what: str) -> str:
        if self.on_violation == "raise":
            raise PHILogError(f"Log field {path!r} holds {what}, which may be patient data or a secret. "
                              "Log shapes, counts, names or hashes instead, or whitelist the key in "
                              "configure_logging(whitelist=...) if it is neither.")
        return f"<redacted: {what}>"

    def clean(self, value: Any, path: str, *, in_patient: bool = False) -> Any:
        """Return ``value`` with anything sensitive replaced (or raise, in raise mode).

        ``in_patient``: ``value`` sits under a patient-like key, so a nested ``id`` is an identifier.
        """
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self._violation(path, f"{type(value).__name__} of length {len(value)}")
        shape = getattr(value, "shape", None)
        if shape is not None and (hasattr(value, "dtype") or hasattr(value, "dtypes")):
            if shape == () and hasattr(value, "item") and not hasattr(value, "dtypes"):
                item = value.item()  # numpy / torch scalar
                if isinstance(item, (int, float, bool)):
                    return item
            try:
                shape_text = str(tuple(shape))
            except TypeError:
                shape_text = "?"
            return self._violation(path, f"{type(value).__name__} with shape {shape_text}")
        if isinstance(value, Mapping):
            return {k: self.clean_item(str(k), v, f"{path}.{k}", in_patient=in_patient) for k, v in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            n = _count_numbers(value)
            if n > MAX_NUMBERS:
                return self._violation(path, f"{type(value).__name__} of {n} numbers")
            if isinstance(value, (set, frozenset)):
                return [self.clean(v, path, in_patient=in_patient) for v in value]
            items = (self.clean(v, f"{path}[{i}]", in_patient=in_patient) for i, v in enumerate(value))
            try:
                return type(value)(items)
            except TypeError:  # a namedtuple or another sequence type that takes positional fields
                return list(items)
        return value

    def clean_item(self, key: str, value: Any, path: str, *, in_patient: bool = False) -> Any:
        """Clean one key/value pair (the key's name may make the value sensitive).

        ``in_patient``: the pair sits inside a value under a patient-like key (``patient``,
        ``subject``, ``encounter``, ...), where ``id``/``ids``/``reference`` identify a person.
        """
        if key not in self.whitelist and key not in STANDARD_KEYS:
            if sensitive_key(key) or (in_patient and _normalise(key)[0] in _NESTED_ID_KEYS):
                if value is None:
                    return None
                return self._violation(path, f"a field named {key!r}")
        return self.clean(value, path, in_patient=in_patient or patient_context_key(key))

    def __call__(self, logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        return {k: self.clean_item(k, v, k) for k, v in event_dict.items()}


class _NamedWriteLogger(structlog.WriteLogger):
    """A WriteLogger that knows the name it was created for."""

    def __init__(self, file: IO[str], name: str):
        super().__init__(file)
        self.name = name


def _add_logger_name(logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    event_dict.setdefault("logger", getattr(logger, "name", "clinograph"))
    return event_dict


_active_guard: PHIGuard | None = None
_base_factory: Any = None


def _guarded_record_factory(*args: Any, **kwargs: Any) -> _stdlib_logging.LogRecord:
    """Stdlib records from ``clinograph.*`` loggers get their %-args cleaned by the guard."""
    record = _base_factory(*args, **kwargs)
    guard = _active_guard
    if guard is not None and record.name.startswith("clinograph") and record.args:
        if isinstance(record.args, Mapping):
            record.args = {k: guard.clean_item(str(k), v, str(k)) for k, v in record.args.items()}
        else:
            record.args = tuple(guard.clean(a, f"{record.name} arg {i}") for i, a in enumerate(record.args))
    return record


def configure_logging(*, level: str = "info", json: bool = True, stream: IO[str] | None = None,
                      on_violation: Literal["redact", "raise"] = "redact",
                      whitelist: Iterable[str] = ()) -> None:
    """Configure structlog for Clinograph with the PHI guard in place.

    Args:
        level: minimum level (``debug``, ``info``, ``warning``, ``error``).
        json: one JSON object a line (default) or the human console renderer.
        stream: where to write (default ``sys.stderr``).
        on_violation: ``"redact"`` (default: replace and keep logging) or ``"raise"``
            (:class:`PHILogError`; use it in tests and development).
        whitelist: key names that are known not to hold patient data or secrets.

    Also guards the standard library's ``logging`` for loggers named ``clinograph.*``: the
    %-style arguments of their records pass the same guard before any handler formats them
    (a key-named check does not apply to positional arguments; the message text is not checked).
    """
    global _active_guard, _base_factory
    levels = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
    if level not in levels:
        raise ValueError(f"Unknown log level {level!r}; choose one of {', '.join(levels)}.")
    guard = PHIGuard(on_violation=on_violation, whitelist=whitelist)
    _active_guard = guard
    if _base_factory is None:
        _base_factory = _stdlib_logging.getLogRecordFactory()
        _stdlib_logging.setLogRecordFactory(_guarded_record_factory)
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=_processors(guard, renderer),
        wrapper_class=structlog.make_filtering_bound_logger(levels[level]),
        logger_factory=lambda *args: _NamedWriteLogger(stream or sys.stderr, str(args[0]) if args else "clinograph"),
        cache_logger_on_first_use=False,
    )


def _processors(guard: PHIGuard, renderer: Any) -> list[Any]:
    """The processor chain of :func:`configure_logging`: the guard last before rendering."""
    return [structlog.contextvars.merge_contextvars, _add_logger_name, structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True), structlog.processors.format_exc_info,
            guard, renderer]


class _GuardedLogger:
    """What :func:`get_logger` returns: each call goes to ``structlog.get_logger(name)`` once
    structlog is configured (by :func:`configure_logging` or by the host application), and until
    then to a logger built for this call alone with :func:`configure_logging`'s defaults (JSON
    lines to stderr at ``info``, the PHI guard) -- structlog's process-wide configuration is left
    to the process's owner."""

    def __init__(self, name: str, context: Mapping[str, Any] | None = None):
        self._name, self._context = name, dict(context or {})

    def _target(self) -> Any:
        if structlog.is_configured():
            logger = structlog.get_logger(self._name)
        else:
            logger = structlog.wrap_logger(
                _NamedWriteLogger(sys.stderr, self._name),
                processors=_processors(PHIGuard(on_violation="redact"), structlog.processors.JSONRenderer()),
                wrapper_class=structlog.make_filtering_bound_logger(_stdlib_logging.INFO))
        return logger.bind(**self._context) if self._context else logger

    def bind(self, **values: Any) -> _GuardedLogger:
        return _GuardedLogger(self._name, {**self._context, **values})

    def __getattr__(self, method: str) -> Any:  # debug, info, warning, error, exception, msg, ...
        return getattr(self._target(), method)


def get_logger(name: str) -> Any:
    """A structlog logger bound to ``name``. Until something configures structlog, its events go
    through the guarded defaults (no Clinograph event is logged unguarded by default) without
    configuring structlog for the whole process: a host application embedding Clinograph keeps
    its own structlog setup, made before or after."""
    return _GuardedLogger(name)


def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   line: str | None = None, *, _default: Callable[..., str] = warnings.formatwarning) -> str:
    """Clinograph's own warnings (an insecure option in use, ...) as one line, ``warning: text``, not
    Python's ``path/to/module.py:103: InsecureOptionWarning: text`` followed by the source line.
    Other libraries' warnings keep Python's format (where they come from is then the point). Set as
    ``warnings.formatwarning`` by every command's guard and by the SuperNode launcher."""
    if category.__module__.split(".")[0] == "clinograph":
        return "warning: " + " ".join(str(message).split()) + "\n"
    return _default(message, category, filename, lineno, line)
