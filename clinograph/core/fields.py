"""Field types shared by the wire messages, the audit log and the run journal."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

#: a round's number wherever it is written: below 2**31, so a signed message can never carry one that
#: overflows the 8-byte length-prefixed context encoding (a server-signed plan for round 2**64 made the
#: hospital raise OverflowError, a foreign exception)
RoundNumber = Annotated[int, Field(ge=0, lt=2**31)]
