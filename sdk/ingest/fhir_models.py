"""Strict pydantic models of the FHIR R4 fields the FHIR reader reads -- and only those.

Validating every resource in full with ``fhir.resources`` costs ~58 µs an Observation (3 µs
with these models, one core of the 2-core test machine); the reader uses a few fields of two
resource types. These models check exactly those fields with R4's
types and patterns (strict: ``"12"`` is not a number, ``"true"`` not a boolean); other fields
are ignored (``extra="ignore"``): never read, never kept. ``validate = "full"`` in ``[fhir]`` adds
the full ``fhir.resources`` validation for sites that want it.

Fields read: Patient ``id``, ``identifier[].system/value``, ``gender``, ``birthDate``; Observation
``id``, ``status``, ``code.coding[].system/code``, ``subject.reference`` / ``subject.identifier``, ``effectiveDateTime``,
``effectiveInstant``, ``effectivePeriod.start``, ``issued``, ``valueQuantity`` (``value``,
``comparator``, ``unit``, ``system``, ``code``), ``valueBoolean``, ``valueInteger``,
``dataAbsentReason``, ``component[]`` (``code``, the same values, ``dataAbsentReason``), and a
Patient in ``contained[]`` that ``subject`` references (``#p1``; the Patient fields above); with
``[fhir] index``, Encounter ``class.code``, ``subject`` and ``period.start``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: R4 ``date`` and ``dateTime`` / ``instant`` (regular expressions of the specification, simplified)
DATE = r"^\d{4}(-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?)?$"
DATETIME = (r"^\d{4}(-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01])(T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?"
            r"(Z|[+-]((0\d|1[0-3]):[0-5]\d|14:00)))?)?)?$")


class _Element(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class Coding(_Element):
    system: str | None = None
    code: str | None = Field(default=None, pattern=r"^[^\s]+( [^\s]+)*$")


class CodeableConcept(_Element):
    coding: list[Coding] | None = None
    text: str | None = None


class Quantity(_Element):
    value: int | float | None = None
    comparator: Literal["<", "<=", ">=", ">", "ad"] | None = None
    unit: str | None = None
    system: str | None = None
    code: str | None = None


class Period(_Element):
    start: str | None = Field(default=None, pattern=DATETIME)


class Identifier(_Element):
    system: str | None = None
    value: str | None = None


class Reference(_Element):
    reference: str | None = None
    identifier: Identifier | None = None  # a logical reference (``subject.identifier``: an MRN)


class _Valued(_Element):
    valueQuantity: Quantity | None = None
    valueBoolean: bool | None = None
    valueInteger: int | None = None
    dataAbsentReason: CodeableConcept | None = None


class Component(_Valued):
    code: CodeableConcept


class Observation(_Valued):
    resourceType: Literal["Observation"]
    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9\-.]{1,64}$")
    status: Literal["registered", "preliminary", "final", "amended", "corrected", "cancelled",
                    "entered-in-error", "unknown"]
    code: CodeableConcept
    subject: Reference | None = None
    effectiveDateTime: str | None = Field(default=None, pattern=DATETIME)
    effectiveInstant: str | None = Field(default=None, pattern=DATETIME)
    effectivePeriod: Period | None = None
    issued: str | None = Field(default=None, pattern=DATETIME)
    component: list[Component] | None = None
    #: contained resources, as JSON objects: only a Patient that ``subject`` references (``#p1``) is
    #: read, validated as :class:`Patient`
    contained: list[dict[str, Any]] | None = None


class Encounter(_Element):
    """Read only with ``[fhir] index``: its ``class`` code, ``subject`` and ``period.start`` (time 0)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", populate_by_name=True)

    resourceType: Literal["Encounter"]
    class_: Coding | None = Field(default=None, alias="class")
    subject: Reference | None = None
    period: Period | None = None


class Patient(_Element):
    resourceType: Literal["Patient"]
    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9\-.]{1,64}$")
    identifier: list[Identifier] | None = None
    gender: Literal["male", "female", "other", "unknown"] | None = None
    birthDate: str | None = Field(default=None, pattern=DATE)
