"""One Clinograph stage as one Flower message: a RecordDict holding a ConfigRecord of bytes.

Flower 1.41 ``ConfigRecord`` values may be ``bytes`` (``flwr.app.ConfigScalar``), so the signed
envelopes travel byte for byte: signatures and audit hashes cover exactly what was sent.
"""

from __future__ import annotations

from collections.abc import Mapping

from flwr.app import ConfigRecord, RecordDict

from clinograph.core.errors import ProtocolError

from ...messages import MAX_MESSAGE_BYTES

#: Flower message type of every Clinograph message: category ``query``, action ``clinograph``.
MESSAGE_TYPE = "query.clinograph"
RECORD = "clinograph"
STAGES = ("hello", "plan", "stage", "end", "setup")


def to_content(stage: str, parts: Mapping[str, bytes], *, round_: int) -> RecordDict:
    """Wrap ``parts`` (name -> bytes) of ``stage`` in a RecordDict."""
    if stage not in STAGES:
        raise ProtocolError(f"Unknown Clinograph stage {stage!r}; expected one of {', '.join(STAGES)}.")
    record: dict[str, str | int | bytes] = {"stage": stage, "round": int(round_)}
    for name, data in parts.items():
        if name in ("stage", "round"):
            raise ProtocolError(f"Part name {name!r} is reserved.")
        record[name] = bytes(data)
    return RecordDict({RECORD: ConfigRecord(record)})


def from_content(content: RecordDict, *, expected_stage: str | None = None,
                 max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[str, int, dict[str, bytes]]:
    """Unwrap a RecordDict made by :func:`to_content`: (stage, round, parts).

    Raises ProtocolError if the record is missing, the stage is unknown or unexpected, or the
    parts are not bytes or exceed ``max_bytes`` in total.
    """
    try:
        record = content.config_records[RECORD]
    except KeyError:
        raise ProtocolError(f"Flower message carries no {RECORD!r} ConfigRecord; is the app a Clinograph app?") from None
    stage, round_ = record.get("stage"), record.get("round")
    if not isinstance(stage, str) or stage not in STAGES:
        raise ProtocolError(f"Flower message has stage {stage!r}; expected one of {', '.join(STAGES)}.")
    if expected_stage is not None and stage != expected_stage:
        raise ProtocolError(f"Wrong stage: expected {expected_stage!r}, got {stage!r}.")
    if not isinstance(round_, int) or isinstance(round_, bool) or round_ < 0:
        raise ProtocolError("Flower message has no valid round number.")
    parts: dict[str, bytes] = {}
    total = 0
    for name, value in record.items():
        if name in ("stage", "round"):
            continue
        if not isinstance(value, bytes):
            raise ProtocolError(f"Part {name!r} of a {stage!r} message is {type(value).__name__}, expected bytes.")
        total += len(value)
        parts[name] = value
    if total > max_bytes:
        raise ProtocolError(f"{stage!r} message of {total} bytes exceeds the limit of {max_bytes} bytes.")
    return stage, round_, parts
