"""Flower's log lines an operator does not need, left out of a hospital's log and a run's stream.

Flower 1.41 logs, at INFO, five lines for every message a SuperNode receives and sends
(``start_client_internal``: a blank line, ``[RUN r, ROUND x]``, ``Receiving: ... (ID: ...)``,
``Received successfully``, and the same for sending), and a blank line whenever a ClientApp or a
ServerApp process ends cleanly (``flwr_exit`` with exit code 0 and no message). A hospital's log of
a 4-candidate run of 3 hospitals was 1 108 lines, 52 of them Clinograph's; the run's stream
(``clinograph run``) ended with an empty ``INFO :`` line. ``--log-level debug`` keeps them.
"""

from __future__ import annotations

import logging

#: the per-message lines of Flower's SuperNode loop (their format strings)
FLOWER_MESSAGE_LINES = frozenset({"", "[RUN %s, ROUND %s]", "[RUN %s]", "Receiving: %s message (ID: %s)",
                                  "Received successfully", "Sending: %s message (ID: %s)", "Sent successfully"})


def _blank(record: logging.LogRecord) -> bool:
    return isinstance(record.msg, str) and not record.msg.strip()


class NoBlankLines(logging.Filter):
    """Drops an INFO record with no text (``flwr_exit`` of a process that ended cleanly)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and _blank(record))


class NoPerMessageLines(logging.Filter):
    """Drops Flower's per-message INFO lines (:data:`FLOWER_MESSAGE_LINES`) and blank ones."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and (record.msg in FLOWER_MESSAGE_LINES or _blank(record)))


def install(kind: type[logging.Filter], logger: logging.Logger | None = None) -> None:
    """Put one filter of ``kind`` on ``logger`` (Flower's, by default); a second call adds none."""
    logger = logger or logging.getLogger("flwr")
    if not any(type(f) is kind for f in logger.filters):
        logger.addFilter(kind())


def is_terminal(stream: object) -> bool:
    """Whether ``stream`` is a terminal (colours only there: a log file gets no escape codes)."""
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class NoTracebackOfOurErrors(logging.Filter):
    """Keeps Flower's line for an exception the ServerApp raised, without the traceback when the
    exception is a :class:`~clinograph.core.errors.ClinographError`: its message, already logged on
    the ServerApp's ``run failed`` line, says what and the fix; the traceback (about 25 lines through
    Flower's and our frames) only buried it in ``clinograph run``'s stream. Any other exception keeps
    its traceback (a defect to report)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from clinograph.core.errors import ClinographError

        if record.exc_info and isinstance(record.exc_info[1], ClinographError):
            record.msg, record.args = f"{record.getMessage()}: {self.said(record.exc_info[1])}", ()
            record.exc_info, record.exc_text = None, None
        return True

    def said(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}, named on the 'run failed' line above"


class OurErrorsOnOneLine(NoTracebackOfOurErrors):
    """The same in a forked ClientApp, where nothing else logs the error: the line names it in full
    (a hospital's refusal: ``ClientApp raised an exception: ProtocolError: Hospital 'h3' refused the
    'hello' message: ConfigError: ...``), without Flower's traceback."""

    def said(self, exc: BaseException) -> str:
        from clinograph.core.logging import printable

        return printable(f"{type(exc).__name__}: {exc}")
